"""The turncat error tree and the exit code each branch maps to.

A user scripting turncat needs to tell "I typed the URI wrong" from "the server said no" from
"nothing answered", so every failure that ends the program is one of these classes, and the CLI
turns it into one line on stderr and a distinct exit code.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_BAD_INPUT = 2
EXIT_AUTH_FAILED = 3
EXIT_PEER_FORBIDDEN = 4
EXIT_UNREACHABLE = 5
EXIT_UNSUPPORTED = 6
EXIT_PEER_CONNECT_FAILED = 7


class TurncatError(Exception):
    """Base of every error turncat reports; `exit_code` is what the process exits with."""

    exit_code = EXIT_FAILURE


class BadInputError(TurncatError):
    """A malformed or unsupported address, URI or flag (the user called us wrong)."""

    exit_code = EXIT_BAD_INPUT


class LookupFailedError(BadInputError):
    """A `k8s://` URI names a gateway or listener the CDS does not know, or cannot be used."""


class TurnError(TurncatError):
    """The TURN server answered a request with an error we cannot recover from."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class AuthFailedError(TurnError):
    """The server rejected our credentials (401 after a credentialed request)."""

    exit_code = EXIT_AUTH_FAILED


class PeerForbiddenError(TurnError):
    """The server refused a permission or channel to the peer (403 Forbidden)."""

    exit_code = EXIT_PEER_FORBIDDEN


class UnreachableError(TurncatError):
    """The TURN server (or the CDS) could not be reached or stopped answering."""

    exit_code = EXIT_UNREACHABLE


class UnsupportedError(TurnError):
    """The server does not offer what we asked for: a TCP relay (442 Unsupported Transport
    Protocol, RFC 8656 §7.2 and RFC 6062 §5.1) or an IPv6 relay (440 Address Family not
    Supported, RFC 8656 §7.2)."""

    exit_code = EXIT_UNSUPPORTED


class PeerConnectFailedError(TurnError):
    """The server could not open the TCP connection to the peer (447 Connection Timeout or
    Failure, RFC 6062 §5.2), or already has one to it on this allocation (446 Connection
    Already Exists)."""

    exit_code = EXIT_PEER_CONNECT_FAILED


def exit_status(prog: str, body: Callable[[], int], *, interrupted: int) -> int:
    """Run a command's `body` and turn how it ends into the exit status: a `TurncatError` as one
    line on stderr and its code, Ctrl-C as `interrupted`, anything else as one line and 1."""
    try:
        return body()
    except TurncatError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return interrupted
    except Exception as exc:
        log.debug("unexpected failure", exc_info=True)
        print(f"{prog}: unexpected error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAILURE
