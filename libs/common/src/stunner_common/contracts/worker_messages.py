"""The messages stunnerd's supervisor and its worker processes exchange, with their codec.

Two links (`stunnerd.workers`): requests and replies as JSON lines on a worker's stdin and
stdout (each request's `id` repeated by its reply), and a SOCK_SEQPACKET channel whose messages
may carry fds: listener and relay sockets, the nonce key and the offload maps to the worker, its
allocation journal back. Every message is a frozen record with its `op` and the protocol
`version`; a decoder refuses another version or an unknown op, naming it, with
`WorkerMessageError`. All travel as JSON objects but the journal's batches, which are binary
(`JournalBatch`). Both ends are the same build; nothing here crosses a handoff between two
stunnerds (the journal's allocation records travel on in the handoff document, which
`stunnerd.handoff.transport.state` versions), so the version only changes with a change of these
records.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final, NamedTuple, TypeVar

from stunner_common.contracts.socket_key import SocketKey

PROTOCOL_VERSION: Final = 3

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


class JournalEntry(NamedTuple):
    """An allocation changed: `record` is its handoff record as UTF-8 JSON
    (`stunnerd.handoff.transport.state.allocation_doc`; the supervisor keeps the bytes and reads
    them only when it hands the allocation on), `at` the worker's monotonic time when taken,
    `fds` how many of the batch's fds are its relay sockets (when it is new; 0 for a change).
    A named tuple, not a dataclass: the supervisor makes one per journaled change."""

    listener: str
    client: tuple[str, int]
    at: float
    record: bytes
    fds: int = 0


class JournalDelete(NamedTuple):
    """An allocation is gone."""

    listener: str
    client: tuple[str, int]


JournalItem = JournalEntry | JournalDelete

JOURNAL_MAGIC: Final = b"SJB"
"""How a `JournalBatch` starts: never a JSON object's `{`."""
_JOURNAL_HEAD: Final = struct.Struct("!3sBH")
"""A batch: the magic, the protocol version, the number of items."""
_JOURNAL_ITEM: Final = struct.Struct("!BBHHBdH")
"""An item: its kind, fds, client port, the UTF-8 lengths of the listener, the client host and
the record, and `at`; the three texts follow in that order."""
_SET, _DELETE = 1, 2
JOURNAL_HEAD_BYTES: Final = _JOURNAL_HEAD.size
JOURNAL_ITEM_BYTES: Final = _JOURNAL_ITEM.size
"""An item's fixed part: it adds that and its three texts to a batch."""


def journal_set(
    listener: bytes, host: bytes, port: int, at: float, fds: int, record: bytes
) -> bytes:
    """A `JournalEntry` as a batch item (the texts already UTF-8); `WorkerMessageError` when a
    field does not fit its width (a host over 255 bytes, a port over 65535)."""
    try:
        head = _JOURNAL_ITEM.pack(_SET, fds, port, len(listener), len(host), at, len(record))
    except struct.error as exc:
        raise WorkerMessageError(f"journal item of {host!r} port {port}: {exc}") from None
    return b"".join((head, listener, host, record))


def journal_delete(listener: bytes, host: bytes, port: int) -> bytes:
    """A `JournalDelete` as a batch item."""
    try:
        head = _JOURNAL_ITEM.pack(_DELETE, 0, port, len(listener), len(host), 0.0, 0)
    except struct.error as exc:
        raise WorkerMessageError(f"journal item of {host!r} port {port}: {exc}") from None
    return b"".join((head, listener, host))


def journal_message(items: Sequence[bytes]) -> bytes:
    """A batch of `items` (`journal_set`, `journal_delete`) as one channel message."""
    return _JOURNAL_HEAD.pack(JOURNAL_MAGIC, PROTOCOL_VERSION, len(items)) + b"".join(items)


JournalChange = tuple[str, tuple[str, int], float, bytes | None, int]
"""An item of a batch as `read_journal` gives it: listener, client, `at`, the record (None: the
allocation is gone) and the count of its fds. A plain tuple: the supervisor reads one for each
journaled change (`JournalBatch.items` has them as `JournalEntry` and `JournalDelete`)."""


def read_journal(data: bytes) -> list[JournalChange]:
    """The items of a batch, checked whole before any is returned: a batch cut short, with
    bytes left over, of another version or with a text that is not UTF-8 raises
    `WorkerMessageError` saying which."""
    size = len(data)
    if size < _JOURNAL_HEAD.size:
        raise WorkerMessageError(f"a journal batch of {size} bytes is cut short")
    magic, version, count = _JOURNAL_HEAD.unpack_from(data)
    if magic != JOURNAL_MAGIC:
        raise WorkerMessageError("not a journal batch")
    if version != PROTOCOL_VERSION:
        raise WorkerMessageError(
            f"journal batch of protocol version {version}: this stunnerd speaks "
            f"version {PROTOCOL_VERSION}"
        )
    unpack, fixed = _JOURNAL_ITEM.unpack_from, _JOURNAL_ITEM.size
    items: list[JournalChange] = []
    at = _JOURNAL_HEAD.size
    try:
        for index in range(count):
            if at + fixed > size:
                raise WorkerMessageError(
                    f"a journal batch of {size} bytes is cut short at item {index} of {count}"
                )
            kind, fds, port, name_len, host_len, when, record_len = unpack(data, at)
            host_at = at + fixed + name_len
            record_at = host_at + host_len
            end = record_at + record_len
            if end > size:
                raise WorkerMessageError(
                    f"a journal batch of {size} bytes is cut short at item {index} of {count}"
                )
            listener = data[at + fixed : host_at].decode()
            client = (data[host_at:record_at].decode(), port)
            if kind == _SET:
                items.append((listener, client, when, data[record_at:end], fds))
            elif kind == _DELETE and fds == record_len == 0:
                items.append((listener, client, when, None, 0))
            else:
                raise WorkerMessageError(f"journal item {index} of kind {kind}")
            at = end
    except UnicodeDecodeError as exc:
        raise WorkerMessageError(f"journal item {len(items)}: a name is not UTF-8: {exc}") from None
    if at != size:
        raise WorkerMessageError(
            f"a journal batch of {count} items has bytes left over: {size - at}"
        )
    return items


@dataclass(frozen=True, slots=True)
class JournalBatch:
    """Changes of a worker's allocations (worker → supervisor), in the order they happened, with
    the new ones' relay sockets as the message's fds in the same order (at most
    `MAX_CHANNEL_FDS`). A worker sends what changed in one turn of its event loop as one batch:
    a storm of allocations costs a message per turn, not one per allocation.

    The one channel message that is not JSON (`journal_message`): the records inside are JSON
    already, and a JSON batch would escape each again, which cost the worker more than making
    the record did. It starts with `JOURNAL_MAGIC`, the protocol version and the item count,
    then each item as a fixed part (`JOURNAL_ITEM_BYTES`) and its listener name, client host
    and record as UTF-8."""

    OP: ClassVar[str] = "journal"
    items: tuple[JournalItem, ...]
    version: int = PROTOCOL_VERSION

    @property
    def fd_count(self) -> int:
        return sum(item.fds for item in self.items if type(item) is JournalEntry)

    def to_bytes(self) -> bytes:
        return journal_message(
            [
                journal_set(
                    item.listener.encode(),
                    item.client[0].encode(),
                    item.client[1],
                    item.at,
                    item.fds,
                    item.record,
                )
                if type(item) is JournalEntry
                else journal_delete(item.listener.encode(), item.client[0].encode(), item.client[1])
                for item in self.items
            ]
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> JournalBatch:
        return cls(
            tuple(
                JournalEntry(listener, client, at, record, fds)
                if record is not None
                else JournalDelete(listener, client)
                for listener, client, at, record, fds in read_journal(data)
            )
        )


JsonChannelMessage = NonceKey | ListenerSocket | RelaySocket | OffloadMap | OffloadOff
ChannelMessage = JsonChannelMessage | JournalBatch
JsonMessage = Request | Reply | JsonChannelMessage
WorkerMessage = JsonMessage | JournalBatch

_Decoder = Callable[[Mapping[str, Any], int, int], M]

REQUESTS: Final[Mapping[str, _Decoder[Request]]] = {
    t.OP: t.from_fields
    for t in (ApplyRequest, StatsRequest, DrainRequest, FreezeRequest, PingRequest, CloseRequest)
}
REPLIES: Final[Mapping[str, _Decoder[Reply]]] = {
    t.OP: t.from_fields for t in (ApplyReply, StatsReply, DoneReply, ErrorReply)
}
CHANNEL_MESSAGES: Final[Mapping[str, _Decoder[JsonChannelMessage]]] = {
    t.OP: t.from_fields for t in (NonceKey, ListenerSocket, RelaySocket, OffloadMap, OffloadOff)
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


def encode_fields(message: JsonMessage) -> dict[str, Any]:
    """The message as the JSON object it travels as (every message but a `JournalBatch`)."""
    out: dict[str, Any] = {"op": message.OP, "version": message.version}
    if isinstance(message, _WITH_ID):
        out["id"] = message.id
    out.update(message.fields())
    return out


def encode(message: WorkerMessage) -> bytes:
    """The message as compact JSON (the line protocol adds its newline); a `JournalBatch` as its
    binary batch."""
    if isinstance(message, JournalBatch):
        return message.to_bytes()
    return json.dumps(encode_fields(message), separators=(",", ":")).encode()


def decode_request(data: bytes | Mapping[str, Any]) -> Request:
    return _decode(data, REQUESTS, "request")


def decode_reply(data: bytes | Mapping[str, Any]) -> Reply:
    return _decode(data, REPLIES, "reply")


def decode_channel(data: bytes | Mapping[str, Any]) -> ChannelMessage:
    if isinstance(data, (bytes, bytearray)) and data[:3] == JOURNAL_MAGIC:
        return JournalBatch.from_bytes(bytes(data))
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
