"""`stunnerd`: the TURN dataplane command; `python -m stunnerd` runs the same.

The command (flags, config origins, reconcile, health, metrics, drain, workers) lives in
`stunnerd.app` and `stunnerd.cli`; this module only makes it runnable as a package.
"""

from __future__ import annotations

import sys

from stunnerd.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
