"""A worker process logs in the supervisor's format: JSON lines tagged with its index when asked."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from stunnerd.net.tuning import ServerTuning

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@pytest.mark.parametrize("log_format", ["json", "text"])
def test_a_worker_writes_its_log_in_the_format_it_was_given(log_format: str) -> None:
    argv = [
        sys.executable,
        "-m",
        "stunnerd.worker_main",
        "--index",
        "3",
        "--bind",
        "127.0.0.1",
        "--log-format",
        log_format,
        "--tuning",
        ServerTuning(udp_gso=False).to_json(),
    ]
    proc = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stderr is not None
        assert proc.stdin is not None
        lines: list[str] = []
        while not any("worker 3 ready" in line for line in lines):
            line = proc.stderr.readline()  # the module's timeout bounds a worker that never logs
            assert line, f"the worker exited: {lines}"
            lines.append(line.rstrip("\n"))
        proc.stdin.close()  # as when the supervisor goes away: the worker exits
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    ready = [line for line in lines if "worker 3 ready" in line]
    if log_format == "json":
        records = [json.loads(line) for line in lines]  # every line is one JSON object
        (record,) = [r for r in records if r["msg"].startswith("worker 3 ready")]
        assert (record["level"], record["tag"]) == ("INFO", "worker-3")
    else:
        assert not ready[0].startswith("{")
        assert " worker-3 INFO " in ready[0]
