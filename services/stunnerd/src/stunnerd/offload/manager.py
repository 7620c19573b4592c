"""The process-wide offload engine: which channels the kernel relays, and what it counted.

The sans-IO engine stays the authority. A TURN-UDP listener reports every channel route the
engine installs or removes (`channel_added` / `channel_removed`, from the `ChannelRouteAdded` /
`ChannelRouteRemoved` effects, through its `offload.table.OffloadRoutes`); this object mirrors
exactly that set into the BPF maps, so the kernel relays only what the engine would relay and
forgets a channel the moment the engine does (expiry, Refresh 0, a reconfig that no longer admits
the peer, a listener restart).

It always keeps the wanted set, even with the engine `None`: switching `admin.offload_engine`
live (None → TC → None) attaches or detaches the program and installs or drops every live
channel at once, while the user-space routes keep working underneath, so no packet is lost.

Never worse than off: if loading or attaching fails, one warning names the cause, `/status`
shows `{"engine": ..., "active": false, "reason": ...}` and user space relays everything.

`poll()` (every `POLL_INTERVAL_S`, and before every status read) adds the kernel's per-entry
packet and byte counts to the same traffic counters the user-space relay feeds, so the
`stunner_listener_*` and `stunner_cluster_*` metrics cover both paths. Every `PATH_REFRESH_S` it
also works out each channel's way out again and rewrites the entries whose way changed: a
neighbour resolved since the channel was installed (XDP can then relay it, TC skips the
neighbour lookup), another MAC address behind the same IP address, another route.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from stunnerd.offload.table import OffloadRoutes

if TYPE_CHECKING:
    from stunnerd.offload.datapath import ChannelEntries, Counters, Datapath

log = logging.getLogger(__name__)

Address = tuple[str, int]
Traffic = list[int]  # [rx packets, rx bytes, tx packets, tx bytes], as net.listener keeps them
ENGINES = ("None", "TC", "XDP", "Auto")
POLL_INTERVAL_S = 2.0
PATH_REFRESH_S = 30.0
CHANNEL_HEADER_BYTES = 4
ChannelId = tuple[str, Address, int]  # listener name, client address, channel number


@dataclass(slots=True)
class _Channel:
    peer: Address
    listener_addr: Address
    relay_addr: Address
    listener_traffic: Traffic
    cluster_traffic: Traffic
    entries: ChannelEntries | None = None
    seen: list[int] = field(default_factory=lambda: [0, 0, 0, 0])  # to_peer p/b, to_client p/b

    def same_path(self, other: _Channel) -> bool:
        return (self.peer, self.listener_addr, self.relay_addr) == (
            other.peer,
            other.listener_addr,
            other.relay_addr,
        )


class OffloadManager:
    """Mirror the engine's channel routes into the kernel when an offload engine is on."""

    def __init__(self, datapath_factory: Callable[[], Datapath] | None = None) -> None:
        # None: the kernel's own datapath. The datapath modules (libbpf through ctypes) load
        # when an engine is first configured, not in a stunnerd that never offloads.
        self._factory = datapath_factory
        self.engine = "None"
        self.interfaces: tuple[str, ...] = ()
        self.datapath: Datapath | None = None
        self.modes: dict[str, str] = {}
        self.reason = ""
        self.channels: dict[ChannelId, _Channel] = {}
        self.packets = 0  # relayed by the kernel since start, both directions
        self.bytes = 0
        self._paths_checked = time.monotonic()

    @property
    def active(self) -> bool:
        return self.datapath is not None

    # ------------------------------------------------------------------ configuration

    def configure(self, engine: str, interfaces: tuple[str, ...] | list[str] = ()) -> None:
        """Apply `admin.offload_engine` / `admin.offload_interfaces`; a no-op when unchanged."""
        interfaces = tuple(sorted(interfaces))
        if engine == self.engine and interfaces == self.interfaces and (self.active or self.reason):
            return
        if engine == self.engine == "None":
            self.interfaces = interfaces
            return
        self._stop()
        self.engine, self.interfaces, self.reason = engine, interfaces, ""
        if engine == "None":
            return
        from stunnerd.offload.datapath import Datapath
        from stunnerd.offload.libbpf import OffloadError

        try:
            datapath = (self._factory or Datapath)()
        except OffloadError as exc:
            self._fail(str(exc))
            return
        try:
            self.modes = dict(datapath.attach(engine, interfaces))
        except OffloadError as exc:
            datapath.close()
            self._fail(str(exc))
            return
        self.datapath = datapath
        for key, chan in self.channels.items():
            self._install(key, chan)
        log.info(
            "offload: %s active on %s, %d channels installed",
            engine,
            ", ".join(f"{n} ({m})" for n, m in sorted(self.modes.items())) or "no interface",
            sum(1 for c in self.channels.values() if c.entries is not None),
        )

    def _fail(self, reason: str) -> None:
        self.reason = reason
        log.warning(
            "offload: engine %s is not active, relaying in user space: %s", self.engine, reason
        )

    def _stop(self) -> None:
        if self.datapath is None:
            return
        self.datapath.detach()  # the kernel stops relaying; the maps live on until close()
        self.poll()  # so this reads the final counts
        for chan in self.channels.values():
            chan.entries = None
        datapath, self.datapath = self.datapath, None
        datapath.close()
        self.modes = {}

    def close(self) -> None:
        """Detach (stunnerd stopping): everything falls back to user space."""
        self._stop()

    def let_go(self) -> None:
        """A successor serves (hot handoff): close without detaching. Its program took our
        place on the same hooks when it attached, and a detach (by hook and priority) would
        take its program, and the channels it relays in the kernel, away."""
        if self.datapath is not None:
            self.datapath.attached.clear()
        self._stop()

    # ------------------------------------------------------------------ channels

    def routes(self, listener: str, address: Address, traffic: Traffic) -> OffloadRoutes:
        """`listener`'s channel routes in the kernel, as a `RouteTable`: `address` is its bound
        address, `traffic` its counters."""
        return OffloadRoutes(self, listener, address, traffic)

    def channel_added(
        self,
        listener: str,
        client: Address,
        channel: int,
        peer: Address,
        *,
        listener_addr: Address,
        relay_addr: Address,
        listener_traffic: Traffic,
        cluster_traffic: Traffic,
    ) -> None:
        key = (listener, (client[0], client[1]), channel)
        chan = _Channel(
            (peer[0], peer[1]), listener_addr, relay_addr, listener_traffic, cluster_traffic
        )
        old = self.channels.get(key)
        settled = old is not None and (old.entries is not None or self.datapath is None)
        if old is not None and settled and old.same_path(chan):
            # the same channel counting elsewhere (a policy change): the entries stay
            old.listener_traffic, old.cluster_traffic = listener_traffic, cluster_traffic
            return
        if old is not None:
            self._uninstall(self.channels.pop(key))
        self.channels[key] = chan
        if self.datapath is not None:
            self._install(key, chan)

    def channel_removed(self, listener: str, client: Address, channel: int) -> None:
        chan = self.channels.pop((listener, (client[0], client[1]), channel), None)
        if chan is not None:
            self._uninstall(chan)

    def listener_closed(self, listener: str) -> None:
        for key in [k for k in self.channels if k[0] == listener]:
            self._uninstall(self.channels.pop(key))

    def _install(self, key: ChannelId, chan: _Channel) -> None:
        assert self.datapath is not None
        # Loaded with the datapath (`configure`).
        from stunnerd.offload.datapath import channel_entries, same_way
        from stunnerd.offload.libbpf import OffloadError
        from stunnerd.offload.routes import RouteError

        _listener, client, number = key
        try:
            entries = channel_entries(
                client, chan.listener_addr, number, chan.peer, chan.relay_addr
            )
            if chan.entries is not None and same_way(entries, chan.entries):
                return
            self.datapath.put(entries)
        except (RouteError, OffloadError, OSError) as exc:
            if log.isEnabledFor(logging.DEBUG):
                log.debug("offload: channel %s left to user space: %s", key, exc)
            return
        chan.entries = entries

    def _uninstall(self, chan: _Channel) -> None:
        if chan.entries is None or self.datapath is None:
            return
        to_peer, to_client = self.datapath.delete(chan.entries)
        chan.entries = None
        self._account(chan, to_peer, to_client)

    # ------------------------------------------------------------------ counters

    def poll(self) -> None:
        """Fold what the kernel counted since the last poll into the traffic counters."""
        if self.datapath is None:
            return
        now = time.monotonic()
        if now - self._paths_checked >= PATH_REFRESH_S:
            self._paths_checked = now
            for key, chan in self.channels.items():
                if chan.entries is not None:
                    self._install(key, chan)  # rewritten only where the way out changed
        dp = self.datapath
        for chan in self.channels.values():
            if chan.entries is not None:
                self._account(
                    chan,
                    dp.client_counters(chan.entries.client_key),
                    dp.peer_counters(chan.entries.peer_key),
                )

    def _account(
        self, chan: _Channel, to_peer: Counters | None, to_client: Counters | None
    ) -> None:
        seen = chan.seen
        lt, ct = chan.listener_traffic, chan.cluster_traffic
        if to_peer is not None and to_peer.packets > seen[0]:
            pkts, nbytes = to_peer.packets - seen[0], to_peer.bytes - seen[1]
            seen[0], seen[1] = to_peer.packets, to_peer.bytes
            lt[0] += pkts
            lt[1] += nbytes + CHANNEL_HEADER_BYTES * pkts
            ct[2] += pkts
            ct[3] += nbytes
            self.packets += pkts
            self.bytes += nbytes
        if to_client is not None and to_client.packets > seen[2]:
            pkts, nbytes = to_client.packets - seen[2], to_client.bytes - seen[3]
            seen[2], seen[3] = to_client.packets, to_client.bytes
            ct[0] += pkts
            ct[1] += nbytes
            lt[2] += pkts
            lt[3] += nbytes + CHANNEL_HEADER_BYTES * pkts
            self.packets += pkts
            self.bytes += nbytes

    def status(self) -> dict[str, Any]:
        """`/status`'s `offload` object."""
        if not self.active:
            out: dict[str, Any] = {"engine": self.engine, "active": False}
            out["reason"] = self.reason or (
                "offload_engine is None" if self.engine == "None" else "not started"
            )
            return out
        self.poll()
        return {
            "engine": self.engine,
            "active": True,
            "interfaces": dict(sorted(self.modes.items())),
            "channels": sum(1 for c in self.channels.values() if c.entries is not None),
            "packets": self.packets,
            "bytes": self.bytes,
        }
