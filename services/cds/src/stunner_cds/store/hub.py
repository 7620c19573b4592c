"""Fan-out from the config mirror to every watcher, without ever waiting on one.

Each watcher has a topic (all configs, one namespace, or one id), a wire mode (upstream v1 full
frames or ``stunner.cds.v2`` envelopes) and a bounded queue. A change is encoded at most once per
mode and the same string is queued for every matching watcher. A config is a state, not a stream
of events, so the newest change of a config replaces the one still queued for it (latest wins; in
v2 the replacement is a snapshot, since a patch holds only against the state before it, and it
goes to the end of the queue, which keeps the queue in revision order): a reader that falls behind
a config changing a hundred times a second gets its newest state as soon as it reads again, and
its queue holds at most one frame per config besides its initial ones. A watcher whose queue is
full even so is unsubscribed on the spot and told why, so one slow reader never delays the rest
(upstream blocks every writer on a full 256-slot channel). Subscribing takes the snapshot and
registers the watcher in one synchronous step on the event loop, so no change falls between the
two.

A v2 resume (``since``) is honoured only in the epoch the client names; a snapshot's frames are
queued in revision order, so a client cut off half-way resumes from the last one it got without
missing any. When the store's history is lost (``reset``), every v2 watcher is closed: its
revisions mean nothing any more, and it comes back for a full snapshot of the new epoch. v1
watchers, which never see revisions, just get what changed. A store rolled back within its epoch
(an older copy came back) keeps that epoch's name until the publisher's next write renumbers it,
but its revisions were given out twice: no resume in that epoch is honoured any more, so a client
that had seen a revision the rolled-back store gives out again gets the whole snapshot.

A watcher whose connection can take a frame now (its ``sink``: open, its write buffer below the
high-water mark) and that has nothing queued and nothing being sent gets a change's frame written
straight to its socket, the WebSocket frame built once per change for every such watcher
(``stunner_cds.store.frames``): no task wakes, nothing is encoded per watcher. Any other watcher
gets it queued, and its writer task sends the queue in order; frames are written directly again
only once the queue is empty and the writer idle, so a watcher's frames never overtake each other.

A v1 frame is the whole config, so with ``v1_min_interval_s`` a config's v1 watchers get it at most
once per interval: a change that comes sooner is held, a newer one replaces it, and the newest is
sent when the interval is up (upstream's operator throttles its renders the same way, 250 ms by
default). A config of ten thousand endpoints changing ten times a second would otherwise cost each
v1 watcher, and the CDS's network, ten whole configs a second. v2 watchers get a patch per change
at once.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from stunner_cds.store.diff import json_patch
from stunner_cds.store.frames import text_frame
from stunner_cds.store.mirror import Change, ConfigMirror, Entry
from stunner_cds.store.nodes import node_address
from stunner_common.cds import (
    encode_delete,
    encode_patch,
    encode_snapshot,
    encode_v1_config,
    encode_v1_delete,
)
from stunner_common.contracts.listener_address import (
    fill_node_address,
    has_node_placeholder,
    node_fill,
)
from stunner_common.io.store import Snapshot, StoreEvent

log = logging.getLogger(__name__)


class Mode(enum.Enum):
    V1 = "v1"
    V2 = "v2"


SHORT_PATCH_BYTES = 512
"""A v2 patch envelope this short is sent without encoding the snapshot it could be instead
(a config with a listener and a cluster is longer); a longer one goes as whichever is shorter."""
CLOSE_GOING_AWAY = 1001
CLOSE_SERVICE_RESTART = 1012
CLOSE_TRY_AGAIN_LATER = 1013


@dataclass(frozen=True, slots=True)
class Topic:
    """All configs (both None), one namespace (``name`` None), or one config."""

    namespace: str | None = None
    name: str | None = None

    def matches(self, config_id: str) -> bool:
        if self.namespace is None:
            return True
        namespace, _, name = config_id.partition("/")
        return namespace == self.namespace and (self.name is None or name == self.name)

    def __str__(self) -> str:
        if self.namespace is None:
            return "all"
        return f"{self.namespace}/{self.name if self.name is not None else '*'}"


def fill_for_node(config: Mapping[str, Any], node: str | None) -> Mapping[str, Any]:
    """Upstream's node patcher, on the decoded config: the node-address placeholder becomes the
    Node's external address (published by the operator), or ``$STUNNER_ADDR`` when the Node has
    none (``stunner_common.contracts.listener_address``)."""
    if not node:
        return config
    return fill_node_address(config, node_fill(node_address(node)))


def node_value(node: str | None) -> str | None:
    """What a watcher of ``node`` gets in place of the placeholder (None: no node, no change)."""
    return node_fill(node_address(node)) if node else None


class Sink(Protocol):
    """A watcher's connection, written to directly (see the module's docstring)."""

    def ready(self) -> bool:
        """True when a frame written now goes out after everything written before it: the
        connection is open, no close has been sent and the write buffer is below its mark."""
        ...

    def write(self, frame: bytes) -> None:
        """Write one whole WebSocket frame; never blocks (the transport buffers)."""
        ...


class Watcher:
    """One subscription: a bounded queue of encoded frames and the reason it was closed."""

    def __init__(self, topic: Topic, mode: Mode, max_queue: int, node: str | None = None) -> None:
        self.topic = topic
        self.mode = mode
        self.node = node if topic.name is not None else None
        self.max_queue = max_queue
        self.frames: deque[str] = deque()
        self.closed_reason: str | None = None
        self.close_code = CLOSE_TRY_AGAIN_LATER
        self.close_kind = "slow"
        """Why the server closed it, as a metrics label (None: no drop worth counting)."""
        self.sending_since: float | None = None
        """Set by the writer task while it sends a batch, in the same step that takes the batch
        (no frame is written directly meanwhile)."""
        self.writer: asyncio.Task[None] | None = None
        self.sink: Sink | None = None
        """Where frames may be written directly once the connection is accepted (None: every
        frame goes through the queue and the writer task)."""
        self.written = 0
        """Frames written directly to the sink."""
        self.superseded = 0
        """Frames replaced in the queue by a newer change of their config before being sent."""
        self._live: dict[str, str] = {}
        """The frame of each config's last change still queued (initial frames are not here:
        they are what a client counts as its snapshot)."""
        self._wakeup = asyncio.Event()

    def offer(self, change: _Encoded) -> bool:
        """Write ``change``'s frame for this watcher's mode and node to the sink when nothing
        is queued or being sent and the sink is ready; otherwise queue it: the frame of the same
        config's previous change, when still queued, is taken out and the change goes in as a
        whole state instead. False: closed, or the queue is full."""
        if self.closed_reason is not None:
            return False
        fill = node_value(self.node) if self.node else None
        if (
            not self.frames
            and self.sending_since is None
            and (sink := self.sink) is not None
            and sink.ready()
        ):
            sink.write(change.wire(self.mode, fill))
            self.written += 1
            return True
        config_id = change.change.id
        frame = change.frame(self.mode, fill)
        if (queued := self._live.pop(config_id, None)) is not None:
            try:
                self.frames.remove(queued)
            except ValueError:  # taken for sending meanwhile
                pass
            else:
                self.superseded += 1
                frame = change.frame(self.mode, fill, whole=True)
        if len(self.frames) >= self.max_queue:
            return False
        self.frames.append(frame)
        self._live[config_id] = frame
        self._wakeup.set()
        return True

    def close(
        self, reason: str, *, code: int = CLOSE_TRY_AGAIN_LATER, kind: str | None = "slow"
    ) -> None:
        """Close with a WebSocket ``code``; ``kind`` labels the drop in metrics (None: none)."""
        if self.closed_reason is None:
            self.closed_reason = reason
            self.close_code = code
            self.close_kind = kind or ""
        self._wakeup.set()

    async def next_batch(self) -> list[str]:
        """Wait for frames (or a close); return and clear the pending frames."""
        while not self.frames and self.closed_reason is None:
            self._wakeup.clear()
            await self._wakeup.wait()
        batch = list(self.frames)
        self.frames.clear()
        self._live.clear()
        return batch


class _Encoded:
    """A change with its v1 frame and v2 envelope encoded lazily, once each per node fill.

    A watcher that names its node gets the config with the node-address placeholder filled in
    (``node_value``); the frame is encoded once for every distinct value, and a change with no
    placeholder shares the plain frame.
    """

    __slots__ = ("_frames", "_placeholder", "_wires", "change", "epoch")

    def __init__(self, change: Change, epoch: str) -> None:
        self.change = change
        self.epoch = epoch
        c = change
        self._placeholder = any(
            cfg is not None and has_node_placeholder(cfg) for cfg in (c.old, c.new)
        )
        self._frames: dict[tuple[Mode, str | None, bool], str] = {}
        self._wires: dict[tuple[Mode, str | None], bytes] = {}

    def frame(self, mode: Mode, fill: str | None = None, *, whole: bool = False) -> str:
        """The change's frame for ``mode`` and node ``fill``; ``whole``: never a patch (what
        replaces a frame of the config's previous change that was never sent)."""
        if not self._placeholder:
            fill = None
        whole = whole and mode is Mode.V2 and self.change.old is not None
        key = (mode, fill, whole)
        frame = self._frames.get(key)
        if frame is None:
            frame = self._frames[key] = self._encode(mode, fill, whole)
        return frame

    def wire(self, mode: Mode, fill: str | None = None) -> bytes:
        """``frame(mode, fill)`` as a whole WebSocket text frame, built once."""
        if not self._placeholder:
            fill = None
        key = (mode, fill)
        wire = self._wires.get(key)
        if wire is None:
            wire = self._wires[key] = text_frame(self.frame(mode, fill).encode())
        return wire

    def _encode(self, mode: Mode, fill: str | None, whole: bool) -> str:
        c = self.change
        old: Mapping[str, Any] | None = c.old
        new: Mapping[str, Any] | None = c.new
        if fill is not None:
            old = None if old is None else fill_node_address(old, fill)
            new = None if new is None else fill_node_address(new, fill)
        if mode is Mode.V1:
            return encode_v1_delete(c.id) if new is None else encode_v1_config(new)
        epoch = self.epoch
        if new is None:
            return encode_delete(c.id, c.rev, epoch)
        if old is None or whole:
            return encode_snapshot(c.id, c.rev, new, epoch)
        patch = encode_patch(c.id, c.rev, json_patch(old, new), epoch)
        if len(patch) <= SHORT_PATCH_BYTES:
            return patch  # no config worth a watch encodes shorter: not encoded to be sure
        snapshot = encode_snapshot(c.id, c.rev, new, epoch)
        return snapshot if len(snapshot) <= len(patch) else patch


class Hub:
    """The mirror plus its watchers. Every method is synchronous and never blocks.

    With ``v1_min_interval_s`` above 0, ``publish`` must run on an event loop: a held v1 change is
    sent by a timer on it."""

    def __init__(
        self,
        mirror: ConfigMirror | None = None,
        *,
        max_queue: int = 256,
        v1_min_interval_s: float = 0.0,
    ) -> None:
        self.mirror = mirror if mirror is not None else ConfigMirror()
        self.max_queue = max_queue
        self.v1_min_interval_s = v1_min_interval_s
        self._v1_watchers = 0
        self._v1_sent: dict[str, float] = {}
        """When each config's v1 watchers were last sent a change (the loop's clock)."""
        self._v1_pending: dict[str, tuple[Change, asyncio.TimerHandle]] = {}
        """The newest change of a config held back from its v1 watchers, and its timer."""
        self._all: set[Watcher] = set()
        self._by_namespace: dict[str, set[Watcher]] = {}
        self._by_id: dict[str, set[Watcher]] = {}
        self._unresumable_epoch: str | None = None
        """An epoch whose store was rolled back: its revisions no longer name one state."""
        self.on_fanout: Callable[[float], None] | None = None
        """Told, for each change published, the seconds it took to hand to every watcher."""
        self.on_v1_held: Callable[[], None] | None = None
        """Told of each change a config's v1 watchers never get, a newer one sent in its place."""

    # --- subscriptions -------------------------------------------------------------------------

    def subscribe(
        self,
        topic: Topic,
        mode: Mode,
        *,
        since: int | None = None,
        epoch: str | None = None,
        node: str | None = None,
        max_queue: int | None = None,
    ) -> tuple[Watcher, bool]:
        """Register a watcher with its initial frames queued; also return True for a delta resync.

        A v2 ``since`` is honoured when it counts in the mirror's epoch and is not ahead of the
        mirror (then only what changed after it is queued); otherwise the watcher gets the full
        snapshot, in revision order. The initial frames do not count against ``max_queue``: the
        bound grows by their number, so that a snapshot of many configs never gets a new watcher
        dropped as slow.
        """
        watcher = Watcher(topic, mode, max_queue or self.max_queue, node)
        mirror = self.mirror
        delta = (
            mode is Mode.V2
            and since is not None
            and epoch == mirror.epoch
            and epoch != self._unresumable_epoch
            and 0 <= since <= mirror.rev
        )
        if delta:
            assert since is not None
            changed, deleted = mirror.changed_since(since)
            updates = [
                (rev, encode_delete(config_id, rev, mirror.epoch))
                for config_id, rev in deleted
                if topic.matches(config_id)
            ]
            updates += [
                (
                    entry.rev,
                    encode_snapshot(
                        config_id,
                        entry.rev,
                        fill_for_node(entry.config, watcher.node),
                        mirror.epoch,
                    ),
                )
                for config_id, entry in changed
                if topic.matches(config_id)
            ]
            watcher.frames.extend(frame for _, frame in sorted(updates, key=lambda u: u[0]))
        elif mode is Mode.V1:
            for _, entry in self.matching(topic):
                frame = encode_v1_config(fill_for_node(entry.config, watcher.node))
                watcher.frames.append(frame)
        else:
            for config_id, entry in sorted(self.matching(topic), key=lambda m: m[1].rev):
                config = fill_for_node(entry.config, watcher.node)
                frame = encode_snapshot(config_id, entry.rev, config, mirror.epoch)
                watcher.frames.append(frame)
        watcher.max_queue += len(watcher.frames)
        if mode is Mode.V1:
            self._v1_watchers += 1
        if topic.namespace is None:
            self._all.add(watcher)
        elif topic.name is None:
            self._by_namespace.setdefault(topic.namespace, set()).add(watcher)
        else:
            self._by_id.setdefault(f"{topic.namespace}/{topic.name}", set()).add(watcher)
        return watcher, delta

    def unsubscribe(self, watcher: Watcher) -> None:
        topic = watcher.topic
        if watcher.mode is Mode.V1 and watcher in self._group(watcher):
            self._v1_watchers -= 1
        if topic.namespace is None:
            self._all.discard(watcher)
        elif topic.name is None:
            group = self._by_namespace.get(topic.namespace)
            if group is not None:
                group.discard(watcher)
                if not group:
                    del self._by_namespace[topic.namespace]
        else:
            key = f"{topic.namespace}/{topic.name}"
            group = self._by_id.get(key)
            if group is not None:
                group.discard(watcher)
                if not group:
                    del self._by_id[key]

    def _group(self, watcher: Watcher) -> set[Watcher]:
        topic = watcher.topic
        if topic.namespace is None:
            return self._all
        if topic.name is None:
            return self._by_namespace.get(topic.namespace, set())
        return self._by_id.get(f"{topic.namespace}/{topic.name}", set())

    def watchers(self) -> Iterable[Watcher]:
        yield from self._all
        for group in self._by_namespace.values():
            yield from group
        for group in self._by_id.values():
            yield from group

    def watcher_count(self) -> int:
        return (
            len(self._all)
            + sum(len(g) for g in self._by_namespace.values())
            + sum(len(g) for g in self._by_id.values())
        )

    def close_all(self, reason: str) -> None:
        for _, timer in self._v1_pending.values():
            timer.cancel()
        self._v1_pending.clear()
        for watcher in list(self.watchers()):
            watcher.close(reason, code=CLOSE_GOING_AWAY, kind=None)
            self.unsubscribe(watcher)

    def reset(self, reason: str) -> int:
        """The store lost its history: close every v2 watcher (it resyncs from a snapshot).

        Returns how many were closed. v1 watchers stay: they never hold a revision.
        """
        closed = 0
        for watcher in list(self.watchers()):
            if watcher.mode is Mode.V2:
                watcher.close(reason, code=CLOSE_SERVICE_RESTART, kind="store_reset")
                self.unsubscribe(watcher)
                closed += 1
        return closed

    # --- reads ---------------------------------------------------------------------------------

    def matching(self, topic: Topic) -> list[tuple[str, Entry]]:
        return sorted((i, e) for i, e in self.mirror.entries.items() if topic.matches(i))

    # --- fan-out -------------------------------------------------------------------------------

    def publish(self, changes: Iterable[Change]) -> int:
        """Hand each change to every matching watcher (written, or queued); return how many
        frames were. ``on_fanout`` is told the time of each hand-out that reached a watcher. A
        change held back from v1 watchers (``v1_min_interval_s``) goes to the v2 ones alone, and
        to the v1 ones when it is released (a hand-out timed of its own)."""
        queued = 0
        clock = time.perf_counter
        for change in changes:
            started = clock()
            targets = self._targets(change.id)
            skip = Mode.V1 if targets and self._hold_for_v1(change) else None
            handed = self._hand_out(change, targets, skip=skip)
            if self.on_fanout is not None and handed:
                self.on_fanout(clock() - started)
            queued += handed
        return queued

    def _targets(self, config_id: str) -> list[Watcher]:
        namespace = config_id.partition("/")[0]
        return [
            *self._all,
            *self._by_namespace.get(namespace, ()),
            *self._by_id.get(config_id, ()),
        ]

    def _hand_out(
        self,
        change: Change,
        targets: list[Watcher],
        *,
        skip: Mode | None = None,
        only: Mode | None = None,
    ) -> int:
        encoded = _Encoded(change, self.mirror.epoch)
        queued = 0
        for watcher in targets:
            if watcher.mode is skip or (only is not None and watcher.mode is not only):
                continue
            if watcher.offer(encoded):
                queued += 1
            elif watcher.closed_reason is None:
                self._drop(watcher)
        return queued

    def _hold_for_v1(self, change: Change) -> bool:
        """True when ``change`` is held back from the config's v1 watchers: they were sent one
        less than ``v1_min_interval_s`` ago. The held change is sent when the interval is up, unless
        a newer one replaces it first."""
        if self.v1_min_interval_s <= 0 or not self._v1_watchers:
            return False
        config_id = change.id
        pending = self._v1_pending.get(config_id)
        if pending is not None:
            self._v1_pending[config_id] = (change, pending[1])
            if self.on_v1_held is not None:
                self.on_v1_held()
            return True
        loop = asyncio.get_running_loop()
        now = loop.time()
        last = self._v1_sent.get(config_id)
        if last is None or now - last >= self.v1_min_interval_s:
            self._v1_sent[config_id] = now
            self._forget_v1_times(now)
            return False
        timer = loop.call_at(last + self.v1_min_interval_s, self._release_v1, config_id)
        self._v1_pending[config_id] = (change, timer)
        return True

    def _release_v1(self, config_id: str) -> None:
        """The interval is up: the held change goes to the config's v1 watchers."""
        pending = self._v1_pending.pop(config_id, None)
        if pending is None:
            return
        self._v1_sent[config_id] = asyncio.get_running_loop().time()
        started = time.perf_counter()
        if self._hand_out(pending[0], self._targets(config_id), only=Mode.V1) and self.on_fanout:
            self.on_fanout(time.perf_counter() - started)

    def _forget_v1_times(self, now: float) -> None:
        """Keep ``_v1_sent`` as small as the configs: a time older than the interval holds
        nothing back, so it goes once there are more times than configs."""
        if len(self._v1_sent) > 2 * len(self.mirror.entries) + 64:
            horizon = now - self.v1_min_interval_s
            for config_id in [i for i, t in self._v1_sent.items() if t < horizon]:
                del self._v1_sent[config_id]

    def reload(self, snapshot: Snapshot) -> int:
        """Load ``snapshot`` into the mirror and publish what differs; return how many v2
        watchers a store reset closed (see ``ConfigMirror.is_reset``)."""
        closed = 0
        if self.mirror.is_reset(snapshot):
            if snapshot.epoch == self.mirror.epoch:
                self._unresumable_epoch = snapshot.epoch
            closed = self.reset(f"config store reset (epoch {snapshot.epoch or 'none'}): resync")
        self.publish(self.mirror.load(snapshot))
        return closed

    def apply(self, events: Iterable[StoreEvent]) -> None:
        """Apply stream entries in order and publish their changes.

        Raises ``StreamGapError`` (``StoreResetError`` for another epoch) at the first entry
        that does not follow, after publishing what came before it: reload then.
        """
        changes: list[Change] = []
        try:
            for event in events:
                change = self.mirror.apply(event)
                if change is not None:
                    changes.append(change)
        finally:
            self.publish(changes)

    def _drop(self, watcher: Watcher) -> None:
        log.warning(
            "dropping a slow %s watcher of %s: %d frames queued",
            watcher.mode.value,
            watcher.topic,
            len(watcher.frames),
        )
        watcher.close(f"watcher too slow: more than {watcher.max_queue} frames queued")
        self.unsubscribe(watcher)
