"""The running TURN server: a set of named listeners that can change while traffic flows.

`TurnServer` is what the command (and the reconciler) drives. It adds, removes and updates
listeners at runtime, swaps policies in place for live allocations, keeps STRICT_DNS names
resolved (every `ServerTuning.dns_refresh_s`, previous answer kept on failure), and reports
allocation counts per listener. Its public methods are the `ListenerTarget` that
`stunnerd.reconcile.listeners.ListenerReconciler` drives. One `UserUsage` is
shared by all listeners, so `admin.user_quota` counts a user's allocations process-wide.

What a config means for the listeners (policies, protected ranges, the quota's terms, the DNS
names and their resolution) is derived in `stunnerd.routing`. The cluster-wide quota, the kernel
offload, the C relay and the journal of allocations are handed in by whoever builds the server,
as the interfaces of `stunnerd.net.ports`, and so are allocations handed over by another process.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import secrets
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from stunner_common.config import ListenerConfig, StunnerConfig, load_tls_pair
from stunner_common.contracts.listener_address import (
    WILDCARD_ADDRESSES,
    NodeAddressMissingError,
    advertised_address,
)
from stunner_common.contracts.socket_key import SocketKey, listener_socket_key
from stunnerd.net.adopt import take_over
from stunnerd.net.batch import SendBatcher, gso_supported
from stunnerd.net.dtls import DtlsListener
from stunnerd.net.guard import ClientLimits
from stunnerd.net.listener import (
    Address,
    Listener,
    ListenerContext,
    ListenerOptions,
    ListenerSpec,
    Traffic,
    new_traffic,
)
from stunnerd.net.ports import (
    AllocationJournal,
    FastPathFactory,
    FastPathPort,
    HandedAllocation,
    HandedState,
    OffloadPort,
    QuotaPort,
)
from stunnerd.net.stream import StreamListener
from stunnerd.net.tasks import log_unexpected_exit
from stunnerd.net.tuning import ServerTuning
from stunnerd.net.udp import UdpListener
from stunnerd.protected import ProtectedRanges
from stunnerd.routing import DnsCache, dns_names, policies_for, protected_for, quota_terms, resolve
from stunnerd.turn.engine import Policies
from stunnerd.turn.policies import UserUsage

log = logging.getLogger(__name__)

PYTHON_RELAY = ServerTuning(fastpath=False)
"""A server built without tuning (tests, tools) relays in Python; stunnerd passes its settings."""


SocketSource = Callable[[SocketKey], socket.socket | None]
"""A listener's key → a pre-bound socket to serve, or None to bind one."""


class ListenerError(Exception):
    """A listener could not be built or started (bad certificate, port in use, ...)."""


def relay_address(listener: ListenerConfig, node_address: str = "") -> str:
    """The IP advertised in XOR-RELAYED-ADDRESS (`contracts.listener_address.advertised_address`),
    with a warning for a wildcard address: clients elsewhere will not reach its loopback relay.

    Raises `NodeAddressMissingError` (a ValueError) for the node-address placeholder without
    `node_address`.
    """
    advertised = advertised_address(listener.name, listener.address, node_address)
    if listener.address in WILDCARD_ADDRESSES:
        log.warning(
            "listener %s: address %r is a wildcard; advertising relay address %s, "
            "which only local clients can use (set address to the pod or host IP)",
            listener.name,
            listener.address,
            advertised,
        )
    return advertised


def other_relay_address(primary: str, extra: Sequence[str]) -> str:
    """The first of `extra` in the other family than `primary` ("" if none): the listener's
    relay address for REQUESTED-ADDRESS-FAMILY of that family and for dual allocations."""
    six = ":" in primary
    return next((ip for ip in extra if (":" in ip) != six), "")


def host_addresses() -> set[str]:
    """What this host's name resolves to (in a pod: the pod IP); empty when it does not."""
    try:
        name = socket.gethostname()
        # An ASCII name as bytes: a str is encoded with the "idna" codec, whose import loads
        # stringprep and unicodedata into the process for good.
        host: str | bytes = name.encode() if name.isascii() else name
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_UDP)
    except OSError:
        return set()
    return {str(info[4][0]) for info in infos}


@dataclass(frozen=True, slots=True)
class ServerOptions:
    """How a `TurnServer` runs its listeners: the settings it is built with, one frozen value.

    stunnerd builds it from `StunnerdSettings`; a worker process from its command line. Tests
    change one field with `dataclasses.replace`.
    """

    bind_host: str = "0.0.0.0"
    """Where listener and relay sockets bind (upstream: the wildcard address)."""
    relay_addresses: tuple[str, ...] = ()
    """Relay addresses beyond the listeners' own (`STUNNERD_RELAY_ADDRESSES`): each listener also
    advertises the first one of the other family (dual-stack, RFC 8656 §7.2)."""
    node_address: str = ""
    """This node's address, for listeners with the node-address placeholder."""
    reuse_port: bool = False
    """Listener sockets share their port with other worker processes (SO_REUSEPORT)."""
    tcp_relays: bool = True
    """RFC 6062 relays on TCP/TLS listeners; off in worker processes, where a client's data
    connection may reach another worker than its control connection."""
    tuning: ServerTuning = PYTHON_RELAY
    limits: ClientLimits = field(default_factory=ClientLimits)

    def listener_options(self) -> ListenerOptions:
        return ListenerOptions(self.limits, self.tuning, self.tcp_relays)


PYTHON_SERVER = ServerOptions()
"""The options of a server built without any (tests, tools): relays in Python, binds 0.0.0.0."""


class TurnServer:
    """Listeners by name, run as `options` say.

    `quota`, `offload`, `fastpath` and `journal` are what the process wired in
    (`stunnerd.net.ports`); without them the quota counts in this process, no channel is
    relayed in the kernel or in C, and allocations end with the process. `nonce_key` is shared
    with other processes (worker processes, a successor); `socket_source` hands over pre-bound
    listener sockets.
    """

    def __init__(
        self,
        options: ServerOptions = PYTHON_SERVER,
        *,
        offload: OffloadPort | None = None,
        quota: QuotaPort | None = None,
        fastpath: FastPathFactory | None = None,
        journal: AllocationJournal | None = None,
        nonce_key: bytes | None = None,
        socket_source: SocketSource | None = None,
    ) -> None:
        self.options = options
        self.bind_host = options.bind_host
        # Where TURN-UDP allocations are journaled (a worker's supervisor), and allocations
        # handed over by another process, by listener, until that listener starts (`net.adopt`).
        self.journal = journal
        self.adoptions: dict[str, tuple[list[HandedAllocation], dict[Address, socket.socket]]] = {}
        self.node_address = options.node_address
        # The cluster-wide user quota (Redis leases); None: `user_quota` counts in this process.
        self.quota = quota
        self.relay_addresses = options.relay_addresses
        self.offload = offload  # the kernel fast path, for this process's TURN-UDP listeners
        self.limits = options.limits
        self._host_addresses = host_addresses()
        self.reuse_port = options.reuse_port
        # One key for every listener (and, in worker processes, every worker and incarnation):
        # a nonce one of them issued is honoured by all. Random when not shared.
        self.nonce_key = nonce_key if nonce_key is not None else secrets.token_bytes(32)
        # Pre-bound listener sockets (the supervisor's SO_REUSEPORT members), by kind/host/port.
        self.socket_source = socket_source
        self.tuning = tuning = options.tuning
        self.udp_gso = tuning.udp_gso and gso_supported()
        self.tcp_relays = options.tcp_relays
        self._listener_options = options.listener_options()
        # The C relay of established channels (TURN-UDP listeners), one per event loop, built
        # with the first such listener where `fastpath` was given and the tuning asks for it.
        self.fastpath = fastpath
        self._fastpath: FastPathPort | None = None
        self.dns_refresh_s = tuning.dns_refresh_s
        self.dns_timeout_s = tuning.dns_timeout_s
        self._batcher: SendBatcher | None = None
        self.usage = UserUsage()
        self.listeners: dict[str, Listener] = {}
        # Traffic counters by listener and by cluster name; kept here so that a restarted
        # listener keeps counting where it left off (Prometheus counters must not go back).
        self.listener_traffic: dict[str, Traffic] = {}
        self.cluster_traffic: dict[str, Traffic] = {}
        self.dns = DnsCache()
        self._dns_task: asyncio.Task[None] | None = None
        self._config: StunnerConfig | None = None

    # ---------------------------------------------------------------- queries

    def allocation_counts(self) -> dict[str, int]:
        return {name: lst.allocation_count for name, lst in self.listeners.items()}

    @property
    def allocation_count(self) -> int:
        return sum(lst.allocation_count for lst in self.listeners.values())

    def port_of(self, name: str) -> int:
        return self.listeners[name].bound_port

    def protected(self, config: StunnerConfig) -> ProtectedRanges:
        """Peer ranges a route must name explicitly, with this server's own addresses."""
        return protected_for(
            config,
            host_addresses=self._host_addresses,
            bind_host=self.bind_host,
            node_address=self.node_address,
            relay_addresses=self.relay_addresses,
        )

    # ---------------------------------------------------------------- ListenerTarget

    def check_listener(self, listener: ListenerConfig) -> None:
        try:
            spec = self._spec(listener)
            if spec.protocol == "TURN-DTLS" and spec.tls is not None:
                from stunnerd.net.dtls import dtls_context

                dtls_context(spec.tls)
            elif spec.protocol == "TURN-TLS" and spec.tls is not None:
                from stunnerd.net.tls import server_ssl_context

                server_ssl_context(spec.tls)
        except ListenerError:
            raise
        except Exception as exc:
            raise ListenerError(f"listener {listener.name}: {exc}") from exc

    def apply_policies(self, config: StunnerConfig) -> None:
        self._config = config
        self._configure_quota(config)
        self._swap_policies(config)
        self._ensure_dns(config)

    async def add_listener(self, listener: ListenerConfig, config: StunnerConfig) -> None:
        self._config = config
        self._configure_quota(config)
        await self.remove_listener(listener.name)
        spec = self._spec(listener)
        policies = policies_for(listener, config, self.dns, self.protected(config))
        running = self._build(spec, policies)
        if running.journaled:
            running.journal = self.journal
            handed = self.adoptions.pop(listener.name, None)
            if handed is not None:
                take_over(running, *handed)
        if self.socket_source is not None:
            key = self._socket_key(listener)
            running.inherited_socket = self.socket_source(key)
        try:
            await running.start()
        except OSError as exc:
            await running.close()
            raise ListenerError(
                f"listener {listener.name}: cannot bind {spec.protocol} port {spec.port}: {exc}"
            ) from exc
        self.listeners[listener.name] = running
        self._ensure_dns(config)
        log.info(
            "listener %s: %s on %s:%d (relay address %s%s)",
            spec.name,
            spec.protocol,
            spec.bind_host,
            running.bound_port,
            spec.relay_ip,
            f" and {spec.other_relay_ip}" if spec.other_relay_ip else "",
        )

    def adopt(self, state: HandedState, sockets: Sequence[socket.socket]) -> None:
        """Allocations another process made, with their relay sockets in the order the state
        names them: each listener carries its own on when it starts (`net.adopt`)."""
        if len(sockets) != len(state.relay_addresses()):
            raise ValueError(f"{len(sockets)} relay sockets for {len(state.relay_addresses())}")
        relays = iter(sockets)
        for lst in state.listeners:
            records, by_relay = self.adoptions.setdefault(lst.name, ([], {}))
            for record in lst.allocations:
                records.append(record)
                by_relay[record.relay] = next(relays)
                if record.additional is not None:
                    by_relay[record.additional] = next(relays)

    async def remove_listener(self, name: str) -> None:
        running = self.listeners.pop(name, None)
        if running is not None:
            await running.close()
            log.info("listener %s: closed", name)

    def rotate_certificate(self, listener: ListenerConfig) -> bool:
        running = self.listeners.get(listener.name)
        if not isinstance(running, StreamListener | DtlsListener):
            return False
        pair = load_tls_pair(listener.cert, listener.key)
        return running.rotate_certificate(pair)

    async def close(self) -> None:
        if self._dns_task is not None:
            self._dns_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._dns_task
            self._dns_task = None
        for _records, unused in self.adoptions.values():
            for sock in unused.values():
                sock.close()
        self.adoptions.clear()
        for name in list(self.listeners):
            await self.remove_listener(name)
        if self.offload is not None:
            self.offload.close()
        if self._fastpath is not None:
            self._fastpath.close()
            self._fastpath = None
        if self.quota is not None:
            await self.quota.close()

    # ---------------------------------------------------------------- internals

    def _socket_key(self, listener: ListenerConfig) -> SocketKey:
        return listener_socket_key(
            listener.protocol, listener.address, listener.port, self.bind_host, self.node_address
        )

    def _spec(self, listener: ListenerConfig) -> ListenerSpec:
        tls = None
        if listener.protocol in ("TURN-TLS", "TURN-DTLS"):
            try:
                tls = load_tls_pair(listener.cert, listener.key)
            except Exception as exc:
                raise ListenerError(f"listener {listener.name}: {exc}") from exc
        try:
            relay_ip = relay_address(listener, self.node_address)
        except NodeAddressMissingError as exc:
            raise ListenerError(str(exc)) from None
        return ListenerSpec(
            name=listener.name,
            protocol=listener.protocol,
            relay_ip=relay_ip,
            other_relay_ip=other_relay_address(relay_ip, self.relay_addresses),
            port=listener.port,
            bind_host=self._socket_key(listener).host,
            tls=tls,
            reuse_port=self.reuse_port,
        )

    def _build(self, spec: ListenerSpec, policies: Policies) -> Listener:
        loop = asyncio.get_running_loop()
        kinds: dict[str, type[Listener]] = {
            "TURN-UDP": UdpListener,
            "TURN-TCP": StreamListener,
            "TURN-TLS": StreamListener,
            "TURN-DTLS": DtlsListener,
        }
        kind = kinds.get(spec.protocol)
        if kind is None:
            raise ListenerError(f"listener {spec.name}: unknown protocol {spec.protocol!r}")
        if self._batcher is None:
            self._batcher = SendBatcher(loop, enabled=self.udp_gso)
        extra: dict[str, Any] = {"offload": self.offload} if kind is UdpListener else {}
        context = ListenerContext(
            loop,
            self.usage,
            clock_offset_s=time.time() - loop.time(),
            batcher=self._batcher,
            cluster_traffic=self.cluster_traffic,
        )
        try:
            running = kind(
                spec,
                policies,
                self._listener_options,
                context,
                nonce_secret=hmac.digest(self.nonce_key, spec.name.encode(), hashlib.sha256),
                traffic=self.listener_traffic.setdefault(spec.name, new_traffic()),
                **extra,
            )
        except Exception as exc:
            raise ListenerError(f"listener {spec.name}: {exc}") from exc
        running.quota = self.quota
        if kind is UdpListener and self.tuning.fastpath and self.fastpath is not None:
            if self._fastpath is None:
                self._fastpath = self.fastpath(loop)
            running.fastpath = self._fastpath
        return running

    def fold_counters(self) -> None:
        """Bring the traffic counters, and the listeners' refusals by limit, up to date with
        what the C relay counted."""
        if self._fastpath is not None:
            self._fastpath.fold()
            for lst in self.listeners.values():
                lst.fold_refusals()

    @property
    def fastpath_stats(self) -> dict[str, int] | None:
        return self._fastpath.stats() if self._fastpath is not None else None

    def _ensure_dns(self, config: StunnerConfig) -> None:
        names = dns_names(config)
        self.dns.keep_only(names)
        if names and self._dns_task is None:
            self._dns_task = asyncio.get_running_loop().create_task(
                self._dns_loop(), name="stunnerd-dns-refresh"
            )
            self._dns_task.add_done_callback(log_unexpected_exit)

    async def _dns_loop(self) -> None:
        while True:
            config = self._config
            names = dns_names(config) if config is not None else set()
            changed = await resolve(self.dns, names, self.dns_timeout_s)
            if changed and config is not None:
                # policies read the shared cache: re-evaluate the routes of live allocations
                self._swap_policies(config)
            await asyncio.sleep(self.dns_refresh_s)

    def _configure_quota(self, config: StunnerConfig) -> None:
        if self.quota is not None:
            terms = quota_terms(config)
            self.quota.configure(terms.scope, terms.realm, terms.limit)

    def _swap_policies(self, config: StunnerConfig) -> None:
        by_name = {lst.name: lst for lst in config.listeners}
        for name, running in self.listeners.items():
            lst = by_name.get(name)
            if lst is not None:
                running.set_policies(policies_for(lst, config, self.dns, self.protected(config)))
