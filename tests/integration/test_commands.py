"""What every command shares: ``--version`` prints the installed package version and exits 0."""

from __future__ import annotations

import importlib
import subprocess
from importlib.metadata import version

import pytest

from support.processes import command

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    ("script", "module", "distribution"),
    [
        ("stunner-cds", "stunner_cds", "stunner-cds"),
        ("stunnerd", "stunnerd", "stunnerd"),
        ("turncat", "turncat", "turncat"),
    ],
)
def test_version_prints_the_package_version_and_exits_0(
    script: str, module: str, distribution: str
) -> None:
    done = subprocess.run(
        [*command(script, module), "--version"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    prog, _, printed = done.stdout.strip().rpartition(" ")
    assert prog
    assert printed == version(distribution)
    assert printed == importlib.import_module(module).__version__
