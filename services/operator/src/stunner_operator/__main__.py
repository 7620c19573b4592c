"""Command-line entry point for the gateway operator."""

import sys


def main(argv: list[str] | None = None) -> int:
    print("stunner_operator: not implemented yet", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
