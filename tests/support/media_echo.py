"""scripts/media_echo.py (the WebRTC echo server `make run` starts) as a process for tests."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path

from support.ports import free_port
from support.processes import ServerProcess, wait_for_tcp

ROOT = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 30.0


@contextlib.asynccontextmanager
async def media_echo(log: Path, ice_url: str, *args: str) -> AsyncIterator[str]:
    """Start it on a free port (logging to `log`); yield its base URL; stop it by PID."""
    port = free_port()
    argv = [sys.executable, str(ROOT / "scripts" / "media_echo.py"), "--port", str(port)]
    proc = ServerProcess([*argv, "--ice-url", ice_url, *args], cwd=ROOT, log_path=log)
    try:
        await asyncio.to_thread(wait_for_tcp, "127.0.0.1", port, STARTUP_TIMEOUT_S, proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.stop()
