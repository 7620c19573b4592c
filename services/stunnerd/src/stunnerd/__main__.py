"""Command-line entry point for the TURN dataplane."""

import sys


def main(argv: list[str] | None = None) -> int:
    print("stunnerd: not implemented yet", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
