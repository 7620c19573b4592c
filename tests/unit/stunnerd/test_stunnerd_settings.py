"""The command's settings: origin precedence, identity and origin kinds."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Any

import pytest

import stunnerd
from stunnerd.app import make_origin
from stunnerd.cli import build_parser
from stunnerd.origin.base import ConfigOriginError
from stunnerd.origin.cds import CdsOrigin
from stunnerd.origin.file import FileOrigin
from stunnerd.settings import (
    ADMIN,
    LIMITS,
    QUOTA,
    TUNING,
    WORKER_TIMEOUTS,
    DaemonSettings,
    Group,
    StunnerdSettings,
    load_settings,
)


def test_the_origin_flag_beats_the_environment_which_beats_the_default() -> None:
    env = {
        "STUNNER_CONFIG_ORIGIN": "ws://cds:13478",
        "STUNNER_NAMESPACE": "ns",
        "STUNNER_NAME": "gw",
    }
    flagged = load_settings(env, config="/etc/x.yaml", watch=False, turn_uri=None, ident=None)
    assert flagged.origin == "/etc/x.yaml"
    from_env = load_settings(env, config=None, watch=True, turn_uri=None, ident=None)
    assert (from_env.origin, from_env.namespace, from_env.name) == ("ws://cds:13478", "ns", "gw")
    default = load_settings({}, config=None, watch=False, turn_uri=None, ident="a/b")
    assert default.origin == ":13478"
    assert (default.namespace, default.name) == ("a", "b")


@pytest.mark.parametrize(
    ("env", "flag", "watch"),
    [
        ({}, False, False),
        ({}, True, True),
        ({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, False, True),
        ({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "STUNNERD_WATCH": "false"}, False, False),
        ({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "STUNNERD_WATCH": "false"}, True, True),
        ({"KUBERNETES_SERVICE_HOST": ""}, False, False),
        ({"STUNNERD_WATCH": "true"}, False, True),
    ],
)
def test_in_a_pod_the_origin_is_followed_unless_watching_is_turned_off(
    env: dict[str, str], flag: bool, watch: bool
) -> None:
    env = {"STUNNER_CONFIG_ORIGIN": "http://stunner-cds.stunner:13478", **env}
    settings = load_settings(env, config=None, watch=flag, turn_uri=None, ident="a/b")
    assert settings.watch is watch


def test_the_node_name_comes_from_the_environment() -> None:
    env = {"STUNNER_NODENAME": "worker-1"}
    settings = load_settings(env, config=None, watch=True, turn_uri=None, ident="a/b")
    assert settings.node == "worker-1"


def test_a_bad_id_is_refused() -> None:
    with pytest.raises(ConfigOriginError, match="invalid id"):
        load_settings({}, config=None, watch=True, turn_uri=None, ident="nope")


@pytest.mark.parametrize(
    ("origin", "kind"),
    [
        ("/etc/stunnerd.conf", FileOrigin),
        ("file:///etc/stunnerd.conf", FileOrigin),
        ("http://127.0.0.1:13478", CdsOrigin),
        ("ws://127.0.0.1:13478", CdsOrigin),
        ("127.0.0.1:13478", CdsOrigin),
    ],
)
def test_each_origin_form_builds_the_matching_client(origin: str, kind: type) -> None:
    built = make_origin(StunnerdSettings(origin=origin, namespace="ns", name="gw"))
    assert isinstance(built, kind)


def test_the_cds_client_gets_the_identity_and_node() -> None:
    settings = StunnerdSettings(origin="ws://h:1", namespace="ns", name="gw", node="n1")
    origin = make_origin(settings)
    assert isinstance(origin, CdsOrigin)
    assert origin.ws_url() == "ws://h:1/api/v1/configs/ns/gw?node=n1&watch=true"
    assert origin.ws_url(since=7) == "ws://h:1/api/v1/configs/ns/gw?node=n1&since=7&watch=true"


@pytest.mark.parametrize(
    ("env", "flag", "token", "file"),
    [
        ({"CDS_TOKEN": " t0k "}, None, "t0k", None),
        ({"CDS_TOKEN": "t0k", "CDS_TOKEN_FILE": "/env/token"}, None, None, "/env/token"),
        ({"CDS_TOKEN_FILE": "/env/token"}, "/flag/token", None, "/flag/token"),
        ({}, None, None, None),
    ],
)
def test_the_cds_token_is_read_once_into_the_settings(
    env: dict[str, str], flag: str | None, token: str | None, file: str | None
) -> None:
    settings = load_settings(
        env, config="ws://h:1", watch=True, turn_uri=None, ident="ns/gw", cds_token_file=flag
    )
    assert settings.environ == env
    assert "t0k" not in repr(settings)
    origin = make_origin(settings)
    assert isinstance(origin, CdsOrigin)
    source = origin._client._token
    assert (source.current() if file is None else None, source.file) == (
        token,
        None if file is None else Path(file),
    )


def test_the_parser_accepts_upstream_flags() -> None:
    argv = ["-w", "-c", "ws://cds:13478", "--id", "a/b", "-l", "all:DEBUG", "--udp-thread-num=16"]
    argv += ["--log-format", "json", "--force-ready-status", "--grace-period", "30"]
    args = build_parser().parse_args(argv)
    assert (args.watch, args.config, args.id, args.log) == (
        True,
        "ws://cds:13478",
        "a/b",
        "all:DEBUG",
    )
    assert (args.udp_thread_num, args.log_format, args.force_ready_status) == (16, "json", True)
    assert args.grace_period == 30.0
    positional = build_parser().parse_args(["turn://u:p@127.0.0.1:3478"])
    assert positional.uri == "turn://u:p@127.0.0.1:3478"


def test_network_and_admin_timeouts_come_from_stunnerd_variables_and_reach_the_server() -> None:
    from stunnerd.net.tuning import ServerTuning

    env = {
        "STUNNERD_UDP_GSO": "0",
        "STUNNERD_FASTPATH": "0",
        "STUNNERD_CLIENT_IDLE_TIMEOUT_S": "7.5",
        "STUNNERD_SOCKET_CLOSE_TIMEOUT_S": "0.5",
        "STUNNERD_STREAM_CLOSE_TIMEOUT_S": "3",
        "STUNNERD_ADMIN_REQUEST_TIMEOUT_S": "4",
        "STUNNERD_DNS_REFRESH_S": "1",
        "STUNNERD_DNS_TIMEOUT_S": "2",
        "STUNNERD_MAX_TCP_CONNECTIONS_PER_ALLOCATION": "8",
    }
    settings = load_settings(env, config=None, watch=False, turn_uri=None, ident="a/b")
    assert settings.admin.request_timeout_s == 4.0
    assert settings.tuning == ServerTuning(
        udp_gso=False,
        fastpath=False,
        dns_refresh_s=1.0,
        dns_timeout_s=2.0,
        client_idle_timeout_s=7.5,
        socket_close_timeout_s=0.5,
        stream_close_timeout_s=3.0,
        max_tcp_connections_per_allocation=8,
    )
    defaults = load_settings({}, config=None, watch=False, turn_uri=None, ident="a/b")
    assert defaults.tuning == ServerTuning()
    assert defaults.admin.request_timeout_s == 5.0


@pytest.mark.parametrize(
    "name",
    [
        "STUNNERD_CLIENT_IDLE_TIMEOUT_S",
        "STUNNERD_SOCKET_CLOSE_TIMEOUT_S",
        "STUNNERD_STREAM_CLOSE_TIMEOUT_S",
        "STUNNERD_ADMIN_REQUEST_TIMEOUT_S",
    ],
)
def test_a_timeout_that_is_not_positive_is_refused(name: str) -> None:
    field = name.removeprefix("STUNNERD_").lower()
    with pytest.raises(ValueError, match=field):
        load_settings({name: "0"}, config=None, watch=False, turn_uri=None, ident="a/b")


def test_a_worker_process_gets_the_supervisors_tuning_limits_and_log_format() -> None:
    from stunnerd.net.guard import ClientLimits, ConnectionLimits
    from stunnerd.net.tuning import ServerTuning
    from stunnerd.worker_main import build_parser
    from stunnerd.workers.pool import Worker

    tuning = ServerTuning(udp_gso=False, client_idle_timeout_s=7.5, socket_close_timeout_s=0.25)
    limits = ClientLimits(connection=ConnectionLimits(max_per_source=3))
    worker = Worker(2, "127.0.0.1", None, log_format="json", tuning=tuning, limits=limits)
    argv = worker._argv
    assert argv[1:3] == ["-m", "stunnerd.worker_main"]
    args = build_parser().parse_args(argv[3:])
    assert (args.index, args.bind, args.log_format) == (2, "127.0.0.1", "json")
    assert ServerTuning.from_json(args.tuning) == tuning
    assert ClientLimits.from_json(args.limits) == limits


@pytest.mark.parametrize(("value", "journal"), [(None, True), ("false", False), ("true", True)])
def test_the_worker_journal_is_on_unless_the_environment_turns_it_off(
    value: str | None, journal: bool
) -> None:
    env = {} if value is None else {"STUNNERD_WORKER_JOURNAL": value}
    assert env_settings(env).worker_journal is journal


def test_a_worker_journal_that_is_not_a_boolean_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="worker_journal"):
        env_settings({"STUNNERD_WORKER_JOURNAL": "sometimes"})


def env_settings(env: dict[str, str]) -> Any:
    """The settings of a stunnerd started with `env` and no flag."""
    return load_settings(env, config=None, watch=False, turn_uri=None, ident="a/b")


def test_relay_addresses_come_from_the_environment_as_a_comma_separated_list() -> None:
    settings = env_settings({"STUNNERD_RELAY_ADDRESSES": "10.0.0.5, fd00::5"})
    assert settings.relay_address_list() == ("10.0.0.5", "fd00::5")
    with pytest.raises(ValueError, match="relay address 'pod' is not an IP address"):
        env_settings({"STUNNERD_RELAY_ADDRESSES": "10.0.0.5,pod"})


def test_a_listener_advertises_the_first_relay_address_of_the_other_family() -> None:
    from stunnerd.net.server import other_relay_address

    extra = ("10.0.0.5", "fd00::5", "fd00::6")
    assert other_relay_address("10.0.0.5", extra) == "fd00::5"
    assert other_relay_address("fd00::5", extra) == "10.0.0.5"
    assert other_relay_address("127.0.0.1", ("10.0.0.5",)) == ""


def _environment_reads(path: Path) -> list[int]:
    """Lines of `path` that touch `os.environ`/`os.getenv` or import them from os."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.Attribute)
            and node.attr in ("environ", "environb", "getenv")
            and isinstance(node.value, ast.Name)
            and node.value.id == "os"
        ) or (
            isinstance(node, ast.ImportFrom)
            and node.module == "os"
            and any(alias.name in ("environ", "environb", "getenv") for alias in node.names)
        ):
            lines.append(node.lineno)
    return lines


def test_only_the_settings_module_reads_the_environment() -> None:
    root = Path(stunnerd.__file__).parent
    reads = {str(path.relative_to(root)): _environment_reads(path) for path in root.rglob("*.py")}
    assert {name: lines for name, lines in reads.items() if lines}.keys() == {"settings.py"}


GROUPS: dict[str, Group[Any]] = {
    "tuning": TUNING,
    "limits": LIMITS,
    "quota": QUOTA,
    "admin": ADMIN,
    "worker_timeouts": WORKER_TIMEOUTS,
}


def _load(env: dict[str, str]) -> StunnerdSettings:
    return load_settings(env, config=None, watch=False, turn_uri=None, ident="a/b")


def _other_value(default: Any) -> Any:
    """A valid value that is not the default, as the environment would spell it."""
    if default is None:
        return "1234"
    if isinstance(default, bool):
        return "0" if default else "1"
    if isinstance(default, str):
        return "redis://h:6379/0"
    return str(default + 1)


def test_each_group_field_has_a_variable_of_its_own() -> None:
    names = [name for group in GROUPS.values() for name in group.settings()]
    assert len(names) == len(set(names))
    assert not set(names) & {f.name for f in dataclasses.fields(DaemonSettings)}


@pytest.mark.parametrize(
    ("attr", "setting"),
    [(attr, name) for attr, group in GROUPS.items() for name in group.settings()],
)
def test_every_group_field_is_read_from_its_variable(attr: str, setting: str) -> None:
    _, default = GROUPS[attr].settings()[setting]
    base = {"STUNNERD_QUOTA_REDIS_URL": "redis://base:6379/0"} if attr == "quota" else {}
    env = {**base, f"STUNNERD_{setting.upper()}": _other_value(default)}
    built = getattr(_load(env), attr)
    assert built != getattr(_load(base), attr)
