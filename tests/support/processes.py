"""Start external programs for tests and always stop them, by PID, when the test ends."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path


class ServerProcess:
    """A child process the test owns; `stop()` kills only this PID (and its process group)."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
        log_path: Path | None = None,
    ) -> None:
        self.argv = list(argv)
        self.log_path = log_path
        self._log = open(log_path, "wb") if log_path else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(
            self.argv,
            cwd=cwd,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def output(self) -> str:
        if self.log_path and self.log_path.exists():
            return self.log_path.read_text(errors="replace")
        return ""

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 5.0) -> int | None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout_s)
        if not isinstance(self._log, int):
            self._log.close()
        return self.proc.returncode


def wait_for_tcp(
    host: str, port: int, timeout_s: float = 10.0, proc: ServerProcess | None = None
) -> None:
    """Block until something accepts TCP connections on host:port (or fail clearly)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and not proc.alive():
            raise RuntimeError(f"{proc.argv[0]} exited early:\n{proc.output()[-2000:]}")
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
            sock.settimeout(0.2)
            if sock.connect_ex((host, port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listening on {host}:{port} after {timeout_s}s")


def which(name: str, *extra_dirs: str) -> str | None:
    """Find a binary on PATH or in the given extra directories (e.g. /usr/sbin)."""
    found = shutil.which(name)
    if found:
        return found
    for d in (*extra_dirs, "/usr/sbin", "/usr/bin", "/usr/local/bin"):
        candidate = Path(d) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


@contextlib.contextmanager
def running(argv: Sequence[str], **kwargs: object) -> Iterator[ServerProcess]:
    proc = ServerProcess(argv, **kwargs)  # type: ignore[arg-type]
    try:
        yield proc
    finally:
        proc.stop()


def command(script: str, module: str) -> list[str]:
    """The argv that runs one of our console scripts: the venv's script, else ``python -m``."""
    path = Path(sys.executable).parent / script
    return [str(path)] if path.exists() else [sys.executable, "-m", module]
