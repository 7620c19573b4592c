"""The CDS bearer token a client sends: from ``CDS_TOKEN`` or from a file, re-read on change.

A token mounted from a Kubernetes Secret changes on disk when the Secret is rotated; reading the
file again whenever its size or modification time changed lets a running client pick up the new
token at its next request or reconnect, without a restart. The token itself is never logged or
shown in an error: messages name the file and say what is wrong with it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger(__name__)

TOKEN_ENV = "CDS_TOKEN"
TOKEN_FILE_ENV = "CDS_TOKEN_FILE"
MAX_TOKEN_FILE_BYTES = 64 * 1024


class TokenSource:
    """``current()`` is the token to send now: the file's content when a file is given (re-read
    when it changed), else the fixed token; None means send no Authorization header."""

    def __init__(self, token: str | None = None, file: str | os.PathLike[str] | None = None):
        self._token = token.strip() if token and token.strip() else None
        self.file = Path(file) if file else None
        self._stamp: tuple[int, int] | None = None
        self._from_file: str | None = None
        self._problem: str | None = None

    def __repr__(self) -> str:  # never the token
        where = f"file={str(self.file)!r}" if self.file else f"set={self._token is not None}"
        return f"TokenSource({where})"

    def current(self) -> str | None:
        if self.file is None:
            return self._token
        try:
            st = self.file.stat()
            stamp = (st.st_mtime_ns, st.st_size)
            if stamp != self._stamp:
                if st.st_size > MAX_TOKEN_FILE_BYTES:
                    raise OSError(f"larger than {MAX_TOKEN_FILE_BYTES} bytes")
                text = self.file.read_text(encoding="utf-8", errors="strict").strip()
                self._stamp = stamp
                self._from_file = text or None
                self._report(None if text else "it is empty")
                if text:
                    log.info("CDS bearer token read from %s", self.file)
        except (OSError, UnicodeDecodeError) as exc:
            detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            self._report(f"cannot read it: {detail}")
            self._stamp = None
            self._from_file = None
        return self._from_file

    def _report(self, problem: str | None) -> None:
        if problem != self._problem and problem is not None:
            log.warning("CDS token file %s: %s; sending no token", self.file, problem)
        self._problem = problem


def token_source(
    env: Mapping[str, str], file: str | os.PathLike[str] | None = None
) -> TokenSource | None:
    """The token source the flags and environment ask for: ``file`` (``--cds-token-file``), else
    ``CDS_TOKEN_FILE``, else ``CDS_TOKEN``; None when none is set."""
    path = file or env.get(TOKEN_FILE_ENV) or None
    if path:
        return TokenSource(file=path)
    token = env.get(TOKEN_ENV, "").strip()
    return TokenSource(token) if token else None
