"""stunnerd's settings: built once in `main` from the command line and the environment.

Flags win over the environment. Variables with the `STUNNERD_` prefix set the field of the same
name (`STUNNERD_BIND_HOST`, `STUNNERD_HEALTH_PORT`, `STUNNERD_UDP_GSO`, `STUNNERD_GRACE_PERIOD_S`,
...); the upstream variables keep their names: `STUNNER_CONFIG_ORIGIN` (the origin when `-c` is
not given), `STUNNER_NAMESPACE`/`STUNNER_NAME` (the identity toward the CDS when `--id` is not
given) and `STUNNER_NODENAME`. Every duration is in seconds and its name ends in `_s`. Nothing
below `stunnerd.app` reads the environment: the parts that need a setting get it passed in.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, EnvSettingsSource, SettingsConfigDict
from pydantic_settings.sources.utils import parse_env_vars

from stunner_common.config import DEFAULT_HEALTHCHECK_ENDPOINT
from stunner_common.probe_http import REQUEST_HEAD_TIMEOUT_S
from stunnerd.net.guard import (
    DEFAULT_FIRST_MESSAGE_TIMEOUT_S,
    DEFAULT_HANDSHAKE_TIMEOUT_S,
    DEFAULT_MAX_PER_SOURCE,
    DEFAULT_PREAUTH_MIN_BYTES_PER_S,
    DEFAULT_PREAUTH_WINDOW_S,
    ClientLimits,
    ConnectionLimits,
)
from stunnerd.net.tuning import (
    CLIENT_IDLE_TIMEOUT_S,
    DNS_REFRESH_S,
    DNS_TIMEOUT_S,
    SOCKET_CLOSE_TIMEOUT_S,
    STREAM_CLOSE_TIMEOUT_S,
    ServerTuning,
)
from stunnerd.origin.base import DEFAULT_ORIGIN, resolve_id
from stunnerd.quota import QuotaSettings
from stunnerd.turn.guard import (
    DEFAULT_CHALLENGE_BURST,
    DEFAULT_CHALLENGE_RATE_PER_S,
    DEFAULT_MAX_ATTRIBUTES,
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_MAX_UDP_DATAGRAM_BYTES,
    RequestLimits,
)
from stunnerd.turn.tcp_connections import MAX_CONNECTIONS_PER_ALLOCATION

DEFAULT_GRACE_PERIOD_S = 3600.0
DEFAULT_SIGINT_GRACE_PERIOD_S = 5.0


class StunnerdSettings(BaseSettings):
    """Everything `stunnerd.app.run` needs."""

    model_config = SettingsConfigDict(
        env_prefix="STUNNERD_", frozen=True, extra="forbid", env_ignore_empty=True
    )

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
    quota_redis_url: str = ""
    """Count `admin.user_quota` across replicas in this Redis (`redis://user:pass@host:port/0`);
    empty: each process counts its own allocations, as upstream."""
    quota_replicas: int = Field(1, ge=1)
    """Replicas sharing the Gateway: without Redis each admits `user_quota // this` per user."""
    quota_redis_timeout_s: float = Field(0.5, gt=0)
    quota_retry_s: float = Field(5.0, gt=0)
    """After Redis failed, how long each replica stays on its share before trying it again."""
    quota_lease_s: float = Field(0.0, ge=0)
    """0: a quota lease lasts as long as its allocation; else this long, renewed in background."""
    quota_grace_s: float = Field(2.0, ge=0)
    """Added to every lease, for the time between Redis' clock and the allocation's."""
    udp_gso: bool = True
    """Batch datagrams to one destination into one `sendmsg` with UDP_SEGMENT, where supported."""
    fastpath: bool = True
    """Relay established channels of TURN-UDP listeners in C (`stunnerd._fastpath`), if built."""
    file_poll_interval_s: float = Field(0.2, gt=0)
    bootstrap_health_endpoint: str = DEFAULT_HEALTHCHECK_ENDPOINT
    """Where /live answers in watch mode before the first config names an endpoint."""
    health_port: int | None = Field(None, ge=0, le=65535)
    """Serve health checks on this port whatever the config says (several on one host)."""
    metrics_port: int | None = Field(None, ge=0, le=65535)
    """Serve metrics on this port whatever the config says, when the config enables them."""
    dns_refresh_s: float = Field(DNS_REFRESH_S, gt=0)
    """How often STRICT_DNS cluster names are resolved again."""
    dns_timeout_s: float = Field(DNS_TIMEOUT_S, gt=0)
    client_idle_timeout_s: float = Field(CLIENT_IDLE_TIMEOUT_S, gt=0)
    """A TCP/TLS connection or DTLS session without an allocation, silent this long, is closed."""
    socket_close_timeout_s: float = Field(SOCKET_CLOSE_TIMEOUT_S, gt=0)
    """How long closing a UDP/DTLS listener waits for the kernel to release its port."""
    stream_close_timeout_s: float = Field(STREAM_CLOSE_TIMEOUT_S, gt=0)
    """How long closing a TCP/TLS listener waits for its server socket to close."""
    max_tcp_connections_per_allocation: int = Field(MAX_CONNECTIONS_PER_ALLOCATION, ge=1)
    """Peer connections one TCP allocation (RFC 6062) may hold; past it Connect gets 508."""
    admin_request_timeout_s: float = Field(REQUEST_HEAD_TIMEOUT_S, gt=0)
    """How long the health and metrics servers wait for a request head (and for a reply to go)."""
    stats_refresh_timeout_s: float = Field(2.0, gt=0)
    """How long a scrape waits for fresh counters (from the workers) before serving the last."""
    drain_check_interval_s: float = Field(0.2, gt=0)
    worker_request_timeout_s: float = Field(30.0, gt=0)
    worker_stats_timeout_s: float = Field(2.0, gt=0)
    worker_stop_timeout_s: float = Field(10.0, gt=0)
    worker_restart_delay_s: float = Field(0.5, ge=0)
    # What a client without credentials may cost (stunnerd README, "Hostile input").
    max_stun_message_bytes: int = Field(DEFAULT_MAX_MESSAGE_BYTES, ge=548, le=65555)
    """A STUN message larger than this is dropped unread (ChannelData is not limited)."""
    max_udp_datagram_bytes: int = Field(DEFAULT_MAX_UDP_DATAGRAM_BYTES, ge=1500, le=65536)
    """A TURN-UDP datagram longer than this (ChannelData included) is dropped, read only in part."""
    max_stun_attributes: int = Field(DEFAULT_MAX_ATTRIBUTES, ge=8)
    """A request with more attributes gets a 400 without being decoded."""
    challenge_rate_per_s: float = Field(DEFAULT_CHALLENGE_RATE_PER_S, ge=0)
    """401/438 answers per source IP and second (0: unlimited); over it, requests are dropped."""
    challenge_burst: int = Field(DEFAULT_CHALLENGE_BURST, ge=1)
    max_connections_per_source: int = Field(DEFAULT_MAX_PER_SOURCE, ge=0)
    """TCP/TLS connections and DTLS sessions per source IP and listener (0: unlimited)."""
    handshake_timeout_s: float = Field(DEFAULT_HANDSHAKE_TIMEOUT_S, gt=0)
    """A TLS or DTLS handshake must finish within this."""
    first_message_timeout_s: float = Field(DEFAULT_FIRST_MESSAGE_TIMEOUT_S, gt=0)
    """A new TCP/TLS/DTLS client must send a complete message within this."""
    preauth_min_bytes_per_s: float = Field(DEFAULT_PREAUTH_MIN_BYTES_PER_S, ge=0)
    """Until it holds an allocation, a connection sending less than this on average is closed."""
    preauth_window_s: float = Field(DEFAULT_PREAUTH_WINDOW_S, gt=0)

    def server_tuning(self) -> ServerTuning:
        """The network settings every `TurnServer` of this process (or its workers) runs with."""
        return ServerTuning(
            udp_gso=self.udp_gso,
            fastpath=self.fastpath,
            dns_refresh_s=self.dns_refresh_s,
            dns_timeout_s=self.dns_timeout_s,
            client_idle_timeout_s=self.client_idle_timeout_s,
            socket_close_timeout_s=self.socket_close_timeout_s,
            stream_close_timeout_s=self.stream_close_timeout_s,
            max_tcp_connections_per_allocation=self.max_tcp_connections_per_allocation,
        )

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

    def quota(self) -> QuotaSettings | None:
        if not self.quota_redis_url:
            return None
        return QuotaSettings(
            self.quota_redis_url,
            replicas=self.quota_replicas,
            timeout_s=self.quota_redis_timeout_s,
            retry_s=self.quota_retry_s,
            lease_s=self.quota_lease_s,
            grace_s=self.quota_grace_s,
        )

    def relay_address_list(self) -> tuple[str, ...]:
        return relay_address_list(self.relay_addresses)

    def client_limits(self) -> ClientLimits:
        return ClientLimits(
            RequestLimits(
                max_message_bytes=self.max_stun_message_bytes,
                max_attributes=self.max_stun_attributes,
                max_udp_datagram_bytes=self.max_udp_datagram_bytes,
                challenge_rate_per_s=self.challenge_rate_per_s,
                challenge_burst=self.challenge_burst,
            ),
            ConnectionLimits(
                max_per_source=self.max_connections_per_source,
                handshake_timeout_s=self.handshake_timeout_s,
                first_message_timeout_s=self.first_message_timeout_s,
                preauth_min_bytes_per_s=self.preauth_min_bytes_per_s,
                preauth_window_s=self.preauth_window_s,
            ),
        )


def _ip_or_empty(text: str) -> str:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return ""
    return text


def relay_address_list(text: str) -> tuple[str, ...]:
    return tuple(ip.strip() for ip in text.split(",") if ip.strip())


class _MappingEnvSource(EnvSettingsSource):
    """The `STUNNERD_*` variables of a given mapping (the process environment, or a test's)."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self._env = env
        super().__init__(StunnerdSettings)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return parse_env_vars(
            self._env, self.case_sensitive, self.env_ignore_empty, self.env_parse_none_str
        )


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
) -> StunnerdSettings:
    """Flags (None: not given) over `env` over the defaults; raises ValueError or
    `ConfigOriginError` (a bad `--id`) with a message for the user."""
    namespace, name = resolve_id(ident, env)
    values: dict[str, Any] = dict(_MappingEnvSource(env)())
    values.update(
        origin=config or env.get("STUNNER_CONFIG_ORIGIN") or DEFAULT_ORIGIN,
        watch=watch or values.get("watch", False),
        turn_uri=turn_uri,
        namespace=namespace,
        name=name,
        node=env.get("STUNNER_NODENAME") or None,
        node_address=values.get("node_address") or _ip_or_empty(env.get("STUNNER_ADDR", "")),
        force_ready=force_ready or values.get("force_ready", False),
    )
    flags = {
        "log_spec": log_spec,
        "log_format": log_format,
        "udp_thread_num": udp_thread_num,
        "grace_period_s": grace_period_s,
        "bind_host": bind_host,
        "cds_token_file": cds_token_file,
    }
    values.update({key: value for key, value in flags.items() if value is not None})
    return StunnerdSettings.model_validate(values)
