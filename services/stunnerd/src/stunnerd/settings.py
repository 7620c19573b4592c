"""stunnerd's settings: built once in `main` from the command line and the environment.

Flags win over the environment. Variables with the `STUNNERD_` prefix set the setting of the same
name (`STUNNERD_BIND_HOST`, `STUNNERD_HEALTH_PORT`, `STUNNERD_UDP_GSO`, `STUNNERD_GRACE_PERIOD_S`,
...); the upstream variables keep their names: `STUNNER_CONFIG_ORIGIN` (the origin when `-c` is
not given), `STUNNER_NAMESPACE`/`STUNNER_NAME` (the identity toward the CDS when `--id` is not
given), `STUNNER_NODENAME`, and `CDS_TOKEN_FILE`/`CDS_TOKEN` (the CDS token when
`--cds-token-file` is not given). Every duration is in seconds and its name ends in `_s`.

The settings of the process itself are declared below, in the settings style every process of
the project shares (`stunner_common.cli.ProcessSettings`). The groups it hands down whole are
declared once, in the layer that uses them, as frozen dataclasses whose fields carry their
default, their bounds (annotated) and their docstring: `ServerTuning`, `ClientLimits`,
`QuotaSettings`, `AdminSettings` and `WorkerTimeouts`. A `Group` only says which flat setting
each field is read from; the flat settings are validated in one pass (an error names the
variable's setting, e.g. `quota_replicas`), then the groups are built. The options objects of
the classes that take settings whole (`net.server.ServerOptions`, `origin.cds.CdsOptions`) are
built from them in `stunnerd.app` and `stunnerd.workers.child`. This module is the only
reader of the environment in stunnerd: everything below receives what it needs as arguments,
the environment itself included (`environ`, what the `$VAR`s of a config expand from).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar, get_type_hints

from pydantic import Field, create_model, field_validator
from pydantic_settings import EnvSettingsSource, SettingsConfigDict
from pydantic_settings.sources.utils import parse_env_vars

from stunner_common.config import DEFAULT_HEALTHCHECK_ENDPOINT
from stunner_common.contracts.listener_address import POD_ADDRESS_ENV
from stunner_common.process_settings import ProcessSettings
from stunnerd.admin.servers import AdminSettings
from stunnerd.drain import DRAIN_CHECK_INTERVAL_S
from stunnerd.net.guard import ClientLimits
from stunnerd.net.tuning import ServerTuning
from stunnerd.origin.base import DEFAULT_ORIGIN, resolve_id
from stunnerd.quota import QuotaSettings
from stunnerd.workers.worker import WorkerTimeouts

DEFAULT_GRACE_PERIOD_S = 3600.0
CDS_TOKEN_ENV = "CDS_TOKEN"  # upstream's names, as `stunner_common.io.cds.token` reads them
CDS_TOKEN_FILE_ENV = "CDS_TOKEN_FILE"
DEFAULT_SIGINT_GRACE_PERIOD_S = 5.0

G = TypeVar("G")


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
        """The group from validated flat `values`."""
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


class DaemonSettings(ProcessSettings):
    """The settings of the stunnerd process itself (the groups it hands down are apart), in the
    settings style every process shares (`stunner_common.cli.ProcessSettings`)."""

    model_config = SettingsConfigDict(env_prefix="STUNNERD_", extra="forbid", env_ignore_empty=True)

    origin: str = DEFAULT_ORIGIN
    watch: bool = False
    turn_uri: str | None = None
    namespace: str = "default"
    name: str = "stunnerd"
    node: str | None = None
    log_spec: str | None = None
    log_format: Literal["text", "json"] = "text"
    udp_thread_num: int = Field(0, ge=0)
    """Worker processes sharing each listener port with SO_REUSEPORT (0 or 1: this process)."""
    worker_journal: bool = True
    """With worker processes: each worker journals its TURN-UDP allocations to this process,
    so that they outlive a crashed worker and move with a handoff. False
    (`STUNNERD_WORKER_JOURNAL=false`): no journal and less CPU per allocation (docs/scale.md);
    a worker's crash, or a handoff, loses its allocations (their clients allocate again), as a
    crash of a single process does."""
    grace_period_s: float = Field(DEFAULT_GRACE_PERIOD_S, ge=0)
    sigint_grace_period_s: float = Field(DEFAULT_SIGINT_GRACE_PERIOD_S, ge=0)
    force_ready: bool = False
    listener_retry_min_s: float = Field(0.5, gt=0)
    """A listener left out for a reason that may pass (port in use, bind error) is tried again
    after this long, doubling up to `listener_retry_max_s` (jittered)."""
    listener_retry_max_s: float = Field(30.0, gt=0)
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
    file_poll_interval_s: float = Field(0.2, gt=0)
    bootstrap_health_endpoint: str = DEFAULT_HEALTHCHECK_ENDPOINT
    """Where /live answers in watch mode before the first config names an endpoint."""
    drain_check_interval_s: float = Field(DRAIN_CHECK_INTERVAL_S, gt=0)
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

    @field_validator("relay_addresses", mode="after")
    @classmethod
    def _relay_addresses(cls, value: str) -> str:
        for ip in relay_address_list(value):
            try:
                ipaddress.ip_address(ip)
            except ValueError:
                raise ValueError(f"relay address {ip!r} is not an IP address") from None
        return value

    @field_validator("node_address", mode="after")
    @classmethod
    def _node_address(cls, value: str) -> str:
        if value:
            try:
                ipaddress.ip_address(value)
            except ValueError:
                raise ValueError(f"node address {value!r} is not an IP address") from None
        return value


class StunnerdSettings(DaemonSettings):
    """Everything `stunnerd.app.run` needs: the process's settings and the groups it hands down."""

    tuning: ServerTuning = ServerTuning()
    """The network settings of every `TurnServer` of this process (or its workers)."""
    limits: ClientLimits = ClientLimits()
    """What bounds unauthenticated clients, at every listener."""
    quota: QuotaSettings | None = None
    """The cluster-wide user quota; None: each process counts its own allocations."""
    admin: AdminSettings = AdminSettings()
    """How the health and metrics servers listen."""
    worker_timeouts: WorkerTimeouts = WorkerTimeouts()
    """How long the supervisor waits on its worker processes (`--udp-thread-num`)."""
    cds_token_env_file: str | None = None
    """`CDS_TOKEN_FILE`: the CDS token's file when `cds_token_file` names none."""
    cds_token: str | None = Field(None, repr=False)
    """`CDS_TOKEN`: the CDS bearer token when no file names one (`-c k8s`: the chart's Secret's
    token, over `CDS_TOKEN_FILE` and `CDS_TOKEN`)."""

    def relay_address_list(self) -> tuple[str, ...]:
        return relay_address_list(self.relay_addresses)


_FlatSettings: type[DaemonSettings] = create_model(
    "StunnerdSettings",
    __base__=DaemonSettings,
    **{
        **TUNING.settings(),
        **LIMITS.settings(),
        **QUOTA.settings(),
        **ADMIN.settings(),
        **WORKER_TIMEOUTS.settings(),
    },
)
"""What the environment and the flags set: the process's settings and each group's, flat."""


def _from_flat(flat: DaemonSettings, **resolved: Any) -> StunnerdSettings:
    """The settings from the flat ones and those `load_settings` resolved itself."""
    values = flat.model_dump()
    quota = QUOTA.build(values)
    return StunnerdSettings.model_validate(
        {
            **resolved,
            **{name: values[name] for name in DaemonSettings.model_fields},
            "tuning": TUNING.build(values),
            "limits": LIMITS.build(values),
            "quota": quota if quota.redis_url else None,
            "admin": ADMIN.build(values),
            "worker_timeouts": WORKER_TIMEOUTS.build(values),
        }
    )


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


class _MappingEnvSource(EnvSettingsSource):
    """The `STUNNERD_*` variables of a given mapping (the process environment, or a test's)."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self._env = env
        super().__init__(_FlatSettings)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return parse_env_vars(
            self._env, self.case_sensitive, self.env_ignore_empty, self.env_parse_none_str
        )


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
    """Flags (None: not given) over `env` over the defaults; raises ValueError or
    `ConfigOriginError` (a bad `--id`) with a message for the user."""
    namespace, name = resolve_id(ident, env)
    values: dict[str, Any] = dict(_MappingEnvSource(env)())
    values.update(
        origin=config or env.get("STUNNER_CONFIG_ORIGIN") or DEFAULT_ORIGIN,
        watch=watch or values.get("watch", follows_by_default(env)),
        turn_uri=turn_uri,
        namespace=namespace,
        name=name,
        node=env.get("STUNNER_NODENAME") or None,
        node_address=values.get("node_address") or _ip_or_empty(env.get(POD_ADDRESS_ENV, "")),
        force_ready=force_ready or values.get("force_ready", False),
        handoff_idle=handoff_idle or values.get("handoff_idle", False),
    )
    flags = {
        "log_spec": log_spec,
        "log_format": log_format,
        "udp_thread_num": udp_thread_num,
        "grace_period_s": grace_period_s,
        "bind_host": bind_host,
        "cds_token_file": cds_token_file,
        "handoff_socket": handoff_socket,
    }
    values.update({key: value for key, value in flags.items() if value is not None})
    return _from_flat(
        _FlatSettings.model_validate(values),
        cds_token_env_file=env.get(CDS_TOKEN_FILE_ENV) or None,
        cds_token=env.get(CDS_TOKEN_ENV, "").strip() or None,
    ).read_from(env)


@dataclass(frozen=True, slots=True)
class WorkerEnvironment:
    """What a worker process reads from the environment its supervisor passed on."""

    quota_redis_url: str = ""
    """Never on the worker's command line: the URL may hold a password."""
    libbpf: str = ""


def worker_environment(env: Mapping[str, str] | None = None) -> WorkerEnvironment:
    values = _MappingEnvSource(os.environ if env is None else env)()
    return WorkerEnvironment(
        str(values.get("quota_redis_url") or ""), str(values.get("libbpf") or "")
    )
