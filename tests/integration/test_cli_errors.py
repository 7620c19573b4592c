"""Command-line papercuts, run as users run them: bad settings give one line and exit 2 (no
pydantic dump, no traceback, no password), and turncat treats any stdin that ends as the end."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import pytest

from support.ports import free_port, free_udp_tcp_port
from support.processes import ServerProcess

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent


def run(
    argv: list[str], env: dict[str, str], stdin: IO[bytes] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        env={"PATH": "", **env},
        stdin=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        (
            ["stunner-cds", "--port", "0"],
            {"REDIS_URL": "bogus://u:hunter2@x"},
            "stunner-cds: invalid settings: redis_url: ",
        ),
        (
            ["stunner-cds", "--port", "0", "--redis-url", "redis://u:hunter2@h:notaport/0"],
            {},
            "stunner-cds: invalid settings: redis_url: ",
        ),
        (["stunner-cds"], {"CDS_PORT": "notaport"}, "stunner-cds: invalid settings: port: "),
        (
            ["stunner-operator", "--manifests", "."],
            {"OPERATOR_REDIS_TIMEOUT_S": "-1"},
            "stunner-operator: invalid settings: ",
        ),
        (["stunner-auth"], {"AUTH_PORT": "99999"}, "stunner-auth: invalid settings: port: "),
    ],
)
def test_bad_settings_give_one_line_without_secrets_or_tracebacks(
    argv: list[str], env: dict[str, str], expected: str
) -> None:
    result = run([str(BIN / argv[0]), *argv[1:]], env)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(expected), lines[0]
    assert "hunter2" not in result.stderr
    assert "errors.pydantic.dev" not in result.stderr


def test_turncat_reads_dev_null_as_an_empty_stdin_and_exits_cleanly(tmp_path: Path) -> None:
    port, health = free_udp_tcp_port(), free_port()
    uri = f"turn://u:p@127.0.0.1:{port}?transport=udp"
    stunnerd = ServerProcess(
        [str(BIN / "stunnerd"), "--bind", "127.0.0.1", uri],
        env={"STUNNERD_HEALTH_PORT": str(health), "PATH": ""},
        log_path=tmp_path / "stunnerd.log",
    )
    try:
        deadline = time.monotonic() + 20
        while "ready on port" not in stunnerd.output():
            assert stunnerd.alive(), stunnerd.output()
            assert time.monotonic() < deadline, stunnerd.output()
            time.sleep(0.05)
        with open("/dev/null", "rb") as devnull:
            result = run(
                [str(BIN / "turncat"), "-", uri, f"udp://127.0.0.1:{free_port()}"],
                {},
                stdin=devnull,
            )
        assert result.returncode == 0, result.stderr
    finally:
        stunnerd.stop()
