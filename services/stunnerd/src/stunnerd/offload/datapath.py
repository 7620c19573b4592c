"""The kernel side of the offload: the loaded BPF object, where it is attached, and its maps.

`Datapath` loads `stunner_offload.bpf.o` (built from `services/stunnerd/bpf/` by `make setup`),
attaches its TC program to clsact ingress or its XDP program in native mode on each chosen
interface, and writes and deletes map entries. Attachments are tagged (TC: a fixed handle and
priority; XDP: the program name), so a new run replaces what a crashed one left behind instead
of stacking on it, and never displaces someone else's XDP program.

This module knows nothing of TURN allocations: `offload.manager` decides what goes in the maps.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from stunnerd.offload import libbpf, routes
from stunnerd.offload.libbpf import BpfMap, BpfObject, OffloadError
from stunnerd.offload.maps import Address, ClientKey, Fwd, PeerKey, client_key, fwd, peer_key

log = logging.getLogger(__name__)

Mode = Literal["TC", "XDP"]
PROG_TC = "stunner_tc"
PROG_XDP = "stunner_xdp"
TC_HANDLE = 0x57A1
TC_PRIORITY = 0x57A1
OBJECT_NAME = "stunner_offload.bpf.o"


def default_object_path() -> str:
    """`Datapath.object_file`, else the object `make setup` builds next to this module."""
    return Datapath.object_file or str(Path(__file__).with_name(OBJECT_NAME))


WILDCARDS = ("", "0.0.0.0")


@dataclass(frozen=True, slots=True)
class ChannelEntries:
    """The two map entries of one bound channel."""

    client_key: ClientKey  # ChannelData from the client on this channel ...
    to_peer: Fwd  # ... leaves as UDP from the relay address to the peer
    peer_key: PeerKey  # a datagram from the peer to the relay port ...
    to_client: Fwd  # ... leaves as ChannelData from the listener address to the client


def _macs(route: routes.Route) -> tuple[bytes, bytes] | None:
    if route.local:
        return None
    smac = routes.interface_mac(route.ifindex)
    dmac = routes.neighbour_mac(route.next_hop, route.ifindex)
    return (smac, dmac) if smac and dmac else None


def _fwd(src: Address, dst: Address, route: routes.Route, channel: int = 0) -> Fwd:
    macs = _macs(route)
    peer_dev = macs is not None and routes.peer_in_other_namespace(route.ifindex)
    return fwd(
        src,
        dst,
        ifindex=route.ifindex,
        local=route.local,
        channel=channel,
        macs=macs,
        peer_dev=peer_dev,
    )


def channel_entries(
    client: Address,
    listener: Address,
    channel: int,
    peer: Address,
    relay: Address,
) -> ChannelEntries:
    """Entries for a channel; `listener` and `relay` are the bound socket addresses (a wildcard
    host means: the source a socket would pick towards the other end). Raises `RouteError`."""
    to_client = routes.lookup(client[0])
    to_peer = routes.lookup(peer[0])
    listener_ip = to_client.src if listener[0] in WILDCARDS else listener[0]
    relay_ip = to_peer.src if relay[0] in WILDCARDS else relay[0]
    return ChannelEntries(
        client_key=client_key(client, listener[1], channel),
        to_peer=_fwd((relay_ip, relay[1]), peer, to_peer),
        peer_key=peer_key(peer, relay[1]),
        to_client=_fwd((listener_ip, listener[1]), client, to_client, channel),
    )


def same_way(a: ChannelEntries, b: ChannelEntries) -> bool:
    """Whether two channels' entries send alike (the same keys, addresses, interfaces, MAC
    addresses and flags), whatever they counted."""
    sends = Fwd.pad.offset  # everything before the owner tag and the counters
    return bytes(a.client_key) + bytes(a.peer_key) == bytes(b.client_key) + bytes(b.peer_key) and (
        bytes(a.to_peer)[:sends],
        bytes(a.to_client)[:sends],
    ) == (bytes(b.to_peer)[:sends], bytes(b.to_client)[:sends])


@dataclass(frozen=True, slots=True)
class Counters:
    packets: int
    bytes: int


def interfaces(names: tuple[str, ...] | list[str]) -> dict[str, int]:
    """The named interfaces (all of them when `names` is empty) by index; unknown names raise."""
    present = {name: index for index, name in socket.if_nameindex()}
    if not names:
        return present
    missing = [n for n in names if n not in present]
    if missing:
        raise OffloadError(f"no such interface: {', '.join(missing)}")
    return {n: present[n] for n in names}


def _is_physical(name: str) -> bool:
    """A device with a driver behind it (not veth, bridge, lo): where native XDP pays off."""
    return Path(f"/sys/class/net/{name}/device").exists()


class Datapath:
    """The loaded object and its attachments; `close()` detaches everything it attached."""

    object_file = ""
    """The object to load when none is named, set by the command from its settings."""

    def __init__(self, object_path: str | None = None) -> None:
        self.obj = BpfObject(object_path or default_object_path())
        try:
            self.tc_fd = self.obj.prog_fd(PROG_TC)
            self.xdp_fd = self.obj.prog_fd(PROG_XDP)
            self.chan = BpfMap(self.obj.map_fd("stunner_chan"))
            self.peer = BpfMap(self.obj.map_fd("stunner_peer"))
        except OffloadError:
            self.obj.close()
            raise
        self.attached: dict[str, tuple[int, Mode]] = {}  # interface -> (ifindex, mode)
        self.owner = 0  # written into every entry this process puts (`Fwd.pad`)

    def map_fds(self) -> tuple[int, int]:
        """The two maps' descriptors, to hand to worker processes (`SharedMaps`)."""
        return self.chan.fd, self.peer.fd

    def forget_owner(self, owner: int) -> int:
        """Delete every entry `owner` put (a worker process that died); how many."""
        gone = 0
        for fmap, key_type in ((self.chan, ClientKey), (self.peer, PeerKey)):
            for key in fmap.keys(key_type):
                value = Fwd()
                if fmap.lookup(key, value) and value.pad == owner and fmap.delete(key):
                    gone += 1
        return gone

    # ------------------------------------------------------------------ attach / detach

    def attach(self, engine: str, names: tuple[str, ...] | list[str]) -> dict[str, Mode]:
        """Attach on every chosen interface (TC, XDP, or Auto: native XDP on physical devices
        that take it, TC elsewhere). On any failure what was attached is detached again."""
        try:
            for name, index in sorted(interfaces(names).items()):
                self._clear_leftovers(name, index)
                if engine == "XDP" or (engine == "Auto" and _is_physical(name)):
                    try:
                        self._attach_xdp(name, index)
                        continue
                    except OffloadError as exc:
                        if engine == "XDP":
                            raise
                        log.info("offload: %s: no native XDP (%s); using TC", name, exc)
                libbpf.tc_attach(index, self.tc_fd, TC_HANDLE, TC_PRIORITY)
                self.attached[name] = (index, "TC")
        except BaseException:
            self.detach()
            raise
        return {name: mode for name, (_i, mode) in self.attached.items()}

    def _attach_xdp(self, name: str, index: int) -> None:
        current = libbpf.xdp_query(index)
        if current and libbpf.prog_name(current) != PROG_XDP:
            raise OffloadError(f"{name} already runs another XDP program (id {current})")
        libbpf.xdp_attach(index, self.xdp_fd, replace=bool(current))
        self.attached[name] = (index, "XDP")

    @staticmethod
    def _clear_leftovers(name: str, index: int) -> None:
        """Detach our programs left by a previous run (their maps hold stale channels)."""
        prog_id = libbpf.tc_query(index, TC_HANDLE, TC_PRIORITY)
        if prog_id and libbpf.prog_name(prog_id) == PROG_TC:
            libbpf.tc_detach(index, TC_HANDLE, TC_PRIORITY)
            log.warning("offload: removed a TC program left on %s by a previous run", name)
        prog_id = libbpf.xdp_query(index)
        if prog_id and libbpf.prog_name(prog_id) == PROG_XDP:
            libbpf.xdp_detach(index)
            log.warning("offload: removed an XDP program left on %s by a previous run", name)

    def detach(self) -> None:
        for name, (index, mode) in list(self.attached.items()):
            if mode == "XDP":
                ok = libbpf.xdp_detach(index)
            else:
                ok = libbpf.tc_detach(index, TC_HANDLE, TC_PRIORITY)
            if not ok and name in {n for _i, n in socket.if_nameindex()}:
                log.warning("offload: could not detach from %s", name)
        self.attached.clear()

    def close(self) -> None:
        self.detach()
        self.obj.close()

    # ------------------------------------------------------------------ entries

    def put(self, entries: ChannelEntries) -> None:
        """Install both directions (a refresh keeps the counters the kernel holds)."""
        for fmap, key, value in (
            (self.chan, entries.client_key, entries.to_peer),
            (self.peer, entries.peer_key, entries.to_client),
        ):
            old = Fwd()
            if fmap.lookup(key, old):
                value.packets, value.bytes = old.packets, old.bytes
            value.pad = self.owner
            fmap.update(key, value)

    def delete(self, entries: ChannelEntries) -> tuple[Counters | None, Counters | None]:
        """Remove both directions; the final counters of each (None if absent)."""
        out: list[Counters | None] = []
        for fmap, key in ((self.chan, entries.client_key), (self.peer, entries.peer_key)):
            value = Fwd()
            out.append(Counters(value.packets, value.bytes) if fmap.pop(key, value) else None)
        return out[0], out[1]

    def client_counters(self, key: ClientKey) -> Counters | None:
        value = Fwd()
        return Counters(value.packets, value.bytes) if self.chan.lookup(key, value) else None

    def peer_counters(self, key: PeerKey) -> Counters | None:
        value = Fwd()
        return Counters(value.packets, value.bytes) if self.peer.lookup(key, value) else None

    def entry_count(self) -> tuple[int, int]:
        return len(self.chan.keys(ClientKey)), len(self.peer.keys(PeerKey))


class SharedMaps(Datapath):
    """A worker process's view of the supervisor's loaded program: the maps only.

    With `--udp-thread-num` above 1 the supervisor loads and attaches the program once and hands
    every worker duplicates of the two map descriptors over its socket channel; each worker
    writes the entries of its own channels, tagged with its `owner` number, so the supervisor
    can delete a dead worker's entries. Attaching is the supervisor's: `attach` reports its
    modes, `detach` does nothing, `close` closes the duplicates.
    """

    def __init__(self, chan_fd: int, peer_fd: int, modes: dict[str, Mode], owner: int) -> None:
        self.chan = BpfMap(chan_fd)
        self.peer = BpfMap(peer_fd)
        self.modes = dict(modes)
        self.attached = {}
        self.owner = owner

    def attach(self, engine: str, names: tuple[str, ...] | list[str]) -> dict[str, Mode]:
        return dict(self.modes)

    def detach(self) -> None:
        return None

    def close(self) -> None:
        for fd in (self.chan.fd, self.peer.fd):
            with contextlib.suppress(OSError):
                os.close(fd)
