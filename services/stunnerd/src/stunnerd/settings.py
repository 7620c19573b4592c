"""stunnerd's settings: built once in `main` from the command line and the environment.

Flags win over the environment. Variables with the `STUNNERD_` prefix set the setting of the same
name (`STUNNERD_BIND_HOST`, `STUNNERD_HEALTH_PORT`, `STUNNERD_UDP_GSO`, `STUNNERD_GRACE_PERIOD_S`,
...); the upstream variables keep their names: `STUNNER_CONFIG_ORIGIN` (the origin when `-c` is
not given), `STUNNER_NAMESPACE`/`STUNNER_NAME` (the identity toward the CDS when `--id` is not
given), `STUNNER_NODENAME`, and `CDS_TOKEN_FILE`/`CDS_TOKEN` (the CDS token when
`--cds-token-file` is not given). Every duration is in seconds and its name ends in `_s`.

The other processes read their settings with pydantic-settings
(`stunner_common.process_settings.ProcessSettings`); stunnerd reads its own into frozen
dataclasses, with a reader of its own, so that the dataplane never loads pydantic's machinery
(its idle memory: docs/scale.md, section 3). The conventions are theirs: variable names without
regard to case, empty variables as unset, booleans spelled as pydantic takes them
(true/false, 1/0, yes/no, on/off, t/f, y/n), an error as one line `setting: problem; ...` that
never shows the rejected value, and `environ`/`read_from`. The settings of the process itself
are `DaemonSettings`; the groups it hands down whole are declared once, in the layer that uses
them, as frozen dataclasses whose fields carry their default, their bounds (`stunnerd.bounds`)
and their docstring: `ServerTuning`, `ClientLimits`, `QuotaSettings`, `AdminSettings` and
`WorkerTimeouts`. A `Group` only says which flat setting each field is read from; the flat
settings are checked in one pass (an error names the setting, e.g. `quota_replicas`), then the
groups are built. The options objects of the classes that take settings whole
(`net.server.ServerOptions`, `origin.cds.CdsOptions`) are built from them in `stunnerd.app` and
`stunnerd.workers.child`. This module is the only reader of the environment in stunnerd:
everything below receives what it needs as arguments, the environment itself included
(`environ`, what the `$VAR`s of a config expand from).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType, UnionType
from typing import (
    Annotated,
    Any,
    Generic,
    Literal,
    Self,
    TypeVar,
    Union,
    get_args,
    get_origin,
    get_type_hints,
)

from stunner_common.config import DEFAULT_HEALTHCHECK_ENDPOINT
from stunner_common.contracts.listener_address import POD_ADDRESS_ENV
from stunnerd.admin.servers import AdminSettings
from stunnerd.bounds import Bound, Ge, Gt, Interval
from stunnerd.drain import DRAIN_CHECK_INTERVAL_S
from stunnerd.net.guard import ClientLimits
from stunnerd.net.tuning import ServerTuning
from stunnerd.origin.base import DEFAULT_ORIGIN, resolve_id
from stunnerd.quota import QuotaSettings
from stunnerd.workers.timeouts import WorkerTimeouts

ENV_PREFIX = "STUNNERD_"
DEFAULT_GRACE_PERIOD_S = 3600.0
CDS_TOKEN_ENV = "CDS_TOKEN"  # upstream's names, as `stunner_common.io.cds.token` reads them
CDS_TOKEN_FILE_ENV = "CDS_TOKEN_FILE"
DEFAULT_SIGINT_GRACE_PERIOD_S = 5.0

G = TypeVar("G")


class SettingsError(ValueError):
    """Settings that cannot be used, as one line: `setting: problem; setting: problem`."""


@dataclass(frozen=True, slots=True)
class Group(Generic[G]):
    """A frozen dataclass of a lower layer, read from flat settings: field `f` from the setting
    `prefix + f`, or `renamed[f]`. A field that is itself a dataclass is read the same way."""

    cls: type[G]
    prefix: str = ""
    renamed: Mapping[str, str] = field(default_factory=dict)

    def _fields(self) -> list[tuple[str, Any, Any]]:
        """(field name, annotation, default) of each field of `cls`."""
        hints = get_type_hints(self.cls, include_extras=True)
        return [
            (f.name, hints[f.name], _default(f))
            for f in dataclasses.fields(self.cls)  # type: ignore[arg-type]
        ]

    def _part(self, cls: Any) -> Group[Any]:
        return Group(cls, self.prefix, self.renamed)

    def setting(self, name: str) -> str:
        return self.renamed.get(name) or self.prefix + name

    def settings(self) -> dict[str, Any]:
        """The flat settings this group is read from: {setting: (annotation, default)}."""
        out: dict[str, Any] = {}
        for name, hint, default in self._fields():
            if dataclasses.is_dataclass(hint):
                out.update(self._part(hint).settings())
            else:
                out[self.setting(name)] = (hint, default)
        return out

    def build(self, values: Mapping[str, Any]) -> G:
        """The group from checked flat `values`."""
        kwargs = {
            name: self._part(hint).build(values)
            if dataclasses.is_dataclass(hint)
            else values[self.setting(name)]
            for name, hint, _ in self._fields()
        }
        return self.cls(**kwargs)


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is dataclasses.MISSING and f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


TUNING = Group(ServerTuning)
LIMITS = Group(
    ClientLimits,
    renamed={
        "max_message_bytes": "max_stun_message_bytes",
        "max_attributes": "max_stun_attributes",
        "max_per_source": "max_connections_per_source",
    },
)
QUOTA = Group(QuotaSettings, prefix="quota_", renamed={"timeout_s": "quota_redis_timeout_s"})
WORKER_TIMEOUTS = Group(
    WorkerTimeouts,
    renamed={
        "request_s": "worker_request_timeout_s",
        "stats_s": "worker_stats_timeout_s",
        "stop_s": "worker_stop_timeout_s",
        "restart_delay_s": "worker_restart_delay_s",
    },
)
ADMIN = Group(
    AdminSettings,
    renamed={
        "request_timeout_s": "admin_request_timeout_s",
        "refresh_timeout_s": "stats_refresh_timeout_s",
    },
)


def _process_environment() -> Mapping[str, str]:
    return dict(os.environ)


@dataclass(frozen=True, slots=True)
class DaemonSettings:
    """The settings of the stunnerd process itself (the groups it hands down are apart)."""

    origin: str = DEFAULT_ORIGIN
    watch: bool = False
    turn_uri: str | None = None
    namespace: str = "default"
    name: str = "stunnerd"
    node: str | None = None
    log_spec: str | None = None
    log_format: Literal["text", "json"] = "text"
    udp_thread_num: Annotated[int, Ge(0)] = 0
    """Worker processes sharing each listener port with SO_REUSEPORT (0 or 1: this process)."""
    worker_journal: bool = True
    """With worker processes: each worker journals its TURN-UDP allocations to this process,
    so that they outlive a crashed worker and move with a handoff. False
    (`STUNNERD_WORKER_JOURNAL=false`): no journal and less CPU per allocation (docs/scale.md);
    a worker's crash, or a handoff, loses its allocations (their clients allocate again), as a
    crash of a single process does."""
    grace_period_s: Annotated[float, Ge(0)] = DEFAULT_GRACE_PERIOD_S
    sigint_grace_period_s: Annotated[float, Ge(0)] = DEFAULT_SIGINT_GRACE_PERIOD_S
    force_ready: bool = False
    listener_retry_min_s: Annotated[float, Gt(0)] = 0.5
    """A listener left out for a reason that may pass (port in use, bind error) is tried again
    after this long, doubling up to `listener_retry_max_s` (jittered)."""
    listener_retry_max_s: Annotated[float, Gt(0)] = 30.0
    cds_token_file: str | None = None
    """Read the CDS bearer token from this file (re-read when it changes); else `CDS_TOKEN`."""
    bind_host: str = "0.0.0.0"
    """Where listener and relay sockets bind (upstream: the wildcard address)."""
    relay_addresses: str = ""
    """Comma-separated IPs (in a pod: `status.podIPs`). Each listener advertises its own address
    as its relay address and, from here, the first one of the other family: what IPv6 (or IPv4)
    REQUESTED-ADDRESS-FAMILY and dual allocations (ADDITIONAL-ADDRESS-FAMILY) get."""
    node_address: str = ""
    """The node's external address, for listeners whose address is the node-address placeholder
    (relay address discovery; normally the CDS fills it in). Empty: `STUNNER_ADDR` is used."""
    file_poll_interval_s: Annotated[float, Gt(0)] = 0.2
    bootstrap_health_endpoint: str = DEFAULT_HEALTHCHECK_ENDPOINT
    """Where /live answers in watch mode before the first config names an endpoint."""
    drain_check_interval_s: Annotated[float, Gt(0)] = DRAIN_CHECK_INTERVAL_S
    libbpf: str = ""
    """The libbpf shared library the kernel offload loads; empty: the system's `libbpf.so.1`."""
    offload_object: str = ""
    """The offload's BPF object file; empty: the one `make setup` builds in `stunnerd.offload`."""
    handoff_socket: str = ""
    """Hot handoff: a stunnerd started with the path of a running one's socket takes over its
    TURN-UDP sockets, allocations and admin listening sockets; every stunnerd listens there for
    its successor (SIGUSR2 starts one from the same command line). Empty: off."""
    handoff_idle: bool = False
    """After handing over, wait serving nothing until SIGTERM/SIGINT, then exit 0, instead of
    exiting at once (in a pod: the container does not end, so it is not restarted)."""


@dataclass(frozen=True, slots=True)
class StunnerdSettings(DaemonSettings):
    """Everything `stunnerd.app.run` needs: the process's settings and the groups it hands down.

    `dataclasses.replace` makes a copy with some settings changed (`-c k8s` sets the origin it
    found). Built directly, the settings are taken as given: `load_settings` checks them.
    """

    tuning: ServerTuning = field(default_factory=ServerTuning)
    """The network settings of every `TurnServer` of this process (or its workers)."""
    limits: ClientLimits = field(default_factory=ClientLimits)
    """What bounds unauthenticated clients, at every listener."""
    quota: QuotaSettings | None = None
    """The cluster-wide user quota; None: each process counts its own allocations."""
    admin: AdminSettings = field(default_factory=AdminSettings)
    """How the health and metrics servers listen."""
    worker_timeouts: WorkerTimeouts = field(default_factory=WorkerTimeouts)
    """How long the supervisor waits on its worker processes (`--udp-thread-num`)."""
    cds_token_env_file: str | None = None
    """`CDS_TOKEN_FILE`: the CDS token's file when `cds_token_file` names none."""
    cds_token: str | None = field(default=None, repr=False)
    """`CDS_TOKEN`: the CDS bearer token when no file names one (`-c k8s`: the chart's Secret's
    token, over `CDS_TOKEN_FILE` and `CDS_TOKEN`)."""
    environ: Mapping[str, str] = field(
        default_factory=_process_environment, repr=False, compare=False
    )
    """The environment these settings were read from (read-only), for what is looked up by name
    further down: the `$VAR`s of a config, the CDS address and the kubeconfig of `-c k8s`."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "environ", MappingProxyType(dict(self.environ)))

    def read_from(self, env: Mapping[str, str]) -> Self:
        """A copy of these settings whose `environ` is `env`, the mapping they were read from."""
        return dataclasses.replace(self, environ=env)

    def relay_address_list(self) -> tuple[str, ...]:
        return relay_address_list(self.relay_addresses)


_BOOLEANS = {
    **dict.fromkeys(("1", "on", "t", "true", "y", "yes"), True),
    **dict.fromkeys(("0", "off", "f", "false", "n", "no"), False),
}
_INTEGER = re.compile(r"[+-]?[0-9]+(?:_[0-9]+)*(?:\.0+)?")
_PROBLEMS = {
    bool: "Input should be a valid boolean, unable to interpret input",
    int: "Input should be a valid integer, unable to parse string as an integer",
    float: "Input should be a valid number, unable to parse string as a number",
    str: "Input should be a valid string",
}


@dataclass(frozen=True, slots=True)
class Setting:
    """How one flat setting is read: its type (bool, int, float or str), its choices (a
    `Literal`), its bounds and its default. A text (a variable) is parsed as pydantic parses it;
    a value of the type (a flag) is taken as it is; then the bounds are checked."""

    kind: type
    default: Any
    choices: tuple[str, ...] = ()
    bounds: tuple[Bound, ...] = ()

    @classmethod
    def of(cls, hint: Any, default: Any) -> Setting:
        """The setting a field annotated `hint` (`T`, `T | None`, `Annotated[T, bound, ...]`,
        `Literal[...]`) declares; TypeError for what this reader does not know."""
        if get_origin(hint) in (Union, UnionType):
            given = [arg for arg in get_args(hint) if arg is not type(None)]
            if len(given) != 1:
                raise TypeError(f"unsupported setting type {hint!r}")
            hint = given[0]
        bounds: list[Bound] = []
        if get_origin(hint) is Annotated:
            hint, *markers = get_args(hint)
            bounds = list(_bounds(markers))
        if get_origin(hint) is Literal:
            return cls(str, default, tuple(str(choice) for choice in get_args(hint)))
        if hint not in _PROBLEMS:
            raise TypeError(f"unsupported setting type {hint!r}")
        return cls(hint, default, (), tuple(bounds))

    def value(self, given: object) -> Any:
        """`given` as this setting's value; ValueError with the problem (never the value)."""
        value = self._typed(given)
        if self.choices and value not in self.choices:
            raise ValueError(f"Input should be {_alternatives(self.choices)}")
        for bound in self.bounds:
            if (problem := bound.problem(value)) is not None:
                raise ValueError(problem)
        return value

    def _typed(self, given: object) -> Any:
        kind = self.kind
        if isinstance(given, str) and kind is not str:
            text = given.strip()
            if kind is bool and given.lower() in _BOOLEANS:
                return _BOOLEANS[given.lower()]
            if kind is int and _INTEGER.fullmatch(text):
                return int(text.partition(".")[0])
            if kind is float and text.isascii():
                try:
                    return float(text)
                except ValueError:
                    pass
        elif kind is float and isinstance(given, int | float) and not isinstance(given, bool):
            return float(given)
        elif isinstance(given, kind) and (kind is bool or not isinstance(given, bool)):
            return given
        raise ValueError(_PROBLEMS[kind])


def _bounds(markers: list[Any]) -> Iterator[Bound]:
    for marker in markers:
        if isinstance(marker, Interval):
            yield from marker.bounds()
        elif isinstance(marker, Bound):
            yield marker
        else:
            raise TypeError(f"unsupported setting annotation {marker!r}")


def _alternatives(choices: tuple[str, ...]) -> str:
    quoted = [repr(choice) for choice in choices]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


def _flat_settings() -> dict[str, Setting]:
    hints = get_type_hints(DaemonSettings, include_extras=True)
    flat = {
        f.name: Setting.of(hints[f.name], f.default) for f in dataclasses.fields(DaemonSettings)
    }
    for group in (TUNING, LIMITS, QUOTA, ADMIN, WORKER_TIMEOUTS):
        flat.update({name: Setting.of(*spec) for name, spec in group.settings().items()})
    return flat


SETTINGS: Mapping[str, Setting] = MappingProxyType(_flat_settings())
"""What the environment and the flags set: the process's settings and each group's, flat, in
the order their errors are told."""


def _check_ips(what: str, ips: Iterable[str]) -> None:
    for ip in ips:
        try:
            ipaddress.ip_address(ip)
        except ValueError:
            raise ValueError(f"{what} {ip!r} is not an IP address") from None


_CHECKS: Mapping[str, Callable[[str], None]] = {
    "relay_addresses": lambda text: _check_ips("relay address", relay_address_list(text)),
    "node_address": lambda text: _check_ips("node address", [text] if text else []),
}


def _checked(given: Mapping[str, object]) -> dict[str, Any]:
    """Every flat setting: from `given` (variables' text, flags' values), else its default;
    `SettingsError` naming each setting that is wrong."""
    values: dict[str, Any] = {}
    problems: list[str] = []
    for name, setting in SETTINGS.items():
        if name not in given:
            values[name] = setting.default
            continue
        try:
            values[name] = setting.value(given[name])
            if name in _CHECKS:
                _CHECKS[name](values[name])
        except ValueError as exc:
            problems.append(f"{name}: {exc}")
    if problems:
        raise SettingsError("; ".join(problems))
    return values


def _variables(env: Mapping[str, str]) -> dict[str, str]:
    """The text of each setting a `STUNNERD_*` variable of `env` sets, as pydantic-settings reads
    them: names without regard to case, empty values as unset; other variables are ignored."""
    folded = {key.lower(): value for key, value in env.items() if value != ""}
    prefix = ENV_PREFIX.lower()
    return {name: folded[prefix + name] for name in SETTINGS if prefix + name in folded}


def _ip_or_empty(text: str) -> str:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return ""
    return text


def relay_address_list(text: str) -> tuple[str, ...]:
    return tuple(ip.strip() for ip in text.split(",") if ip.strip())


def environment() -> Mapping[str, str]:
    """The process's environment: read here, once, and passed down from `stunnerd.cli`."""
    return os.environ


def follows_by_default(env: Mapping[str, str]) -> bool:
    """Whether stunnerd follows its origin without `-w`: in a pod (the kubelet sets
    `KUBERNETES_SERVICE_HOST` in every container) it does.

    A pod rendered from a Dataplane without `args` must never freeze on its first config: every
    later edit (a revoked route included) would be silently ignored. `STUNNERD_WATCH=false` keeps
    the one-shot load of an `http://` origin; outside a pod, upstream's rule holds (one GET
    without `-w`).
    """
    return bool(env.get("KUBERNETES_SERVICE_HOST"))


def load_settings(
    env: Mapping[str, str],
    *,
    config: str | None,
    watch: bool,
    turn_uri: str | None,
    ident: str | None,
    log_spec: str | None = None,
    log_format: str | None = None,
    udp_thread_num: int | None = None,
    grace_period_s: float | None = None,
    force_ready: bool = False,
    bind_host: str | None = None,
    cds_token_file: str | None = None,
    handoff_socket: str | None = None,
    handoff_idle: bool = False,
) -> StunnerdSettings:
    """Flags (None: not given) over `env` over the defaults; raises `SettingsError` (a
    ValueError) or `ConfigOriginError` (a bad `--id`) with a message for the user."""
    namespace, name = resolve_id(ident, env)
    given: dict[str, object] = dict(_variables(env))
    given.update(
        origin=config or env.get("STUNNER_CONFIG_ORIGIN") or DEFAULT_ORIGIN,
        watch=watch or given.get("watch", follows_by_default(env)),
        namespace=namespace,
        name=name,
        node_address=given.get("node_address") or _ip_or_empty(env.get(POD_ADDRESS_ENV, "")),
        force_ready=force_ready or given.get("force_ready", False),
        handoff_idle=handoff_idle or given.get("handoff_idle", False),
    )
    for key in ("turn_uri", "node"):
        given.pop(key, None)
    flags = {
        "turn_uri": turn_uri,
        "node": env.get("STUNNER_NODENAME") or None,
        "log_spec": log_spec,
        "log_format": log_format,
        "udp_thread_num": udp_thread_num,
        "grace_period_s": grace_period_s,
        "bind_host": bind_host,
        "cds_token_file": cds_token_file,
        "handoff_socket": handoff_socket,
    }
    given.update({key: value for key, value in flags.items() if value is not None})
    values = _checked(given)
    quota = QUOTA.build(values)
    return StunnerdSettings(
        **{f.name: values[f.name] for f in dataclasses.fields(DaemonSettings)},
        tuning=TUNING.build(values),
        limits=LIMITS.build(values),
        quota=quota if quota.redis_url else None,
        admin=ADMIN.build(values),
        worker_timeouts=WORKER_TIMEOUTS.build(values),
        cds_token_env_file=env.get(CDS_TOKEN_FILE_ENV) or None,
        cds_token=env.get(CDS_TOKEN_ENV, "").strip() or None,
        environ=env,
    )


@dataclass(frozen=True, slots=True)
class WorkerEnvironment:
    """What a worker process reads from the environment its supervisor passed on."""

    quota_redis_url: str = ""
    """Never on the worker's command line: the URL may hold a password."""
    libbpf: str = ""


def worker_environment(env: Mapping[str, str] | None = None) -> WorkerEnvironment:
    variables = _variables(os.environ if env is None else env)
    return WorkerEnvironment(variables.get("quota_redis_url", ""), variables.get("libbpf", ""))
