"""The allocation state one stunnerd hands to the next, as a versioned, validated document.

What a replacement needs to carry on a client's allocation without it noticing (RFC 8656):
the 5-tuple it belongs to, the credentials' key that signs its answers, its relay address (the
socket itself travels beside the document, by SCM_RIGHTS, named by that address), its lifetime,
its permissions and its channels. Quota counts are not sent: they are counted again from the
allocations. Lifetimes travel as seconds left, not as clock readings, so neither side depends on
the other's clock.

Every document starts with `format` and `version`. A reader takes exactly the versions it
knows (`READABLE_VERSIONS`) and refuses any other with `HandoffFormatError`: the sender then
keeps serving. Nothing here touches a socket or the clock (the caller passes `now`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

FORMAT = "stunnerd-handoff"
VERSION = 1
READABLE_VERSIONS = frozenset({1})
MAX_DOCUMENT_BYTES = 64 << 20
"""A bound on what a reader accepts (about 100 000 allocations with their channels)."""

Address = tuple[str, int]


class HandoffFormatError(ValueError):
    """The document is not one this stunnerd can take (another version, or invalid)."""


@dataclass(frozen=True, slots=True)
class ChannelRecord:
    number: int
    peer: Address
    expires_in_s: float


@dataclass(frozen=True, slots=True)
class AllocationRecord:
    """One allocation; `relay` (and `additional`) name the relay sockets sent beside it."""

    client: Address
    user_id: str
    key: bytes
    username: str
    relay: Address
    family: int
    expires_in_s: float
    additional: Address | None = None
    tcp: bool = False
    permissions: dict[str, float] = field(default_factory=dict)
    """Peer IP -> seconds left."""
    channels: tuple[ChannelRecord, ...] = ()


@dataclass(frozen=True, slots=True)
class ListenerRecord:
    name: str
    allocations: tuple[AllocationRecord, ...] = ()
    worker: int = 0
    """The worker process that holds these allocations (0 in a single process)."""


@dataclass(frozen=True, slots=True)
class SocketRecord:
    """A listener socket sent beside the document: what it is bound to (a
    `stunner_common.contracts.socket_key.SocketKey`)."""

    kind: str
    host: str
    port: int


@dataclass(frozen=True, slots=True)
class HandoffState:
    listeners: tuple[ListenerRecord, ...] = ()
    nonce_key: bytes = b""
    """The key nonces are minted with: a nonce given before the handoff stays valid after."""
    sockets: tuple[SocketRecord, ...] = ()
    """Listener sockets, sent before the relay sockets; with worker processes, the members of
    each listener's SO_REUSEPORT group in worker order."""
    workers: int = 0
    """The worker processes of the sender (0: a single process)."""

    def allocation_count(self) -> int:
        return sum(len(lst.allocations) for lst in self.listeners)

    def fd_count(self) -> int:
        """The fds that travel with the document: listener sockets, then relay sockets."""
        return len(self.sockets) + len(self.relay_addresses())

    def relay_addresses(self) -> list[Address]:
        """Every relay socket the document names, in order."""
        out: list[Address] = []
        for lst in self.listeners:
            for alloc in lst.allocations:
                out.append(alloc.relay)
                if alloc.additional is not None:
                    out.append(alloc.additional)
        return out


def _address(value: Any, what: str) -> Address:
    if (
        not isinstance(value, list)
        or len(value) != 2
        or not isinstance(value[0], str)
        or not isinstance(value[1], int)
        or isinstance(value[1], bool)
        or not 0 <= value[1] <= 0xFFFF
    ):
        raise HandoffFormatError(f"{what}: expected [host, port], got {value!r}")
    return value[0], value[1]


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise HandoffFormatError(f"{what}: expected a non-negative number, got {value!r}")
    return float(value)


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise HandoffFormatError(f"{what}: expected a string, got {value!r}")
    return value


def _hex(value: Any, what: str) -> bytes:
    try:
        return bytes.fromhex(_text(value, what))
    except ValueError:
        raise HandoffFormatError(f"{what}: not hexadecimal") from None


def _channel_doc(ch: ChannelRecord) -> dict[str, Any]:
    return {"number": ch.number, "peer": list(ch.peer), "expires_in_s": ch.expires_in_s}


def allocation_doc(alloc: AllocationRecord) -> dict[str, Any]:
    return {
        "client": list(alloc.client),
        "user_id": alloc.user_id,
        "key": alloc.key.hex(),
        "username": alloc.username,
        "relay": list(alloc.relay),
        "family": alloc.family,
        "expires_in_s": alloc.expires_in_s,
        "additional": list(alloc.additional) if alloc.additional is not None else None,
        "tcp": alloc.tcp,
        "permissions": dict(alloc.permissions),
        "channels": [_channel_doc(ch) for ch in alloc.channels],
    }


def encode_state(state: HandoffState) -> bytes:
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "nonce_key": state.nonce_key.hex(),
        "sockets": [[sock.kind, sock.host, sock.port] for sock in state.sockets],
        "workers": state.workers,
        "listeners": [
            {
                "name": lst.name,
                "worker": lst.worker,
                "allocations": [allocation_doc(a) for a in lst.allocations],
            }
            for lst in state.listeners
        ],
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def _channel(doc: Any, where: str) -> ChannelRecord:
    if not isinstance(doc, dict):
        raise HandoffFormatError(f"{where}: expected an object")
    number = doc.get("number")
    # 0x4000-0x7FFF, as stunnerd binds them: RFC 5766 clients still use the upper half.
    if not isinstance(number, int) or not 0x4000 <= number <= 0x7FFF:
        raise HandoffFormatError(f"{where}.number: not a channel number (RFC 5766 §11)")
    return ChannelRecord(
        number,
        _address(doc.get("peer"), f"{where}.peer"),
        _number(doc.get("expires_in_s"), f"{where}.expires_in_s"),
    )


def read_allocation(doc: Any, where: str) -> AllocationRecord:
    if not isinstance(doc, dict):
        raise HandoffFormatError(f"{where}: expected an object")
    family = doc.get("family")
    if family not in (4, 6):
        raise HandoffFormatError(f"{where}.family: expected 4 or 6, got {family!r}")
    permissions = doc.get("permissions")
    if not isinstance(permissions, dict):
        raise HandoffFormatError(f"{where}.permissions: expected an object")
    channels = doc.get("channels")
    if not isinstance(channels, list):
        raise HandoffFormatError(f"{where}.channels: expected a list")
    additional = doc.get("additional")
    return AllocationRecord(
        client=_address(doc.get("client"), f"{where}.client"),
        user_id=_text(doc.get("user_id"), f"{where}.user_id"),
        key=_hex(doc.get("key"), f"{where}.key"),
        username=_text(doc.get("username"), f"{where}.username"),
        relay=_address(doc.get("relay"), f"{where}.relay"),
        family=int(family),
        expires_in_s=_number(doc.get("expires_in_s"), f"{where}.expires_in_s"),
        additional=None if additional is None else _address(additional, f"{where}.additional"),
        tcp=bool(doc.get("tcp", False)),
        permissions={
            _text(ip, f"{where}.permissions"): _number(left, f"{where}.permissions[{ip}]")
            for ip, left in permissions.items()
        },
        channels=tuple(_channel(c, f"{where}.channels[{i}]") for i, c in enumerate(channels)),
    )


def _listener(doc: Any, where: str) -> ListenerRecord:
    if not isinstance(doc, dict):
        raise HandoffFormatError(f"{where}: expected an object")
    allocations = doc.get("allocations")
    if not isinstance(allocations, list):
        raise HandoffFormatError(f"{where}.allocations: expected a list")
    return ListenerRecord(
        _text(doc.get("name"), f"{where}.name"),
        tuple(read_allocation(a, f"{where}.allocations[{i}]") for i, a in enumerate(allocations)),
        int(_number(doc.get("worker", 0), f"{where}.worker")),
    )


def decode_state(data: bytes, readable: Sequence[int] = tuple(READABLE_VERSIONS)) -> HandoffState:
    """The document, checked whole; `HandoffFormatError` says why it cannot be taken."""
    if len(data) > MAX_DOCUMENT_BYTES:
        raise HandoffFormatError(f"the document is larger than {MAX_DOCUMENT_BYTES} bytes")
    try:
        doc = json.loads(data)
    except ValueError:
        raise HandoffFormatError("the document is not JSON") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise HandoffFormatError(f"not a {FORMAT} document")
    version = doc.get("version")
    if version not in readable:
        raise HandoffFormatError(
            f"state version {version!r} cannot be read here (this stunnerd reads "
            f"{', '.join(str(v) for v in sorted(readable))})"
        )
    listeners = doc.get("listeners")
    if not isinstance(listeners, list):
        raise HandoffFormatError("listeners: expected a list")
    sockets = doc.get("sockets", [])
    if not isinstance(sockets, list):
        raise HandoffFormatError("sockets: expected a list")
    return HandoffState(
        listeners=tuple(_listener(lst, f"listeners[{i}]") for i, lst in enumerate(listeners)),
        nonce_key=_hex(doc.get("nonce_key", ""), "nonce_key"),
        sockets=tuple(_socket(item, f"sockets[{i}]") for i, item in enumerate(sockets)),
        workers=int(_number(doc.get("workers", 0), "workers")),
    )


def _socket(value: Any, where: str) -> SocketRecord:
    if not isinstance(value, list) or len(value) != 3 or value[0] not in ("udp", "tcp"):
        raise HandoffFormatError(f"{where}: expected [kind, host, port], got {value!r}")
    host, port = _address(value[1:], where)
    return SocketRecord(str(value[0]), host, port)
