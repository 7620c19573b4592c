"""What a fresh interpreter has imported after running some code.

The test process itself has imported nearly everything, so a test that pins a module *out* of a
process (stunnerd's idle memory: docs/scale.md, "Footprint") runs its code in a new interpreter.
"""

from __future__ import annotations

import json
import subprocess
import sys


def modules_after(code: str, timeout_s: float = 60.0) -> set[str]:
    """The names in `sys.modules` of a new interpreter once `code` has run in it."""
    probe = f"{code}\nimport json as _json, sys as _sys\nprint(_json.dumps(sorted(_sys.modules)))\n"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=timeout_s
    )
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.splitlines()[-1]))


def roots(modules: set[str]) -> set[str]:
    """The top-level packages of `modules`."""
    return {name.split(".")[0] for name in modules}
