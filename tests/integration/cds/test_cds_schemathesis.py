"""Property-based API testing with schemathesis against a live ``stunner-cds`` process.

The command itself runs as a subprocess (so this also covers the CLI and its env handling);
every documented operation gets bounded positive and negative examples, and none may yield a 5xx
or a response that contradicts the OpenAPI schema.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import hypothesis
import pytest
import redis.asyncio as aioredis
import schemathesis
from hypothesis import HealthCheck, Phase
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from stunner_common.config import parse_config
from stunner_common.io.store import ConfigPublisher
from support.cds import config
from support.ports import free_port
from support.processes import ServerProcess, wait_for_tcp
from support.redis_server import RedisServer

pytestmark = pytest.mark.integration

EXAMPLES_PER_OPERATION = 25


def stunner_cds_argv() -> list[str]:
    script = Path(sys.executable).parent / "stunner-cds"
    return [str(script)] if script.exists() else [sys.executable, "-m", "stunner_cds"]


@pytest.fixture
def cds_process(redis: RedisServer, tmp_path: Path) -> Iterator[str]:
    async def seed() -> None:
        client = aioredis.Redis.from_url(redis.url)
        publisher = ConfigPublisher(client)
        for config_id in ("ns1/gw1", "ns1/gw2", "ns2/gw1"):
            await publisher.upsert(config_id, parse_config(config(config_id)))
        await client.aclose()

    asyncio.run(seed())
    port = free_port()
    env = {**os.environ, "REDIS_URL": redis.url, "CDS_PORT": str(port)}
    proc = ServerProcess(
        [*stunner_cds_argv(), "--host", "127.0.0.1", "--log-level", "WARNING"],
        env=env,
        log_path=tmp_path / "cds.log",
    )
    try:
        wait_for_tcp("127.0.0.1", port, proc=proc)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 10
        while httpx.get(f"{base}/readyz").status_code != 200:
            assert time.monotonic() < deadline, proc.output()
            time.sleep(0.05)
        yield base
    finally:
        proc.stop()


def test_cli_serves_the_store_named_by_redis_url_and_cds_port(cds_process: str) -> None:
    body = httpx.get(f"{cds_process}/api/v1/configs/ns1").json()
    assert [c["admin"]["name"] for c in body["items"]] == ["ns1/gw1", "ns1/gw2"]


def test_cli_rejects_bad_settings_with_a_message_and_exit_code() -> None:
    import subprocess

    done = subprocess.run(
        [*stunner_cds_argv(), "--port", "99999"], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 2
    assert "port" in done.stderr


def test_schemathesis_finds_no_server_errors_or_schema_violations(cds_process: str) -> None:
    schema = schemathesis.openapi.from_url(f"{cds_process}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]
    assert len(operations) == 7
    settings = hypothesis.settings(
        max_examples=EXAMPLES_PER_OPERATION,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )

    def fuzz(
        operation: schemathesis.APIOperation[Any, Any, Any, Any],
        mode: GenerationMode,
        checks: list[Any],
    ) -> None:
        @settings
        @hypothesis.given(case=operation.as_strategy(mode))
        def check(case: schemathesis.Case[Any]) -> None:
            case.call_and_validate(base_url=cds_process, checks=checks, timeout=10)

        check()

    for operation in operations:
        for mode, checks in (
            (
                GenerationMode.POSITIVE,
                [
                    not_a_server_error,
                    status_code_conformance,
                    content_type_conformance,
                    response_schema_conformance,
                ],
            ),
            (GenerationMode.NEGATIVE, [not_a_server_error]),
        ):
            if mode is GenerationMode.NEGATIVE and not list(operation.iter_parameters()):
                continue  # nothing to make invalid
            fuzz(operation, mode, checks)
