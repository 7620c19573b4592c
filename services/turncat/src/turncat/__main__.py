"""`python -m turncat` and the `turncat` console script."""

import sys

from turncat.cli import main

if __name__ == "__main__":
    sys.exit(main())
