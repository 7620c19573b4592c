"""The reconcile planner against every row of the upstream change table."""

from __future__ import annotations

import base64
import copy
from collections.abc import Callable
from typing import Any

import pytest

from stunner_common.config import StunnerConfig, parse_config
from stunnerd.reconcile.plan import plan_reconcile
from stunnerd.status import Plan

CERT_A = base64.b64encode(
    b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
).decode()
CERT_B = base64.b64encode(
    b"-----BEGIN CERTIFICATE-----\nBBBB\n-----END CERTIFICATE-----\n"
).decode()
KEY_A = base64.b64encode(b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n").decode()


def base() -> dict[str, Any]:
    return {
        "version": "v1",
        "admin": {"name": "ns/gw", "loglevel": "all:INFO", "healthcheck_endpoint": "http://:8086"},
        "auth": {
            "type": "static",
            "realm": "stunner.l7mp.io",
            "credentials": {"username": "user", "password": "pass"},
        },
        "listeners": [
            {
                "name": "udp",
                "protocol": "TURN-UDP",
                "address": "127.0.0.1",
                "port": 3478,
                "routes": ["echo"],
            },
            {
                "name": "tcp",
                "protocol": "TURN-TCP",
                "address": "127.0.0.1",
                "port": 3479,
                "routes": ["echo"],
            },
            {
                "name": "tls",
                "protocol": "TURN-TLS",
                "address": "127.0.0.1",
                "port": 443,
                "cert": CERT_A,
                "key": KEY_A,
                "routes": ["echo"],
            },
        ],
        "clusters": [
            {"name": "echo", "type": "STATIC", "protocol": "UDP", "endpoints": ["127.0.0.1"]},
            {"name": "dns", "type": "STRICT_DNS", "protocol": "UDP", "endpoints": ["echo.example"]},
        ],
    }


def cfg(edit: Callable[[dict[str, Any]], object] | None = None) -> StunnerConfig:
    data = copy.deepcopy(base())
    if edit is not None:
        edit(data)
    return parse_config(data)


def listener(data: dict[str, Any], name: str) -> dict[str, Any]:
    return next(lst for lst in data["listeners"] if lst["name"] == name)


def cluster(data: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in data["clusters"] if c["name"] == name)


def test_an_identical_config_plans_nothing() -> None:
    assert plan_reconcile(cfg(), cfg()).is_noop


def test_the_first_config_adds_every_listener_and_reports_no_restart() -> None:
    plan = plan_reconcile(None, cfg())
    assert plan.add_listeners == ("tcp", "tls", "udp")
    assert plan.restarted == ()
    assert plan.rebind_health
    assert plan.update_auth
    assert plan.update_clusters


def test_adding_a_listener_starts_only_it_and_is_not_a_restart() -> None:
    def add(d: dict[str, Any]) -> None:
        d["listeners"].append({"name": "udp2", "protocol": "TURN-UDP", "port": 3480})

    plan = plan_reconcile(cfg(), cfg(add))
    assert plan == Plan(add_listeners=("udp2",))


def test_removing_a_listener_closes_only_it_and_is_not_a_restart() -> None:
    def drop(d: dict[str, Any]) -> None:
        d["listeners"] = [lst for lst in d["listeners"] if lst["name"] != "tcp"]

    assert plan_reconcile(cfg(), cfg(drop)) == Plan(remove_listeners=("tcp",))


def test_renaming_a_listener_is_a_remove_plus_an_add() -> None:
    def rename(d: dict[str, Any]) -> None:
        listener(d, "udp")["name"] = "udp-renamed"

    plan = plan_reconcile(cfg(), cfg(rename))
    assert plan == Plan(remove_listeners=("udp",), add_listeners=("udp-renamed",))


@pytest.mark.parametrize(
    ("field", "value"),
    [("protocol", "TURN-TCP"), ("address", "127.0.0.2"), ("port", 4000)],
)
def test_a_listener_socket_change_restarts_that_listener_only(field: str, value: object) -> None:
    def change(d: dict[str, Any]) -> None:
        listener(d, "udp")[field] = value

    plan = plan_reconcile(cfg(), cfg(change))
    assert plan == Plan(restart_listeners=("udp",), restarted=("listener: udp",))


@pytest.mark.parametrize(
    ("field", "value"),
    [("routes", ["echo", "dns"]), ("public_address", "1.2.3.4"), ("public_port", 30478)],
)
def test_routes_and_public_address_apply_in_place(field: str, value: object) -> None:
    def change(d: dict[str, Any]) -> None:
        listener(d, "udp")[field] = value

    assert plan_reconcile(cfg(), cfg(change)) == Plan(update_listeners=("udp",))


def test_a_tls_cert_change_is_an_in_place_rotation_not_a_restart() -> None:
    def rotate(d: dict[str, Any]) -> None:
        listener(d, "tls")["cert"] = CERT_B

    plan = plan_reconcile(cfg(), cfg(rotate))
    assert plan == Plan(rotate_certs=("tls",))
    assert plan.restarted == ()


def test_cert_equality_is_judged_after_base64_decoding() -> None:
    def rewrap(d: dict[str, Any]) -> None:
        # The same bytes, encoded without padding tolerance issues: identical after decoding.
        listener(d, "tls")["cert"] = base64.b64encode(base64.b64decode(CERT_A)).decode()

    assert plan_reconcile(cfg(), cfg(rewrap)).is_noop


def test_a_realm_change_restarts_every_listener() -> None:
    def realm(d: dict[str, Any]) -> None:
        d["auth"]["realm"] = "other.realm"

    plan = plan_reconcile(cfg(), cfg(realm))
    assert plan.restart_listeners == ("tcp", "tls", "udp")
    assert plan.restarted == ("listener: tcp", "listener: tls", "listener: udp")
    assert plan.update_auth


@pytest.mark.parametrize(
    "auth",
    [
        {"type": "static", "credentials": {"username": "user", "password": "new"}},
        {"type": "static", "credentials": {"username": "other", "password": "pass"}},
        {"type": "ephemeral", "credentials": {"secret": "s3cret"}},
    ],
)
def test_credential_and_type_changes_within_a_realm_apply_in_place(auth: dict[str, Any]) -> None:
    def change(d: dict[str, Any]) -> None:
        d["auth"].update(auth)

    assert plan_reconcile(cfg(), cfg(change)) == Plan(update_auth=True)


def test_an_auth_type_crossing_none_restarts_every_listener() -> None:
    def none(d: dict[str, Any]) -> None:
        d["auth"] = {"type": "none", "realm": "stunner.l7mp.io"}

    to_none = plan_reconcile(cfg(), cfg(none))
    assert to_none.restart_listeners == ("tcp", "tls", "udp")
    back = plan_reconcile(cfg(none), cfg())
    assert back.restart_listeners == ("tcp", "tls", "udp")


@pytest.mark.parametrize(
    "edit",
    [
        lambda d: d["clusters"].append(
            {"name": "extra", "type": "STATIC", "endpoints": ["10.0.0.0/8"]}
        ),
        lambda d: d.update(clusters=[c for c in d["clusters"] if c["name"] != "echo"]),
        lambda d: cluster(d, "echo").update(endpoints=["127.0.0.2", "10.0.0.1:<1-2>"]),
        lambda d: cluster(d, "echo").update(protocol="TCP"),
        lambda d: cluster(d, "dns").update(endpoints=["ECHO.example"]),
    ],
    ids=["added", "removed", "static-endpoints", "static-protocol", "dns-case-only"],
)
def test_cluster_changes_rebuild_peer_admission_in_place(
    edit: Callable[[dict[str, Any]], object],
) -> None:
    assert plan_reconcile(cfg(), cfg(edit)) == Plan(update_clusters=True)


@pytest.mark.parametrize(
    "edit",
    [
        lambda d: cluster(d, "dns").update(endpoints=["other.example"]),
        lambda d: cluster(d, "echo").update(type="STRICT_DNS", endpoints=["echo.example"]),
    ],
    ids=["dns-domain-set", "static-to-dns"],
)
def test_dns_domain_set_or_type_changes_restart_the_cluster(
    edit: Callable[[dict[str, Any]], object],
) -> None:
    plan = plan_reconcile(cfg(), cfg(edit))
    assert plan.update_clusters
    assert len(plan.restarted) == 1
    assert plan.restarted[0].startswith("cluster: ")
    assert plan.restart_listeners == ()


@pytest.mark.parametrize(
    ("field", "value"),
    [("name", "ns/other"), ("loglevel", "all:DEBUG"), ("user_quota", 12)],
)
def test_admin_name_loglevel_and_quota_apply_in_place(field: str, value: object) -> None:
    def change(d: dict[str, Any]) -> None:
        d["admin"][field] = value

    assert plan_reconcile(cfg(), cfg(change)) == Plan(update_admin=True)


def test_a_healthcheck_endpoint_change_rebinds_only_the_health_server() -> None:
    def change(d: dict[str, Any]) -> None:
        d["admin"]["healthcheck_endpoint"] = "http://:8087"

    plan = plan_reconcile(cfg(), cfg(change))
    assert plan == Plan(rebind_health=True, restarted=("health: default-health",))


def test_a_metrics_endpoint_change_rebinds_only_the_metrics_server() -> None:
    def change(d: dict[str, Any]) -> None:
        d["admin"]["metrics_endpoint"] = "http://:8080/metrics"

    plan = plan_reconcile(cfg(), cfg(change))
    assert plan == Plan(rebind_metrics=True, restarted=("metrics: default-metrics",))


def test_an_offload_change_is_reported_as_an_offload_restart() -> None:
    def change(d: dict[str, Any]) -> None:
        d["admin"]["offload_engine"] = "XDP"

    plan = plan_reconcile(cfg(), cfg(change))
    assert plan == Plan(restart_offload=True, restarted=("offload: default-offload",))


def test_several_changes_combine_without_touching_unchanged_listeners() -> None:
    def change(d: dict[str, Any]) -> None:
        listener(d, "udp")["port"] = 3500
        listener(d, "tcp")["routes"] = []
        d["auth"]["credentials"]["password"] = "rotated"

    plan = plan_reconcile(cfg(), cfg(change))
    assert plan.restart_listeners == ("udp",)
    assert plan.update_listeners == ("tcp",)
    assert "tls" not in (*plan.restart_listeners, *plan.update_listeners, *plan.remove_listeners)
    assert plan.update_auth
