"""The ``stunner-cds`` command: JSON logs in the one schema, bad log settings refused."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from support.ports import free_port
from support.processes import command, running

pytestmark = pytest.mark.integration


def test_json_logs_use_the_shared_schema(tmp_path: Path) -> None:
    log_path = tmp_path / "cds.log"
    argv = [
        *command("stunner-cds", "stunner_cds"),
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--redis-url",
        f"redis://127.0.0.1:{free_port()}/0",  # nothing listens: the feed logs its retries
        "--log-format",
        "json",
    ]
    with running(argv, log_path=log_path) as proc:
        deadline = time.monotonic() + 30
        lines: list[str] = []
        while time.monotonic() < deadline and not lines:
            lines = [ln for ln in proc.output().splitlines() if "Redis not reachable" in ln]
            time.sleep(0.1)
    assert lines, proc.output()[-2000:]
    entry = json.loads(lines[0])
    assert {"ts", "level", "logger", "msg"} <= set(entry)
    assert entry["logger"] == "stunner_cds.store.feed"
    assert entry["level"] == "INFO"


@pytest.mark.parametrize(
    ("flags", "needle"),
    [(["--log-format", "xml"], "log-format"), (["--log-level", "LOUD"], "LOUD")],
)
def test_a_bad_log_setting_exits_2_with_a_message(flags: list[str], needle: str) -> None:
    done = subprocess.run(
        [*command("stunner-cds", "stunner_cds"), *flags], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert needle in done.stderr
