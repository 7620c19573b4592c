"""Command-line entry point for the config discovery service."""

import sys


def main(argv: list[str] | None = None) -> int:
    print("stunner_cds: not implemented yet", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
