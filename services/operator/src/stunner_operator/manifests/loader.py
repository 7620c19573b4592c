"""Reading a folder of Kubernetes YAML into objects, keeping each file's last good version.

Local mode treats every ``*.yaml``/``*.yml``/``*.json`` file under the folder as ``kubectl apply``
would: multi-document files, any order, Secrets with ``data`` or ``stringData``. A file that fails
to parse, or holds an invalid object, is reported with its path and document index and keeps
contributing the objects of its last good version, so a typo never tears down published configs.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import yaml

from stunner_common.crds import CrdError, K8sObject, UnsupportedKindError, parse_object
from stunner_operator.render.store import ObjKey, key_of

SUFFIXES = (".yaml", ".yml", ".json")


@dataclass(frozen=True, slots=True)
class ManifestError:
    """A problem in one file; ``index`` is the 0-based YAML document, None for the whole file."""

    path: str
    index: int | None
    message: str

    def __str__(self) -> str:
        where = self.path if self.index is None else f"{self.path} document {self.index}"
        return f"{where}: {self.message}"


@dataclass(frozen=True, slots=True)
class FileResult:
    objects: tuple[K8sObject, ...]
    errors: tuple[ManifestError, ...]
    skipped: tuple[str, ...] = ()


def parse_manifests(text: str, path: str = "<text>") -> FileResult:
    """Every supported object of a (multi-document) YAML or JSON text, plus what went wrong."""
    objects: list[K8sObject] = []
    errors: list[ManifestError] = []
    skipped: list[str] = []
    try:
        docs = list(yaml.safe_load_all(text))
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        problem = getattr(err, "problem", None) or str(err)
        if mark is None:
            return FileResult((), (ManifestError(path, None, f"invalid YAML: {problem}"),))
        index = _document_index(text, mark.line)
        where = f"at line {mark.line + 1}, column {mark.column + 1}"
        return FileResult((), (ManifestError(path, index, f"invalid YAML {where}: {problem}"),))
    for index, doc in enumerate(docs):
        if doc is None:
            continue
        if (
            isinstance(doc, dict)
            and doc.get("kind") == "List"
            and isinstance(doc.get("items"), list)
        ):
            items = doc["items"]
        else:
            items = [doc]
        for item in items:
            try:
                objects.append(parse_object(item))
            except UnsupportedKindError as err:
                skipped.append(f"{path} document {index}: {err}")
            except CrdError as err:
                errors.append(ManifestError(path, index, str(err)))
    return FileResult(tuple(objects), tuple(errors), tuple(skipped))


def _document_index(text: str, line: int) -> int:
    """The 0-based YAML document that holds ``line`` (documents are split by ``---``)."""
    index = 0
    seen_content = False
    for number, raw in enumerate(text.splitlines()):
        if number >= line:
            break
        if raw.startswith("---"):
            if seen_content:
                index += 1
            seen_content = False
        elif raw.strip() and not raw.lstrip().startswith("#"):
            seen_content = True
    return index


def manifest_files(root: Path) -> list[Path]:
    """The manifest files under ``root``, sorted; hidden files and folders are skipped."""
    if root.is_file():
        return [root]
    out = []
    for path in root.rglob("*"):
        rel = path.relative_to(root)
        if any(part.startswith(".") for part in rel.parts):
            continue
        if path.suffix in SUFFIXES and path.is_file():
            out.append(path)
    return sorted(out)


@dataclass(frozen=True, slots=True)
class ReloadResult:
    objects: dict[ObjKey, K8sObject]
    new_errors: tuple[ManifestError, ...]
    changed_files: tuple[str, ...]
    skipped: tuple[str, ...]


class ManifestSet:
    """The objects of a folder, file by file; a broken file keeps its last good objects."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._digest: dict[Path, str] = {}
        self._good: dict[Path, tuple[K8sObject, ...]] = {}
        self._errors: dict[Path, tuple[ManifestError, ...]] = {}

    @property
    def errors(self) -> list[ManifestError]:
        return [e for path in sorted(self._errors) for e in self._errors[path]]

    def reload(self) -> ReloadResult:
        """Re-read the folder (files whose content changed); return the merged objects."""
        present = manifest_files(self.root)
        new_errors: list[ManifestError] = []
        changed: list[str] = []
        skipped: list[str] = []
        for gone in set(self._digest) - set(present):
            self._digest.pop(gone, None)
            self._good.pop(gone, None)
            self._errors.pop(gone, None)
            changed.append(str(gone))
        for path in present:
            try:
                raw = path.read_bytes()
            except OSError as err:
                new_errors.append(ManifestError(str(path), None, f"cannot read: {err}"))
                continue
            digest = hashlib.sha256(raw).hexdigest()
            if self._digest.get(path) == digest:
                continue
            self._digest[path] = digest
            changed.append(str(path))
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                result = FileResult((), (ManifestError(str(path), None, "not UTF-8 text"),))
            else:
                result = parse_manifests(text, str(path))
            skipped.extend(result.skipped)
            if result.errors:
                self._errors[path] = result.errors
                new_errors.extend(result.errors)
            else:
                self._errors.pop(path, None)
                self._good[path] = result.objects
        objects: dict[ObjKey, K8sObject] = {}
        origin: dict[ObjKey, Path] = {}
        for path in sorted(self._good):
            for obj in self._good[path]:
                key = key_of(obj)
                if key in objects and origin[key] != path:
                    new_errors.append(
                        ManifestError(
                            str(path),
                            None,
                            f"{key[0]} {key[1]}/{key[2]} is also defined in {origin[key]}; "
                            "this copy wins",
                        )
                    )
                objects[key] = obj
                origin[key] = path
        return ReloadResult(objects, tuple(new_errors), tuple(sorted(changed)), tuple(skipped))
