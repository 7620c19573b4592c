"""The messages stunnerd's supervisor and its worker processes exchange, with their codec.

Two links (`stunnerd.workers`): requests and replies as JSON lines on a worker's stdin and
stdout (each request's `id` repeated by its reply), and a SOCK_SEQPACKET channel whose messages
may carry fds: listener and relay sockets, the nonce key and the offload maps to the worker, its
allocation journal back. Every message is a frozen record with its `op` and the protocol
`version`; a decoder refuses another version or an unknown op, naming it, with
`WorkerMessageError`. Both ends are the same build; nothing here crosses a handoff between two
stunnerds (the journal's allocation records travel on in the handoff document, which
`stunnerd.handoff.transport.state` versions), so the version only changes with a change of these
records.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final, TypeVar

from stunner_common.contracts.socket_key import SocketKey

PROTOCOL_VERSION: Final = 2

M = TypeVar("M")


class WorkerMessageError(ValueError):
    """A message that is not one of this version's: another version, an unknown op, a field
    missing or of the wrong type. `ident` is the request's id when it could be read."""

    def __init__(self, reason: str, ident: int | None = None) -> None:
        super().__init__(reason)
        self.ident = ident


# --- requests (supervisor → worker, stdin) ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class ApplyRequest:
    """Apply `config` (canonical JSON, `$VAR` expanded) on the listener sockets `sockets`; the
    first config of a started worker carries its predecessor's allocations (`adopt`, a handoff
    document) whose relay sockets came before it on the channel."""

    OP: ClassVar[str] = "apply"
    config: str
    sockets: tuple[SocketKey, ...] = ()
    adopt: str | None = None
    id: int = 0
    version: int = PROTOCOL_VERSION

    def fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "config": self.config,
            "sockets": [key.encode() for key in self.sockets],
        }
        if self.adopt is not None:
            out["adopt"] = self.adopt
        return out

    @classmethod
    def from_fields(cls, f: Mapping[str, Any], ident: int, version: int) -> ApplyRequest:
        adopt = f.get("adopt")
        return cls(
            _str(f, "config"),
            tuple(SocketKey.decode(key) for key in _list(f, "sockets")),
            None if adopt is None else str(adopt),
            ident,
            version,
        )


@dataclass(frozen=True, slots=True)
class StatsRequest:
    """The worker's counters, offload and quota status."""

    OP: ClassVar[str] = "stats"
    id: int = 0
    version: int = PROTOCOL_VERSION

    def fields(self) -> dict[str, Any]:
        return {}

    @classmethod
    def from_fields(cls, f: Mapping[str, Any], ident: int, version: int) -> StatsRequest:
        return cls(ident, version)


@dataclass(frozen=True, slots=True)
class DrainRequest:
    """Refuse new allocations from now on; keep the live ones."""

    OP: ClassVar[str] = "drain"
    id: int = 0
    version: int = PROTOCOL_VERSION

    def fields(self) -> dict[str, Any]:
        return {}

    @classmethod
    def from_fields(cls, f: Mapping[str, Any], ident: int, version: int) -> DrainRequest:
        return cls(ident, version)


@dataclass(frozen=True, slots=True)
class FreezeRequest:
    """While a handoff is prepared (`frozen`), requests are left to the next process."""

    OP: ClassVar[str] = "freeze"
    frozen: bool
    id: int = 0
    version: int = PROTOCOL_VERSION

    def fields(self) -> dict[str, Any]:
        return {"frozen": self.frozen}

    @classmethod
    def from_fields(cls, f: Mapping[str, Any], ident: int, version: int) -> FreezeRequest:
        return cls(_bool(f, "frozen"), ident, version)


@dataclass(frozen=True, slots=True)
class PingRequest:
    OP: ClassVar[str] = "ping"
    id: int = 0
    version: int = PROTOCOL_VERSION

    def fields(self) -> dict[str, Any]:
        return {}

    @classmethod
    def from_fields(cls, f: Mapping[str, Any], ident: int, version: int) -> PingRequest:
        return cls(ident, version)


@dataclass(frozen=True, slots=True)
class CloseRequest:
    """Stop and exit (not answered)."""

    OP: ClassVar[str] = "close"
    id: int = 0
    version: int = PROTOCOL_VERSION

    def fields(self) -> dict[str, Any]:
        return {}

    @classmethod
    def from_fields(cls, f: Mapping[str, Any], ident: int, version: int) -> CloseRequest:
        return cls(ident, version)


Request = ApplyRequest | StatsRequest | DrainRequest | FreezeRequest | PingRequest | CloseRequest


# --- replies (worker → supervisor, stdout) ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class ApplyReply:
    """What an apply did; `listeners` are `stunnerd.status.ListenerState` JSON objects."""

    OP: ClassVar[str] = "apply"
    applied: bool = False
    ignored: bool = False
    restarted: tuple[str, ...] = ()
    error: str | None = None
    duration_s: float = 0.0
    started: tuple[tuple[str, int], ...] = ()
    listeners: tuple[Mapping[str, Any], ...] = ()
    id: int = 0
    version: int = PROTOCOL_VERSION

    def fields(self) -> dict[str, Any]:
        return {
            "applied": self.applied,
            "ignored": self.ignored,
            "restarted": list(self.restarted),
            "error": self.error,
            "duration_s": self.duration_s,
            "started": [[name, port] for name, port in self.started],
            "listeners": [dict(state) for state in self.listeners],
        }

    @classmethod
    def from_fields(cls, f: Mapping[str, Any], ident: int, version: int) -> ApplyReply:
        error = f.get("error")
        return cls(
            _bool(f, "applied"),
            _bool(f, "ignored"),
            tuple(str(name) for name in _list(f, "restarted")),
            None if error is None else str(error),
            _float(f, "duration_s"),
            tuple((str(item[0]), int(item[1])) for item in _list(f, "started")),
            tuple(_as_mapping(item, "listeners") for item in _list(f, "listeners")),
            ident,
            version,
        )


@dataclass(frozen=True, slots=True)
class StatsReply:
    """`stats` is a `stunnerd.status.StatsSnapshot` dict, `offload` the worker's offload
    status, `user_quota` its cluster-wide quota state (None when it counts per process)."""

    OP: ClassVar[str] = "stats"
    stats: Mapping[str, Any]
    offload: Mapping[str, Any]
    user_quota: Mapping[str, Any] | None = None
    id: int = 0
    version: int = PROTOCOL_VERSION

    def fields(self) -> dict[str, Any]:
        return {
            "stats": dict(self.stats),
            "offload": dict(self.offload),
            "user_quota": None if self.user_quota is None else dict(self.user_quota),
        }

    @classmethod
    def from_fields(cls, f: Mapping[str, Any], ident: int, version: int) -> StatsReply:
        quota = f.get("user_quota")
        return cls(
            _mapping(f, "stats"),
            _mapping(f, "offload"),
            None if quota is None else _as_mapping(quota, "user_quota"),
            ident,
            version,
        )


@dataclass(frozen=True, slots=True)
class DoneReply:
    """A `drain`, `freeze` or `ping` done."""

    OP: ClassVar[str] = "done"
    id: int = 0
    version: int = PROTOCOL_VERSION

    def fields(self) -> dict[str, Any]:
        return {}

    @classmethod
    def from_fields(cls, f: Mapping[str, Any], ident: int, version: int) -> DoneReply:
        return cls(ident, version)


@dataclass(frozen=True, slots=True)
class ErrorReply:
    """A request the worker could not read (`WorkerMessageError`) or carry out."""

    OP: ClassVar[str] = "error"
    error: str
    id: int = 0
    version: int = PROTOCOL_VERSION

    def fields(self) -> dict[str, Any]:
        return {"error": self.error}

    @classmethod
    def from_fields(cls, f: Mapping[str, Any], ident: int, version: int) -> ErrorReply:
        return cls(_str(f, "error"), ident, version)


Reply = ApplyReply | StatsReply | DoneReply | ErrorReply


# --- the socket channel (both ways; the fds travel beside the message) -----------------------

MAX_CHANNEL_MESSAGE_BYTES: Final = 64 * 1024
"""The largest channel message: a sender refuses a larger one and a reader reads no more (a
SOCK_SEQPACKET message longer than the reader's buffer arrives cut short)."""
MAX_CHANNEL_FDS: Final = 250
"""The most fds one channel message carries (the kernel's SCM_MAX_FD is 253)."""


@dataclass(frozen=True, slots=True)
class NonceKey:
    """The key every worker's nonces are made with (the worker's first channel message)."""

    OP: ClassVar[str] = "nonce_key"
    key: bytes
    version: int = PROTOCOL_VERSION

    def fields(self) -> dict[str, Any]:
        return {"key": self.key.hex()}

    @classmethod
    def from_fields(cls, f: Mapping[str, Any], ident: int, version: int) -> NonceKey:
        try:
            return cls(bytes.fromhex(_str(f, "key")), version)
        except ValueError as exc:
            raise WorkerMessageError(f"nonce_key: the key is not hex: {exc}") from exc


@dataclass(frozen=True, slots=True)
class ListenerSocket:
    """With one fd: the worker's member of the listener's SO_REUSEPORT group `key`."""

    OP: ClassVar[str] = "socket"
    key: SocketKey
    version: int = PROTOCOL_VERSION

    def fields(self) -> dict[str, Any]:
        return self.key.encode()

    @classmethod
    def from_fields(cls, f: Mapping[str, Any], ident: int, version: int) -> ListenerSocket:
        return cls(SocketKey.decode(f), version)


@dataclass(frozen=True, slots=True)
class RelaySocket:
    """With one fd: a relay socket to adopt, in the order the next `adopt` document names them."""

    OP: ClassVar[str] = "relay_socket"
    version: int = PROTOCOL_VERSION

    def fields(self) -> dict[str, Any]:
        return {}

    @classmethod
    def from_fields(cls, f: Mapping[str, Any], ident: int, version: int) -> RelaySocket:
        return cls(version)


@dataclass(frozen=True, slots=True)
class OffloadMap:
    """With one fd: the supervisor's kernel offload map `name` (`chan` or `peer`), its attach
    modes and the owner tag of this worker's entries."""

    OP: ClassVar[str] = "offload_map"
    name: str
    modes: Mapping[str, str]
    owner: int
    version: int = PROTOCOL_VERSION

    def fields(self) -> dict[str, Any]:
        return {"name": self.name, "modes": dict(self.modes), "owner": self.owner}

    @classmethod
    def from_fields(cls, f: Mapping[str, Any], ident: int, version: int) -> OffloadMap:
        modes = {str(k): str(v) for k, v in (f.get("modes") or {}).items()}
        return cls(_str(f, "name"), modes, _int(f, "owner"), version)


@dataclass(frozen=True, slots=True)
class OffloadOff:
    """No offload maps, and why."""

    OP: ClassVar[str] = "offload_off"
    reason: str
    version: int = PROTOCOL_VERSION

    def fields(self) -> dict[str, Any]:
        return {"reason": self.reason}

    @classmethod
    def from_fields(cls, f: Mapping[str, Any], ident: int, version: int) -> OffloadOff:
        return cls(str(f.get("reason") or ""), version)


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """An allocation changed: `record` is its handoff record as JSON text
    (`stunnerd.handoff.transport.state.allocation_doc`; the supervisor keeps the text and reads
    it only when it hands the allocation on), `at` the worker's monotonic time when taken, `fds`
    how many of the batch's fds are its relay sockets (when it is new; 0 for a change)."""

    listener: str
    client: tuple[str, int]
    at: float
    record: str
    fds: int = 0

    def item(self) -> list[Any]:
        return [
            "set",
            self.listener,
            self.client[0],
            self.client[1],
            self.at,
            self.fds,
            self.record,
        ]


@dataclass(frozen=True, slots=True)
class JournalDelete:
    """An allocation is gone."""

    listener: str
    client: tuple[str, int]

    def item(self) -> list[Any]:
        return ["del", self.listener, self.client[0], self.client[1]]


JournalItem = JournalEntry | JournalDelete


@dataclass(frozen=True, slots=True)
class JournalBatch:
    """Changes of a worker's allocations (worker → supervisor), in the order they happened, with
    the new ones' relay sockets as the message's fds in the same order (at most
    `MAX_CHANNEL_FDS`). A worker sends what changed in one turn of its event loop as one batch:
    a storm of allocations costs a message per turn, not one per allocation. An item travels as
    a JSON array: ``["set", listener, host, port, at, fds, record]`` or
    ``["del", listener, host, port]``."""

    OP: ClassVar[str] = "journal"
    items: tuple[JournalItem, ...]
    version: int = PROTOCOL_VERSION

    @property
    def fd_count(self) -> int:
        return sum(item.fds for item in self.items if type(item) is JournalEntry)

    def fields(self) -> dict[str, Any]:
        return {"items": [item.item() for item in self.items]}

    @classmethod
    def from_fields(cls, f: Mapping[str, Any], ident: int, version: int) -> JournalBatch:
        return cls(tuple(_journal_item(item) for item in _list(f, "items")), version)


def _journal_item(value: Any) -> JournalItem:
    if not isinstance(value, list) or len(value) < 4:
        raise WorkerMessageError(f"journal item {value!r}")
    kind, listener, host, port = value[0], value[1], value[2], value[3]
    if type(listener) is not str or type(host) is not str or type(port) is not int:
        raise WorkerMessageError(f"journal item {value[:4]!r}")
    if kind == "del" and len(value) == 4:
        return JournalDelete(listener, (host, port))
    if kind == "set" and len(value) == 7:
        at, fds, record = value[4], value[5], value[6]
        if type(at) in (int, float) and type(fds) is int and fds >= 0 and type(record) is str:
            return JournalEntry(listener, (host, port), float(at), record, fds)
    raise WorkerMessageError(f"journal item {value[:6]!r}")


ChannelMessage = NonceKey | ListenerSocket | RelaySocket | OffloadMap | OffloadOff | JournalBatch
WorkerMessage = Request | Reply | ChannelMessage

_Decoder = Callable[[Mapping[str, Any], int, int], M]

REQUESTS: Final[Mapping[str, _Decoder[Request]]] = {
    t.OP: t.from_fields
    for t in (ApplyRequest, StatsRequest, DrainRequest, FreezeRequest, PingRequest, CloseRequest)
}
REPLIES: Final[Mapping[str, _Decoder[Reply]]] = {
    t.OP: t.from_fields for t in (ApplyReply, StatsReply, DoneReply, ErrorReply)
}
CHANNEL_MESSAGES: Final[Mapping[str, _Decoder[ChannelMessage]]] = {
    t.OP: t.from_fields
    for t in (
        NonceKey,
        ListenerSocket,
        RelaySocket,
        OffloadMap,
        OffloadOff,
        JournalBatch,
    )
}
_WITH_ID: Final = (
    ApplyRequest,
    StatsRequest,
    DrainRequest,
    FreezeRequest,
    PingRequest,
    CloseRequest,
    ApplyReply,
    StatsReply,
    DoneReply,
    ErrorReply,
)


def encode_fields(message: WorkerMessage) -> dict[str, Any]:
    """The message as the JSON object it travels as."""
    out: dict[str, Any] = {"op": message.OP, "version": message.version}
    if isinstance(message, _WITH_ID):
        out["id"] = message.id
    out.update(message.fields())
    return out


def encode(message: WorkerMessage) -> bytes:
    """The message as compact JSON (the line protocol adds its newline)."""
    return json.dumps(encode_fields(message), separators=(",", ":")).encode()


def decode_request(data: bytes | Mapping[str, Any]) -> Request:
    return _decode(data, REQUESTS, "request")


def decode_reply(data: bytes | Mapping[str, Any]) -> Reply:
    return _decode(data, REPLIES, "reply")


def decode_channel(data: bytes | Mapping[str, Any]) -> ChannelMessage:
    return _decode(data, CHANNEL_MESSAGES, "channel message")


def _decode(data: bytes | Mapping[str, Any], table: Mapping[str, _Decoder[M]], what: str) -> M:
    if isinstance(data, (bytes, bytearray)):
        try:
            data = json.loads(data)
        except ValueError as exc:
            raise WorkerMessageError(f"worker {what} is not JSON: {exc}") from exc
    if not isinstance(data, Mapping):
        raise WorkerMessageError(f"worker {what} is not an object")
    raw_id = data.get("id")
    ident = raw_id if type(raw_id) is int else None
    version = data.get("version")
    if version != PROTOCOL_VERSION or type(version) is not int:
        raise WorkerMessageError(
            f"worker {what} of protocol version {version!r}: this stunnerd speaks "
            f"version {PROTOCOL_VERSION}",
            ident,
        )
    op = data.get("op")
    from_fields = table.get(op) if isinstance(op, str) else None
    if from_fields is None:
        raise WorkerMessageError(f"unknown worker {what} op {op!r}", ident)
    try:
        return from_fields(data, ident or 0, version)
    except WorkerMessageError as exc:
        raise WorkerMessageError(f"worker {what} {op}: {exc}", ident) from exc
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise WorkerMessageError(f"worker {what} {op}: bad field: {exc!r}", ident) from exc


def _field(f: Mapping[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    value = f.get(name)
    if not isinstance(value, kind):
        raise WorkerMessageError(f"field {name!r} is {value!r}")
    return value


def _str(f: Mapping[str, Any], name: str) -> str:
    return str(_field(f, name, str))


def _bool(f: Mapping[str, Any], name: str) -> bool:
    return bool(_field(f, name, bool))


def _int(f: Mapping[str, Any], name: str) -> int:
    value = _field(f, name, int)
    if isinstance(value, bool):
        raise WorkerMessageError(f"field {name!r} is {value!r}")
    return int(value)


def _float(f: Mapping[str, Any], name: str) -> float:
    value = _field(f, name, (int, float))
    if isinstance(value, bool):
        raise WorkerMessageError(f"field {name!r} is {value!r}")
    return float(value)


def _list(f: Mapping[str, Any], name: str) -> Sequence[Any]:
    return tuple(_field(f, name, (list, tuple)))


def _mapping(f: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    return _as_mapping(f.get(name), name)


def _as_mapping(value: Any, name: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise WorkerMessageError(f"field {name!r} is {value!r}")
    return dict(value)
