"""The real `stunner-cds` process on a free loopback port, for tests that need a CDS to talk to."""

from __future__ import annotations

import sys
from pathlib import Path

from support.ports import free_port
from support.processes import ServerProcess, wait_for_tcp


class CdsServer:
    """The real `stunner-cds` process on a free port, reading the given Redis."""

    def __init__(self, redis_url: str, workdir: Path) -> None:
        self.port = free_port()
        self.redis_url = redis_url
        self.workdir = workdir
        self.proc: ServerProcess | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.starts += 1
        argv = [sys.executable, "-m", "stunner_cds", "--host", "127.0.0.1"]
        argv += ["--port", str(self.port), "--redis-url", self.redis_url]
        self.proc = ServerProcess(argv, log_path=self.workdir / f"cds-{self.starts}.log")
        wait_for_tcp("127.0.0.1", self.port, proc=self.proc)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None
