"""Upstream stunnerd v1.2.1 (Go, unmodified) configured from OUR CDS over the v1 protocol.

Our CDS must serve an unmodified upstream stunnerd. Each test runs a real
redis-server, our ``stunner-cds`` process and the operator's publisher; upstream stunnerd watches
``/api/v1/configs/<ns>/<gw>?watch=true`` (its ``-w -c ws://…``), and relays for upstream turncat
(``k8s://`` URIs resolved through our CDS too) and coturn's turnutils_uclient; it follows a live
edit, ignores the zero config of a delete (as upstream always does in ``-w`` mode), keeps its last
config while our CDS is away and catches up when it returns.
"""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path
from typing import Any

import pytest

from support.echo import udp_echo
from support.ports import LOOPBACK, free_port
from support.turncat_harness import udp_client
from support.upstream import (
    EPHEMERAL,
    GATEWAY,
    LISTENER,
    PASSWORD,
    PROTOCOLS,
    SECRET,
    STATIC,
    UCLIENT_MESSAGES,
    UCLIENT_SESSIONS,
    USER,
    Gateway,
    OurCds,
    UpstreamStunnerd,
    cds_flags,
    uclient_every_transport,
    upstream_turncat,
)

pytestmark = [pytest.mark.interop, pytest.mark.integration, pytest.mark.timeout(180)]


def watching(
    upstream: Path, tmp: Path, cds: OurCds, gateway: Gateway, *extra: str
) -> UpstreamStunnerd:
    """Upstream stunnerd as the operator deploys it: ``-w``, the CDS origin, the gateway id."""
    return UpstreamStunnerd(
        upstream,
        tmp,
        "-w",
        "-c",
        cds.ws_origin,
        "--id",
        GATEWAY,
        *extra,
        health_port=gateway.health_port,
    )


def ready_with(protocols: tuple[str, ...], realm: str | None = None) -> Any:
    def check(status: dict[str, Any]) -> bool:
        listeners = {item["protocol"] for item in status.get("listeners") or []}
        realm_ok = realm is None or status.get("auth", {}).get("realm") == realm
        return status.get("status") == "READY" and listeners == set(protocols) and realm_ok

    return check


async def relays(upstream: Path, uri: str, peer: str, *flags: str) -> bool:
    """Whether a datagram goes through upstream turncat (``uri``) to ``peer`` and back."""
    local = free_port(socket.SOCK_DGRAM)
    tc = await upstream_turncat(upstream, *flags, f"udp://{LOOPBACK}:{local}", uri, peer)
    client = await udp_client(LOOPBACK, local)
    try:
        return await client.roundtrip(b"through upstream stunnerd", timeout_s=6.0) == (
            b"through upstream stunnerd"
        )
    except TimeoutError:
        return False
    finally:
        client.close()
        # How upstream's turncat shuts down is not under test: one that has not exited 15 s
        # after SIGINT (it deallocates first) is killed, and the relaying still counts.
        with contextlib.suppress(TimeoutError):
            await tc.stop()


@pytest.mark.parametrize(("auth", "uclient_auth"), [
    (STATIC, ["-u", USER, "-w", PASSWORD]),
    (EPHEMERAL, ["-W", SECRET, "-u", "alice"]),
], ids=["static", "ephemeral"])  # fmt: skip
async def test_upstream_stunnerd_from_our_cds_relays_for_turncat_and_uclient(
    upstream: Path,
    tmp_path: Path,
    cds: OurCds,
    gateway: Gateway,
    echo_peer: int,
    auth: dict[str, Any],
    uclient_auth: list[str],
) -> None:
    await cds.publish(gateway.config(auth))
    stunnerd = watching(upstream, tmp_path, cds, gateway)
    try:
        await stunnerd.wait_status(ready_with(PROTOCOLS), "every listener up")
        # Upstream turncat resolves each listener, its public address and the credentials
        # (minting TURN REST ones from the secret) through our CDS, as in a cluster.
        for proto in PROTOCOLS:
            uri = f"k8s://{GATEWAY}:{LISTENER[proto]}"
            tls = ["-i"] if proto in ("TURN-TLS", "TURN-DTLS") else []
            peer = f"udp://{LOOPBACK}:{echo_peer}"
            assert await relays(upstream, uri, peer, *tls, *cds_flags(cds.cds)), proto
        results = await uclient_every_transport(gateway.ports, echo_peer, uclient_auth)
        for proto, (sent, received, output) in results.items():
            assert sent == UCLIENT_MESSAGES * UCLIENT_SESSIONS, f"{proto}:\n{output[-2000:]}"
            assert received == sent, f"{proto}:\n{output[-2000:]}"
    finally:
        await stunnerd.close()


async def test_upstream_stunnerd_follows_a_live_edit_and_ignores_the_delete(
    upstream: Path, tmp_path: Path, cds: OurCds, gateway: Gateway
) -> None:
    first = gateway.config(STATIC, protocols=("TURN-UDP",))
    await cds.publish(first)
    stunnerd = watching(upstream, tmp_path, cds, gateway)
    try:
        async with udp_echo() as echo:
            await stunnerd.wait_status(ready_with(("TURN-UDP",), STATIC["realm"]), "the config")

            def uri(proto: str, password: str) -> str:
                return f"turn://{USER}:{password}@{LOOPBACK}:{gateway.ports[proto]}?transport={LISTENER[proto]}"

            assert await relays(upstream, uri("TURN-UDP", PASSWORD), echo.url)

            # The edit: a new password and realm, a second listener.
            edited_auth = {
                "type": "static",
                "realm": "edited.example",
                "credentials": {"username": USER, "password": "new-pa$$"},
            }
            edited = gateway.config(edited_auth, protocols=("TURN-UDP", "TURN-TCP"))
            await cds.publish(edited)
            await stunnerd.wait_status(
                ready_with(("TURN-UDP", "TURN-TCP"), "edited.example"), "the edited config"
            )
            assert await relays(upstream, uri("TURN-UDP", "new-pa$$"), echo.url)
            assert await relays(upstream, uri("TURN-TCP", "new-pa$$"), echo.url)
            assert not await relays(upstream, uri("TURN-UDP", PASSWORD), echo.url)

            # The delete reaches upstream stunnerd as the zero config, which it ignores by design
            # (a draining pod keeps its listeners); it goes on relaying with the edited config.
            await cds.delete(GATEWAY)
            await stunnerd.wait_log("Ignoring delete configuration update")
            status = await stunnerd.status()
            assert ready_with(("TURN-UDP", "TURN-TCP"), "edited.example")(status), status
            assert await relays(upstream, uri("TURN-TCP", "new-pa$$"), echo.url)
    finally:
        await stunnerd.close()


async def test_upstream_stunnerd_keeps_its_config_while_our_cds_is_away(
    upstream: Path, tmp_path: Path, cds: OurCds, gateway: Gateway
) -> None:
    await cds.publish(gateway.config(STATIC, protocols=("TURN-UDP",)))
    stunnerd = watching(upstream, tmp_path, cds, gateway)
    try:
        async with udp_echo() as echo:
            await stunnerd.wait_status(ready_with(("TURN-UDP",)), "the config")
            cds.cds.stop()
            uri = f"turn://{USER}:{PASSWORD}@{LOOPBACK}:{gateway.ports['TURN-UDP']}?transport=udp"
            assert await relays(upstream, uri, echo.url)
            # An edit made while the CDS is down arrives once it is back on the same port.
            await cds.publisher.upsert(
                GATEWAY,
                gateway.config({**STATIC, "realm": "after.restart"}, protocols=("TURN-UDP",)),
            )
            cds.cds.start()
            await stunnerd.wait_status(
                ready_with(("TURN-UDP",), "after.restart"), "the config published meanwhile"
            )
    finally:
        await stunnerd.close()


@pytest.mark.parametrize("origin", ["ws", "http", "host-port", "env", "one-shot"])
async def test_upstream_stunnerd_takes_our_cds_in_every_origin_form(
    upstream: Path, tmp_path: Path, cds: OurCds, gateway: Gateway, origin: str
) -> None:
    """``-c ws://``, ``-c http://`` (upstream forces ws), a bare ``host:port``, the environment
    the operator renders (``STUNNER_CONFIG_ORIGIN``, ``STUNNER_NAMESPACE``/``STUNNER_NAME``),
    and without ``-w`` one plain GET."""
    await cds.publish(gateway.config(STATIC, protocols=("TURN-UDP",)))
    host_port = f"{LOOPBACK}:{cds.cds.port}"
    args: dict[str, list[str]] = {
        "ws": ["-w", "-c", cds.ws_origin, "--id", GATEWAY],
        "http": ["-w", "-c", cds.http_origin, "--id", GATEWAY],
        "host-port": ["-w", "-c", host_port, "--id", GATEWAY],
        "env": ["-w"],
        "one-shot": ["-c", cds.http_origin, "--id", GATEWAY],
    }
    env = {}
    if origin == "env":
        namespace, name = GATEWAY.split("/")
        env = {
            "STUNNER_CONFIG_ORIGIN": cds.http_origin,
            "STUNNER_NAMESPACE": namespace,
            "STUNNER_NAME": name,
        }
    stunnerd = UpstreamStunnerd(
        upstream, tmp_path, *args[origin], health_port=gateway.health_port, env=env
    )
    try:
        async with udp_echo() as echo:
            await stunnerd.wait_status(ready_with(("TURN-UDP",)), "the config")
            uri = f"turn://{USER}:{PASSWORD}@{LOOPBACK}:{gateway.ports['TURN-UDP']}?transport=udp"
            assert await relays(upstream, uri, echo.url)
    finally:
        await stunnerd.close()


async def test_upstream_stunnerd_expands_the_pod_address_and_the_node_placeholder(
    upstream: Path, tmp_path: Path, cds: OurCds, gateway: Gateway
) -> None:
    """The operator renders ``$STUNNER_ADDR`` (or, for relay address discovery, a node
    placeholder our CDS rewrites for ``node=``): upstream stunnerd expands both to its pod IP."""
    config = gateway.config(STATIC, protocols=("TURN-UDP", "TURN-TCP"))
    config["listeners"][0]["address"] = "$STUNNER_ADDR"
    config["listeners"][1]["address"] = "__node_address_placeholder"
    await cds.publish(config)
    env = {"STUNNER_ADDR": LOOPBACK, "STUNNER_NODENAME": "worker-1"}
    stunnerd = UpstreamStunnerd(
        upstream,
        tmp_path,
        "-w",
        "-c",
        cds.ws_origin,
        "--id",
        GATEWAY,
        health_port=gateway.health_port,
        env=env,
    )
    try:
        status = await stunnerd.wait_status(ready_with(("TURN-UDP", "TURN-TCP")), "the config")
        assert {item["address"] for item in status["listeners"]} == {LOOPBACK}, status
        async with udp_echo() as echo:
            for proto in ("TURN-UDP", "TURN-TCP"):
                port = gateway.ports[proto]
                uri = f"turn://{USER}:{PASSWORD}@{LOOPBACK}:{port}?transport={LISTENER[proto]}"
                assert await relays(upstream, uri, echo.url), proto
    finally:
        await stunnerd.close()
