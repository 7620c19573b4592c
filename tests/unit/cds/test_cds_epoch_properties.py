"""Property tests of epochs and revisions: the CDS's mirror and hub against the client's state.

A model of the Redis store (the publisher's rules: a store without an epoch gets a fresh one at
the next write, a store rolled back under the publisher gets one too) is driven through any
interleaving of edits, deletes, stores that come back empty or rolled back, trimmed streams, two
CDS replicas that catch up at their own pace (tail, reconnect, reload, exactly as the feed
decides), and a client that connects to either, reads some frames, drops, and resumes with
whatever ``since``/``epoch`` it holds. Whatever happened, once everything settles the client holds
exactly the store's configs, and it never holds a revision higher than its epoch ever had.
No sockets: the frames are the strings the hub queues, parsed as a client parses them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from hypothesis import example, given, settings
from hypothesis import strategies as st

from stunner_cds.store.hub import Hub, Mode, Topic, Watcher
from stunner_cds.store.mirror import StreamGapError
from stunner_common.cds import CdsProtocolError, DeltaState, parse_envelope
from stunner_common.io.store import Position, Snapshot, StoreEvent

IDS = ("ns/a", "ns/b", "other/c")


@dataclass
class Store:
    """Redis as the publisher's Lua scripts leave it (configs, revs, counter, stream, epoch)."""

    configs: dict[str, str] = field(default_factory=dict)
    revs: dict[str, int] = field(default_factory=dict)
    counter: int = 0
    epoch: str = ""
    events: list[StoreEvent] = field(default_factory=list)
    history: list[Store] = field(default_factory=list)
    max_rev: dict[str, int] = field(default_factory=dict)
    """Per epoch ever used, the highest revision it gave out."""
    clock: int = 0
    epochs: int = 0
    known: dict[str, int] = field(default_factory=dict)  # the publisher's epoch -> max revision

    def _stream_id(self) -> str:
        self.clock += 1  # Redis stream ids grow with the server's clock, across restarts too
        return f"{self.clock}-0"

    def _ensure_epoch(self) -> None:
        if not self.epoch or self.counter < self.known.get(self.epoch, 0):
            self.epochs += 1
            self.epoch = f"e{self.epochs}"  # what the store holds is renumbered into it
            self.max_rev[self.epoch] = self.counter

    def write(self, config_id: str, value: int | None) -> None:
        self.history.append(self.copy())
        self._ensure_epoch()
        text = None if value is None else json.dumps({"id": config_id, "v": value})
        current = self.configs.get(config_id)
        if text == current or (text is None and current is None):
            self.known.setdefault(self.epoch, 0)
            return
        self.counter += 1
        if text is None:
            del self.configs[config_id]
        else:
            self.configs[config_id] = text
        self.revs[config_id] = self.counter
        op: Literal["upsert", "delete"] = "delete" if text is None else "upsert"
        event = StoreEvent(self._stream_id(), op, config_id, self.counter, text or "", self.epoch)
        self.events.append(event)
        self.max_rev[self.epoch] = max(self.max_rev.get(self.epoch, 0), self.counter)
        self.known[self.epoch] = max(self.known.get(self.epoch, 0), self.counter)

    def copy(self) -> Store:
        return Store(
            dict(self.configs), dict(self.revs), self.counter, self.epoch, list(self.events)
        )

    def wipe(self) -> None:
        """Redis came back empty (or was flushed)."""
        self.configs, self.revs, self.counter, self.epoch, self.events = {}, {}, 0, "", []

    def roll_back(self, steps: int) -> None:
        """An older copy of the store came back (same epoch, fewer revisions)."""
        if not self.history:
            return
        old = self.history[max(0, len(self.history) - steps)]
        self.configs, self.revs, self.counter = dict(old.configs), dict(old.revs), old.counter
        self.epoch, self.events = old.epoch, list(old.events)

    def trim(self) -> None:
        self.events = self.events[-1:]

    def snapshot(self) -> Snapshot:
        last = self.events[-1].event_id if self.events else "0-0"
        return Snapshot(dict(self.configs), dict(self.revs), self.counter, last, self.epoch)

    def after(self, event_id: str) -> list[StoreEvent]:
        return [e for e in self.events if _key(e.event_id) > _key(event_id)]


def _key(event_id: str) -> tuple[int, int]:
    ms, _, seq = event_id.partition("-")
    return int(ms), int(seq or 0)


class Replica:
    """One CDS: a hub whose mirror follows the store the way ``RedisFeed`` does."""

    def __init__(self) -> None:
        self.hub = Hub(max_queue=1_000)

    def reconnect(self, store: Store) -> None:
        """``RedisFeed._resync``: tail on where the stream continues, else reload."""
        mirror = self.hub.mirror
        following = None
        if mirror.loaded and store.epoch == mirror.epoch and store.counter > mirror.rev:
            after = store.after(mirror.last_event_id)
            following = after[0].rev if after else None
        if mirror.resync_reason(Position(store.epoch, store.counter), following) is not None:
            self.hub.reload(store.snapshot())

    def tail(self, store: Store, count: int) -> None:
        """One ``RedisFeed._tail`` read of up to ``count`` entries (or the idle epoch check)."""
        mirror = self.hub.mirror
        batch = store.after(mirror.last_event_id)[:count]
        if not batch:
            if store.epoch != mirror.epoch:
                self.hub.reload(store.snapshot())
            return
        try:
            self.hub.apply(batch)
        except StreamGapError:
            self.hub.reload(store.snapshot())
            return
        mirror.skip_to(batch[-1].event_id)

    def settle(self, store: Store) -> None:
        self.reconnect(store)
        for _ in range(len(store.events) + 2):
            self.tail(store, 1_000)


class Client:
    """A v2 watcher: ``CdsClient.watch``'s decisions around a ``DeltaState``."""

    def __init__(self, topic: Topic) -> None:
        self.topic = topic
        self.state = DeltaState()
        self.watcher: Watcher | None = None
        self.replica: Replica | None = None
        self.fresh = False

    def connect(self, replica: Replica) -> None:
        self.disconnect()
        resume = None if self.fresh else self.state.resume_params()
        self.fresh = False
        since = int(resume["since"]) if resume else None
        epoch = resume.get("epoch") if resume else None
        self.watcher, delta = replica.hub.subscribe(self.topic, Mode.V2, since=since, epoch=epoch)
        self.replica = replica
        try:
            self.state.begin(
                delta=delta,
                epoch=replica.hub.mirror.epoch,
                rev=replica.hub.mirror.rev,
                frames=len(self.watcher.frames),
            )
        except CdsProtocolError:
            self.drop(fresh=True)

    def receive(self, count: int) -> None:
        watcher = self.watcher
        if watcher is None:
            return
        if watcher.closed_reason is not None:  # queued frames die with the connection
            self.drop()
            return
        for _ in range(count):
            if not watcher.frames:
                return
            try:
                self.state.apply(parse_envelope(watcher.frames.popleft()))
            except CdsProtocolError:
                self.drop(fresh=True)
                return

    def drop(self, *, fresh: bool = False) -> None:
        self.disconnect()
        self.fresh = self.fresh or fresh

    def disconnect(self) -> None:
        if self.watcher is not None and self.replica is not None:
            self.replica.hub.unsubscribe(self.watcher)
        self.watcher = None
        self.replica = None


write = st.tuples(st.sampled_from(IDS), st.none() | st.integers(0, 9))
step = st.one_of(
    st.tuples(st.just("write"), st.lists(write, min_size=1, max_size=8)),
    st.tuples(st.just("wipe"), st.booleans()),
    st.tuples(st.just("roll_back"), st.integers(1, 4)),
    st.tuples(st.just("trim")),
    st.tuples(st.just("reconnect"), st.integers(0, 1)),
    st.tuples(st.just("tail"), st.integers(0, 1), st.integers(1, 3)),
    st.tuples(st.just("settle"), st.integers(0, 1)),
    st.tuples(st.just("connect"), st.integers(0, 1)),
    st.tuples(st.just("catch_up"), st.integers(0, 1)),
    st.tuples(st.just("receive"), st.integers(1, 4)),
    st.tuples(st.just("disconnect")),
)

topics = st.sampled_from([Topic(), Topic("ns"), Topic("ns", "a")])


def run(steps: list[tuple[Any, ...]], topic: Topic) -> tuple[Store, list[Replica], Client]:
    store = Store()
    replicas = [Replica(), Replica()]
    for replica in replicas:
        replica.reconnect(store)
    client = Client(topic)
    for op, *args in steps:
        if op == "write":
            for config_id, value in args[0]:
                store.write(config_id, value)
        elif op == "wipe":
            published = dict(store.configs)
            store.wipe()
            if args[0]:  # the operator notices and publishes its whole set again
                for config_id, text in sorted(published.items()):
                    store.write(config_id, json.loads(text)["v"])
        elif op == "roll_back":
            store.roll_back(args[0])
        elif op == "trim":
            store.trim()
        elif op == "reconnect":
            replicas[args[0]].reconnect(store)
        elif op == "tail":
            replicas[args[0]].tail(store, args[1])
        elif op == "settle":
            replicas[args[0]].settle(store)
        elif op == "connect":
            client.connect(replicas[args[0]])
        elif op == "catch_up":  # the replica and then the client are up to date
            replicas[args[0]].settle(store)
            if client.replica is not replicas[args[0]]:
                client.connect(replicas[args[0]])
            client.receive(10_000)
        elif op == "receive":
            client.receive(args[0])
        else:
            client.disconnect()
        state = client.state
        if state.epoch:
            assert state.rev <= store.max_rev.get(state.epoch, 0), "a revision of another epoch"
    return store, replicas, client


def settle(store: Store, replicas: list[Replica], client: Client, via: int) -> None:
    for replica in replicas:
        replica.settle(store)
    for _ in range(4):
        if client.watcher is None or client.watcher.closed_reason is not None:
            client.connect(replicas[via])
        client.receive(10_000)
        if client.watcher is not None and client.watcher.closed_reason is None:
            return
    raise AssertionError("the client never got a watch that stays open")


@settings(max_examples=1000, deadline=None)
@given(st.lists(step, max_size=40), topics, st.integers(0, 1))
# A client that caught up below the mirror's revision (the last write was a delete of a config it
# never got), then the store rolled back past that delete within its epoch: resuming there would
# miss the config the rollback brought back.
@example(
    [
        ("write", [("ns/b", 0), ("ns/a", 0), ("ns/b", None)]),
        ("connect", 0),
        ("catch_up", 0),
        ("roll_back", 1),
    ],
    Topic(None, None),
    0,
)
def test_any_interleaving_ends_with_the_client_holding_the_store_configs(
    steps: list[tuple[Any, ...]], topic: Topic, via: int
) -> None:
    store, replicas, client = run(steps, topic)
    settle(store, replicas, client, via)
    expected = {i: json.loads(t) for i, t in store.configs.items() if topic.matches(i)}
    assert client.state.configs == expected
    assert client.state.epoch in (store.epoch, None) or not expected
    # And it stays in step: one more edit of every id reaches it.
    for config_id in IDS:
        store.write(config_id, 99)
    settle(store, replicas, client, via)
    expected = {i: json.loads(t) for i, t in store.configs.items() if topic.matches(i)}
    assert client.state.configs == expected


away_event = st.one_of(
    st.tuples(st.just("write"), st.lists(write, min_size=1, max_size=8)),
    st.tuples(st.just("wipe"), st.booleans()),
    st.tuples(st.just("roll_back"), st.integers(1, 4)),
    st.tuples(st.just("trim")),
    st.tuples(st.just("settle"), st.integers(0, 1)),
)


@settings(max_examples=400, deadline=None)
@given(
    st.lists(write, max_size=12),
    st.lists(away_event, min_size=1, max_size=10),
    topics,
    st.integers(0, 1),
    st.integers(0, 1),
)
def test_a_client_away_while_the_store_is_reset_comes_back_to_the_new_history(
    before: list[tuple[str, int | None]],
    away: list[tuple[Any, ...]],
    topic: Topic,
    left: int,
    returns_to: int,
) -> None:
    """The issue's case with any numbers: whatever the store went through while the client
    was away (paused, partitioned), it comes back holding the store's configs."""
    steps: list[tuple[Any, ...]] = [("write", before)] if before else []
    steps += [("catch_up", left), ("disconnect",), *away]
    store, replicas, client = run(steps, topic)
    settle(store, replicas, client, returns_to)
    expected = {i: json.loads(t) for i, t in store.configs.items() if topic.matches(i)}
    assert client.state.configs == expected


def test_a_client_away_during_a_reset_gets_the_new_history_whatever_its_numbers() -> None:
    """The issue's case: revision N of the old history, a new history that passed N."""
    store = Store()
    replica = Replica()
    replica.reconnect(store)
    for value in range(5):
        store.write("ns/a", value)  # ns/a at revision 5: the client resumes with since=5
    replica.settle(store)
    client = Client(Topic("ns", "a"))
    client.connect(replica)
    client.receive(100)
    assert client.state.rev == 5
    client.disconnect()
    store.wipe()
    store.write("ns/a", 100)  # the revoked value, now at revision 1 of a new epoch
    for value in range(6):
        store.write("other/c", value)  # the new numbering passes 5
    replica.settle(store)
    client.connect(replica)
    client.receive(100)
    assert client.state.configs == {"ns/a": {"id": "ns/a", "v": 100}}
    assert client.state.epoch == store.epoch
