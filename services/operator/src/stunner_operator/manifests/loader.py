"""Reading a folder of Kubernetes YAML into objects, keeping each document's last good version.

Local mode treats every ``*.yaml``/``*.yml``/``*.json`` file under the folder as ``kubectl apply``
would: multi-document files, any order, Secrets with ``data`` or ``stringData``. Each object
stands alone: an invalid one (a schema error such as ``port: 70000``) is reported with its path,
document index and name, and that object keeps its last good version, wherever it was read from,
while every other object loads as usual. A document that does not even parse as YAML cannot be
told apart into objects: it keeps the objects of its last good version. So a typo never tears
down published configs.

Input is bounded before it is trusted: a file larger than ``max_file_bytes`` is not read, a
document nested deeper than ``MAX_DEPTH`` or expanding (through YAML aliases) to more than
``MAX_NODES`` nodes is refused before it is built, and text that is not UTF-8 is refused. Each
such file or document keeps its last good version, like any other bad input.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from yaml import events

from stunner_common.crds import (
    CLUSTER_SCOPED_KINDS,
    GATEWAY_GROUP,
    CrdError,
    K8sObject,
    UnsupportedKindError,
    parse_object,
)
from stunner_operator.render.store import ObjKey, key_of

SUFFIXES = (".yaml", ".yml", ".json")
MAX_FILE_BYTES = 4 * 1024 * 1024
"""Larger files are refused unread (etcd caps one object at 1.5 MB; a file holds a few)."""
MAX_DEPTH = 100
"""Deepest nesting of mappings and sequences in one document (Kubernetes objects use < 20)."""
MAX_NODES = 200_000
"""Most nodes one document may hold once its aliases are expanded (the "billion laughs" bound)."""

_Loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_DOC_START = re.compile(r"^---(?:[ \t]|$)")
_DOC_END = re.compile(r"^\.\.\.(?:[ \t]|$)")


@dataclass(frozen=True, slots=True)
class ManifestError:
    """A problem in one file; ``index`` is the 0-based YAML document, None for the whole file."""

    path: str
    index: int | None
    message: str
    key: ObjKey | None = None
    """The object the error is about, when the document says which."""

    def __str__(self) -> str:
        where = self.path if self.index is None else f"{self.path} document {self.index}"
        return f"{where}: {self.message}"

    @property
    def keeps(self) -> str:
        """What stays in force instead, for the error's log line."""
        if self.key is not None:
            return f"keeping the last good version of {object_label(self.key)}"
        if self.index is not None:
            return "keeping the last good version of this document"
        return "keeping the last good version of this file"


def object_label(key: ObjKey) -> str:
    """``Gateway stunner/udp-gateway``, ``GatewayClass stunner-gatewayclass``."""
    kind = "UDPRoute (gateway.networking.k8s.io/v1alpha2)" if key[0] == "UDPRouteV1A2" else key[0]
    return f"{kind} {key[1]}/{key[2]}" if key[1] else f"{kind} {key[2]}"


def identify(doc: object, default_namespace: str = "default") -> ObjKey | None:
    """The store key an invalid document would have had: from its kind, apiVersion and
    metadata alone, so that its last good version can stand in for it."""
    if not isinstance(doc, dict):
        return None
    kind, api_version, meta = doc.get("kind"), doc.get("apiVersion"), doc.get("metadata")
    if not isinstance(kind, str) or not isinstance(api_version, str) or not isinstance(meta, dict):
        return None
    name, namespace = meta.get("name"), meta.get("namespace") or default_namespace
    if not isinstance(name, str) or not name or not isinstance(namespace, str):
        return None
    group = api_version.rpartition("/")[0]
    if kind == "UDPRoute" and group == GATEWAY_GROUP:
        kind = "UDPRouteV1A2"
    return (kind, "" if kind in CLUSTER_SCOPED_KINDS else namespace, name)


@dataclass(frozen=True, slots=True)
class FileResult:
    objects: tuple[K8sObject, ...]
    errors: tuple[ManifestError, ...]
    skipped: tuple[str, ...] = ()
    documents: dict[int, tuple[K8sObject, ...]] = field(default_factory=dict)
    """The objects of every document that parsed, by document index."""
    invalid: dict[int, tuple[ObjKey, ...]] = field(default_factory=dict)
    """Per document with an invalid object: the keys of its invalid objects (when known)."""


class _Refused(Exception):
    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.line = line


def split_documents(text: str) -> list[tuple[int, str]]:
    """(first line, text) of each YAML document, split at ``---`` and ``...`` lines.

    As in YAML, a ``---`` that opens the text does not make an empty document before it. A
    ``---`` line inside a block scalar would have to be indented, so it never splits one.
    """
    docs: list[tuple[int, list[str]]] = [(0, [])]
    opened = False
    for number, line in enumerate(text.splitlines(keepends=True)):
        if _DOC_START.match(line):
            first_lines = docs[-1][1]
            if len(docs) == 1 and not opened and not _has_content(first_lines):
                docs[-1] = (number, [line])
            else:
                docs.append((number, [line]))
            opened = True
        elif _DOC_END.match(line):
            docs.append((number + 1, []))
            opened = False
        else:
            docs[-1][1].append(line)
    out = [(start, "".join(lines)) for start, lines in docs]
    if out and not _has_content(out[-1][1].splitlines()) and not _DOC_START.match(out[-1][1]):
        out.pop()  # trailing comments or a final "...": not a document
    return out


def _has_content(lines: list[str]) -> bool:
    return any(ln.strip() and not ln.lstrip().startswith(("#", "%")) for ln in lines)


def check_shape(text: str) -> None:
    """Refuse a document nested too deep or too large once expanded, without building it."""
    anchors: dict[str, int] = {}
    stack: list[list[int | str | None]] = []  # [expanded size, anchor]
    total = 0
    try:
        _walk(text, anchors, stack, total)
    except yaml.MarkedYAMLError as exc:
        # PyYAML 6.0.4 and later stop a deep document themselves, while scanning ahead.
        if "maximum nesting depth" not in str(exc.problem):
            raise
        mark = exc.problem_mark
        raise _Refused(
            f"nested deeper than {MAX_DEPTH} levels", mark.line if mark is not None else None
        ) from None


def _walk(
    text: str, anchors: dict[str, int], stack: list[list[int | str | None]], total: int
) -> None:
    for event in yaml.parse(text, Loader=_Loader):
        line = event.start_mark.line if event.start_mark is not None else None
        size = 0
        if isinstance(event, events.CollectionStartEvent):
            stack.append([1, event.anchor])
            if len(stack) > MAX_DEPTH:
                raise _Refused(f"nested deeper than {MAX_DEPTH} levels", line)
            continue
        if isinstance(event, events.CollectionEndEvent):
            done, anchor = stack.pop()
            assert isinstance(done, int)
            size = done
            if isinstance(anchor, str):
                anchors[anchor] = size
        elif isinstance(event, events.ScalarEvent):
            size = 1
            if event.anchor:
                anchors[event.anchor] = 1
        elif isinstance(event, events.AliasEvent):
            size = anchors.get(event.anchor or "", 1)
        else:
            continue
        if stack:
            parent = stack[-1][0]
            assert isinstance(parent, int)
            stack[-1][0] = grown = parent + size
        else:
            total = grown = total + size
        if grown > MAX_NODES:
            raise _Refused(
                f"expands to more than {MAX_NODES} nodes (YAML aliases nested too far?)", line
            )


def parse_manifests(text: str, path: str = "<text>") -> FileResult:
    """Every supported object of a (multi-document) YAML or JSON text, plus what went wrong."""
    errors: list[ManifestError] = []
    skipped: list[str] = []
    documents: dict[int, tuple[K8sObject, ...]] = {}
    invalid: dict[int, tuple[ObjKey, ...]] = {}
    for index, (first_line, chunk) in enumerate(split_documents(text)):
        try:
            check_shape(chunk)
            doc = yaml.load(chunk, Loader=_Loader)
        except _Refused as err:
            where = "" if err.line is None else f" at line {first_line + err.line + 1}"
            errors.append(ManifestError(path, index, f"refused{where}: {err.message}"))
            continue
        except yaml.YAMLError as err:
            errors.append(ManifestError(path, index, _yaml_problem(err, first_line)))
            continue
        if doc is None:
            documents[index] = ()
            continue
        if (
            isinstance(doc, dict)
            and doc.get("kind") == "List"
            and isinstance(doc.get("items"), list)
        ):
            items = doc["items"]
        else:
            items = [doc]
        objects: list[K8sObject] = []
        bad: list[ObjKey | None] = []
        for item in items:
            try:
                objects.append(parse_object(item))
            except UnsupportedKindError as err:
                skipped.append(f"{path} document {index}: {err}")
            except CrdError as err:
                key = identify(item)
                errors.append(ManifestError(path, index, str(err), key))
                bad.append(key)
        if not bad:
            documents[index] = tuple(objects)
        elif all(key is not None for key in bad):
            # The document's valid objects load; each invalid one is known by name and keeps
            # its last good version (added by the caller, who knows it).
            documents[index] = tuple(objects)
            invalid[index] = tuple(k for k in bad if k is not None)
    objects_all = tuple(o for i in sorted(documents) for o in documents[i])
    return FileResult(objects_all, tuple(errors), tuple(skipped), documents, invalid)


def _yaml_problem(err: yaml.YAMLError, first_line: int) -> str:
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or str(err)
    if mark is None:
        return f"invalid YAML: {problem}"
    return f"invalid YAML at line {first_line + mark.line + 1}, column {mark.column + 1}: {problem}"


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
    """The objects of a folder, document by document; a bad document keeps its last good objects."""

    def __init__(self, root: Path, *, max_file_bytes: int = MAX_FILE_BYTES) -> None:
        self.root = root
        self.max_file_bytes = max_file_bytes
        self._digest: dict[Path, str] = {}
        self._good: dict[Path, dict[int, tuple[K8sObject, ...]]] = {}
        self._errors: dict[Path, tuple[ManifestError, ...]] = {}
        self.origin: dict[ObjKey, tuple[str, int]] = {}
        """Where each loaded object comes from: (file, document index)."""
        self._last: dict[ObjKey, K8sObject] = {}
        """The objects of the last reload: what an object that turned invalid keeps."""

    @property
    def errors(self) -> list[ManifestError]:
        return [e for path in sorted(self._errors) for e in self._errors[path]]

    def _read(self, path: Path) -> bytes | ManifestError:
        """The file's bytes, or why they are refused; never more than the limit is read."""
        try:
            size = path.stat().st_size
            if size <= self.max_file_bytes:
                with path.open("rb") as fh:
                    raw = fh.read(self.max_file_bytes + 1)
                size = len(raw)
        except OSError as err:
            return ManifestError(str(path), None, f"cannot read: {err.strerror or err}")
        if size > self.max_file_bytes:
            return ManifestError(
                str(path),
                None,
                f"file too large ({size} bytes; the limit is {self.max_file_bytes})",
            )
        return raw

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
            if self._reload_file(path, new_errors, skipped):
                changed.append(str(path))
        objects = self._merged(new_errors)
        return ReloadResult(objects, tuple(new_errors), tuple(sorted(changed)), tuple(skipped))

    def _reload_file(self, path: Path, new_errors: list[ManifestError], skipped: list[str]) -> bool:
        """Read one file again if its content changed (True then): its documents replace the
        file's good ones, except a document that fails, which keeps its last good version."""
        raw = self._read(path)
        if isinstance(raw, ManifestError):
            # The whole file keeps its last good version; report it once per change.
            if self._errors.get(path) != (raw,):
                self._errors[path] = (raw,)
                self._digest.pop(path, None)
                new_errors.append(raw)
            return False
        digest = hashlib.sha256(raw).hexdigest()
        if self._digest.get(path) == digest:
            return False
        self._digest[path] = digest
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            bad = ManifestError(
                str(path),
                None,
                f"not UTF-8 text (byte 0x{raw[err.start]:02x} at offset {err.start})",
            )
            self._errors[path] = (bad,)
            new_errors.append(bad)
            return True
        result = parse_manifests(text, str(path))
        skipped.extend(result.skipped)
        old = self._good.get(path, {})
        good = dict(result.documents)
        for problem in result.errors:
            index = problem.index
            if index is not None and index not in good and index in old:
                good[index] = old[index]
        for index, keys in result.invalid.items():
            kept = tuple(self._last[k] for k in keys if k in self._last)
            good[index] = good.get(index, ()) + kept
        self._good[path] = good
        if result.errors:
            self._errors[path] = result.errors
            new_errors.extend(result.errors)
        else:
            self._errors.pop(path, None)
        return True

    def _merged(self, new_errors: list[ManifestError]) -> dict[ObjKey, K8sObject]:
        """Every file's good objects; an object defined in two files is an error (the later
        file, in name order, wins)."""
        objects: dict[ObjKey, K8sObject] = {}
        origin: dict[ObjKey, Path] = {}
        self.origin = {}
        for path in sorted(self._good):
            docs = self._good[path]
            for index, obj in ((i, o) for i in sorted(docs) for o in docs[i]):
                key = key_of(obj)
                self.origin[key] = (str(path), index)
                if key in objects and origin[key] != path:
                    new_errors.append(
                        ManifestError(
                            str(path),
                            None,
                            f"{key[0]} {'/'.join(k for k in key[1:] if k)} is also defined "
                            f"in {origin[key]}; this copy wins",
                        )
                    )
                objects[key] = obj
                origin[key] = path
        self._last = objects
        return objects
