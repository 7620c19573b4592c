"""The CDS bearer token end to end: stunnerd and turncat send it, a wrong one is refused clearly.

Real redis-server, operator (local mode), CDS with `CDS_TOKEN`, stunnerd with `--cds-token-file`.
A wrong or missing token gets 401 and one clear log line (that never shows the token); stunnerd
keeps its running config and relays on while it retries, and follows a rotated token file.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from support.echo import echo_peer
from support.security_stack import Stack, SteadyRelay, running_stack

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

BIN = Path(sys.executable).parent


async def wait_for_log(stack: Stack, text: str, timeout_s: float = 20.0) -> list[str]:
    async with asyncio.timeout(timeout_s):
        while not (lines := stack.grep(text)):  # noqa: ASYNC110 - the logs are files
            await asyncio.sleep(0.05)
    return lines


async def test_stunnerd_with_the_token_file_gets_its_config(tmp_path: Path) -> None:
    async with running_stack(tmp_path) as stack:
        status = await stack.status()
        assert status["listeners"], status
        assert not stack.grep("refused the watch")


async def test_a_wrong_token_gets_a_clear_401_line_and_a_rotated_file_is_followed(
    tmp_path: Path,
) -> None:
    stack = Stack(tmp_path)
    assert stack.cds_token
    right = stack.cds_token
    stack.token_file.write_text("not-the-token\n")
    try:
        stack.start_all()
        lines = await wait_for_log(stack, "refused the watch (401 Unauthorized)")
        assert "the bearer token is wrong" in lines[0]
        assert "CDS_TOKEN" in lines[0]
        assert not (await stack.status()).get("listeners")  # no config without the token
        stack.token_file.write_text(right + "\n")  # the Secret was fixed: no restart needed
        await stack.ready()
    finally:
        await stack.close()
    assert not stack.grep("not-the-token"), "the token must never be logged"
    assert not stack.grep(right)


async def test_a_missing_token_is_refused_and_named_missing(tmp_path: Path) -> None:
    stack = Stack(tmp_path)
    stack.token_file.unlink()
    try:
        stack.start_all()
        lines = await wait_for_log(stack, "refused the watch (401 Unauthorized)")
        assert "the bearer token is missing" in lines[0]
        await wait_for_log(stack, "cannot read it")  # the file's problem, said once
    finally:
        await stack.close()


async def test_when_the_cds_token_changes_stunnerd_keeps_its_config_and_relays_until_it_follows(
    tmp_path: Path,
) -> None:
    async with (
        running_stack(tmp_path) as stack,
        echo_peer() as (_echo, peer),
        SteadyRelay(stack.udp_port, peer, stack.secrets.user, stack.secrets.password) as relay,
    ):
        # the CDS comes back with a new token: the old one is refused from now on
        stack.kill("cds0")
        stack.cds_token = "rotated-" + (stack.cds_token or "")
        await asyncio.to_thread(stack.start_cds)
        await wait_for_log(stack, "refused the watch (401 Unauthorized)")
        stack.add_prefix("127.0.0.2/32")  # not visible to a refused stunnerd
        await asyncio.sleep(1.0)
        status = await stack.status()
        assert status["status"] == "READY"
        assert "127.0.0.2" not in stack.endpoints_of(status)
        assert status["listeners"], "the running config was kept"
        stack.token_file.write_text(stack.cds_token)
        await stack.wait_status(lambda s: "127.0.0.2" in stack.endpoints_of(s), "the edit")
        lost = await relay.stop()
        assert lost == 0, f"{lost} of {relay.sent} lost"


async def test_turncat_sends_the_token_from_cds_token_and_says_what_is_wrong_without_it(
    tmp_path: Path,
) -> None:
    async with running_stack(tmp_path) as stack, echo_peer() as (_echo, peer):
        cds = f"127.0.0.1:{stack.cds_ports[0]}"
        uri = "k8s://stunner/udp-gateway:udp-listener"

        async def turncat(env: dict[str, str], *extra: str) -> tuple[int, bytes, bytes]:
            proc = await asyncio.create_subprocess_exec(
                str(BIN / "turncat"),
                "--cds-server-address",
                cds,
                *extra,
                "-",
                uri,
                f"udp://{peer[0]}:{peer[1]}",
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
            )
            async with asyncio.timeout(30):
                out, err = await proc.communicate(b"hello\n")
            return proc.returncode or 0, out, err

        base = {k: v for k, v in os.environ.items() if not k.startswith("CDS_TOKEN")}
        token = stack.cds_token or ""
        code, out, err = await turncat({**base, "CDS_TOKEN": token})
        assert out == b"hello\n", err.decode()[-2000:]
        code, out, err = await turncat(base, "--cds-token-file", str(stack.token_file))
        assert out == b"hello\n", err.decode()[-2000:]
        code, out, err = await turncat(base)
        assert code != 0
        assert b"refused the request (401): the bearer token is missing" in err, err
        code, out, err = await turncat({**base, "CDS_TOKEN": "wrong-token"})
        assert code != 0
        assert b"the bearer token is wrong" in err, err
        assert b"wrong-token" not in err
