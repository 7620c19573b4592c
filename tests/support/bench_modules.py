"""Importing a module of bench/ from a test: bench/ sits at the repository's root and is not a
package of the project, so it is on the import path only for the import."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def bench_module(name: str) -> ModuleType:
    """`bench.<name>`, imported (once: later calls get the same module)."""
    sys.path.insert(0, str(ROOT))
    try:
        return importlib.import_module(f"bench.{name}")
    finally:
        sys.path.remove(str(ROOT))
