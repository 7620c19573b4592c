"""The repository layout and packaging rules every service relies on."""

from __future__ import annotations

import importlib
import importlib.metadata
import re
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {
    "libs/common": "stunner_common",
    "services/stunnerd": "stunnerd",
    "services/cds": "stunner_cds",
    "services/operator": "stunner_operator",
    "services/turncat": "turncat",
    "services/auth": "stunner_auth",
}
SCRIPTS = {"stunnerd", "turncat", "stunnerctl", "stunner-cds", "stunner-operator", "stunner-auth"}


@pytest.mark.parametrize(("folder", "module"), sorted(PACKAGES.items()))
def test_each_package_is_installable_with_src_layout_and_py_typed(folder: str, module: str) -> None:
    base = ROOT / folder
    assert (base / "pyproject.toml").is_file()
    assert (base / "src" / module / "__init__.py").is_file()
    assert (base / "src" / module / "py.typed").is_file()
    imported = importlib.import_module(module)
    assert Path(imported.__file__ or "").is_relative_to(base / "src")


def test_console_scripts_are_declared() -> None:
    declared: set[str] = set()
    for folder in PACKAGES:
        project = tomllib.loads((ROOT / folder / "pyproject.toml").read_text())["project"]
        declared |= set(project.get("scripts", {}))
    assert declared == SCRIPTS
    installed = {ep.name for ep in importlib.metadata.entry_points(group="console_scripts")}
    assert installed >= SCRIPTS


def test_top_level_layout_exists() -> None:
    for name in (
        "services/operator",
        "services/cds",
        "services/stunnerd",
        "services/turncat",
        "libs/common",
        "charts",
        "tests",
        "bench",
        "examples",
        "docker-compose.yml",
        "Makefile",
        "README.md",
        ".ci/run",
    ):
        assert (ROOT / name).exists(), name


def test_import_contracts_forbid_services_importing_each_other() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    independence = [c for c in config["contracts"] if c["type"] == "independence"]
    assert independence
    assert set(independence[0]["modules"]) == {
        "stunnerd",
        "stunner_cds",
        "stunner_operator",
        "turncat",
        "stunner_auth",
    }


# What a reader of this repository cannot follow: sections of documents that are not in it, the
# tracker's issue numbers, and folders of one machine. Docstrings and docs cite RFCs, public
# URLs and this repository's own files instead.
UNFOLLOWABLE = re.compile(
    r"reference §|SPEC(\.md)? §|\b[Ii]ssue \d+\b|\.\./shared/reference|/work/main|/home/\w+/"
)


def test_no_file_cites_what_a_reader_cannot_follow() -> None:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    offenders = []
    for name in filter(None, listed.split("\0")):
        path = ROOT / name
        if path.suffix not in {".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".c", ".h", ".sh"}:
            continue
        if name == "tests/unit/test_layout.py" or not path.is_file():
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if UNFOLLOWABLE.search(line):
                offenders.append(f"{name}:{number}: {line.strip()}")
    assert offenders == [], "\n".join(offenders)
