"""Command-line papercuts, run as users run them: bad settings give one line and exit 2 (no
pydantic dump, no traceback, no password), every console script answers its bad arguments with a
message and no traceback, and turncat treats any stdin that ends as the end."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import IO

import pytest

from support.ports import free_port, free_udp_tcp_port
from support.processes import ServerProcess

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[2]
URI = "turn://u:p@127.0.0.1:3999?transport=udp"
PEER = "udp://127.0.0.1:9"

# Every console script's bad-argument cases: (argv, environment, a phrase the one-line answer
# must hold). Each must exit non-zero with that message and no traceback.
BAD_ARGUMENTS: dict[str, list[tuple[list[str], dict[str, str], str]]] = {
    "stunner-cds": [
        (["--bogus"], {}, "unrecognized arguments: --bogus"),
        (["--port", "notaport"], {}, "invalid int value"),
        (["--port", "99999"], {}, "port: Input should be less than or equal to 65535"),
        (["--redis-url", "nope"], {}, "invalid Redis URL 'nope'"),
        (["--log-level", "LOUD"], {}, "unknown log level 'LOUD'"),
        (["--tls-cert-file", "/nonexistent"], {}, "must be given together"),
        (
            ["--tls-cert-file", "/nonexistent", "--tls-key-file", "/nonexistent", "--port", "0"],
            {},
            "--tls-cert-file '/nonexistent': no such file",
        ),
        (
            ["--tls-cert-file", __file__, "--tls-key-file", __file__, "--port", "0"],
            {},
            "not a PEM certificate chain and its private key",
        ),
        (["--host", "999.1.1.1", "--port", "1"], {}, "cannot listen on 999.1.1.1:1"),
    ],
    "stunner-auth": [
        (["--bogus"], {}, "unrecognized arguments: --bogus"),
        (["--port", "99999"], {}, "port: Input should be less than or equal to 65535"),
        (["--cds-server-address", "http://[::1"], {}, "invalid CDS address 'http://[::1'"),
        (["--cds-token-file", "/nonexistent"], {}, "CDS token file '/nonexistent'"),
        (["--log-level", "LOUD"], {}, "unknown log level 'LOUD'"),
        (["--host", "999.1.1.1", "--port", "1"], {}, "cannot listen on 999.1.1.1:1"),
    ],
    "stunner-operator": [
        (["--bogus"], {}, "unrecognized arguments: --bogus"),
        (["--manifests", "/nonexistent"], {}, "/nonexistent: no such file or folder"),
        (["--dry-run"], {}, "--dry-run needs --manifests PATH"),
        (["--manifests", ".", "--redis-url", "nope"], {}, "invalid Redis URL 'nope'"),
        (["--manifests", ".", "--health-address", "nonsense"], {}, "is not HOST:PORT"),
        (["--manifests", ".", "--metrics-address", "127.0.0.1:99999"], {}, "is not HOST:PORT"),
    ],
    "stunnerd": [
        (["--bogus"], {}, "unrecognized arguments: --bogus"),
        (["-c", "/nonexistent"], {}, "cannot read config file /nonexistent"),
        (["-c", "ws://[::1"], {}, "invalid config origin 'ws://[::1'"),
        (["turn://u:p@1.2.3.4:99999"], {}, "invalid TURN URI 'turn://u:p@1.2.3.4:99999'"),
        (["-l", "all:LOUD", URI], {}, "invalid log spec 'all:LOUD'"),
        (["--udp-thread-num", "-1", URI], {}, "--udp-thread-num must not be negative"),
    ],
    "turncat": [
        ([], {}, "the following arguments are required"),
        (["-", "turn://u:p@127.0.0.1:99999", PEER], {}, 'invalid port "99999"'),
        (["-", "gopher://x", PEER], {}, "unknown scheme 'gopher'"),
        (["-", URI, "udp://[::1"], {}, "invalid peer address 'udp://[::1'"),
        (["udp://[::1", URI, PEER], {}, "invalid local address 'udp://[::1'"),
        (["-", URI, PEER, "-l", "all:LOUD"], {}, "invalid log spec 'all:LOUD'"),
        (["-", URI, PEER, "--ca", "/nonexistent"], {}, "CA file '/nonexistent' does not exist"),
        (
            ["-", "k8s://stunner/gw:l", PEER, "--cds-server-address", "http://[::1"],
            {},
            "invalid CDS address 'http://[::1'",
        ),
        (
            ["-", "k8s://stunner/gw:l", PEER, "--cds-token-file", "/nonexistent"],
            {},
            "CDS token file '/nonexistent': No such file or directory",
        ),
        (["-", URI, PEER], {"TURNCAT_CONNECT_TIMEOUT_S": "-1"}, "invalid TURNCAT_* setting"),
    ],
    "stunnerctl": [
        ([], {}, "the following arguments are required"),
        (["bogus"], {}, "invalid choice: 'bogus'"),
        (["--cds", "http://[::1", "config"], {}, "invalid CDS address 'http://[::1'"),
        (["--timeout", "-1", "config"], {}, "--timeout must be positive"),
        (["config", "a/b/c"], {}, "expected NAME or NAMESPACE/NAME"),
        (["-l", "all:LOUD", "config"], {}, "invalid log spec 'all:LOUD'"),
        (["icetest", "--count", "0"], {}, "--count must be at least 1"),
        (["icetest", "--peer", "tcp://1.2.3.4:5"], {}, "must be a UDP echo"),
        (["--cds-token-file", "/nonexistent", "config"], {}, "CDS token file '/nonexistent'"),
    ],
}


def console_scripts() -> set[str]:
    """Every [project.scripts] entry of every package under services/."""
    names: set[str] = set()
    for pyproject in sorted(ROOT.glob("services/*/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text()).get("project", {})
        names |= set(project.get("scripts", {}))
    return names


def test_every_console_script_has_bad_argument_cases() -> None:
    assert console_scripts() == set(BAD_ARGUMENTS)


@pytest.mark.parametrize(
    ("script", "argv", "env", "phrase"),
    [
        pytest.param(script, argv, env, phrase, id=f"{script} {' '.join(argv)}"[:80])
        for script, cases in BAD_ARGUMENTS.items()
        for argv, env, phrase in cases
    ],
)
def test_bad_arguments_give_a_message_not_a_traceback(
    script: str, argv: list[str], env: dict[str, str], phrase: str
) -> None:
    result = run([str(BIN / script), *argv], {"CDS_SERVER_ADDR": "127.0.0.1:1", **env})
    assert result.returncode != 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    message = lines[-1] if lines else ""
    assert message.startswith(f"{script}: "), result.stderr
    assert phrase in message, result.stderr
    # One line, or argparse's usage and then its one line.
    assert len([ln for ln in lines if not ln.startswith((" ", "usage:"))]) == 1, result.stderr


def test_a_cds_whose_port_is_taken_says_so(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = run(
            [str(BIN / "stunner-cds"), "--host", "127.0.0.1", "--port", str(port)],
            {"REDIS_URL": "redis://nobody:wrong@127.0.0.1:1/0"},
        )
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"stunner-cds: port {port} on 127.0.0.1 is already in use (`make stop` stops an earlier "
        "`make run`); choose another with --port"
    )


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
        (
            ["stunner-operator", "--manifests", "."],
            {"OPERATOR_WRITERS": "0"},
            "stunner-operator: invalid settings: writers: ",
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
