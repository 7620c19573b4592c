"""Direct writes: a change's frame built once and written straight to every idle watcher's
connection, the queue for every other, and never a frame overtaking an earlier one."""

from __future__ import annotations

import json

import pytest
from websockets.frames import Frame, Opcode
from websockets.streams import StreamReader

from stunner_cds.store.frames import text_frame
from stunner_cds.store.hub import Hub, Mode, Topic
from stunner_cds.store.mirror import ConfigMirror
from stunner_common.cds import DeltaState, parse_envelope
from stunner_common.io.store import Snapshot, StoreEvent

EPOCH = "e-direct"


def parse_frames(data: bytes) -> list[Frame]:
    """Frames as a client parses them: websockets' own parser, expecting no mask."""
    reader = StreamReader()
    reader.feed_data(data)
    frames = []
    while True:
        parser = Frame.parse(reader.read_exact, mask=False)
        try:
            next(parser)
        except StopIteration as done:
            frames.append(done.value)
            continue
        return frames


@pytest.mark.parametrize("size", [0, 1, 125, 126, 127, 65535, 65536, 300_000])
def test_a_text_frame_parses_back_to_its_payload(size: int) -> None:
    payload = ("é" * size).encode()[:size]
    frames = parse_frames(text_frame(payload) + text_frame(b"next"))
    assert [(f.opcode, f.fin, f.data) for f in frames] == [
        (Opcode.TEXT, True, payload),
        (Opcode.TEXT, True, b"next"),
    ]


class RecordingSink:
    """A connection that takes whatever is written while ``open`` says it can."""

    def __init__(self) -> None:
        self.open = True
        self.data = bytearray()

    def ready(self) -> bool:
        return self.open

    def write(self, frame: bytes) -> None:
        self.data += frame

    def texts(self) -> list[str]:
        return [bytes(f.data).decode() for f in parse_frames(bytes(self.data))]


def hub_with(config_id: str) -> Hub:
    mirror = ConfigMirror()
    text = json.dumps(cfg(config_id, "r-0"))
    mirror.load(Snapshot({config_id: text}, {config_id: 1}, 1, "1-0", EPOCH))
    return Hub(mirror, max_queue=4)


def cfg(config_id: str, realm: str) -> dict[str, object]:
    return {"version": "v1", "admin": {"name": config_id}, "auth": {"realm": realm}}


def change(hub: Hub, config_id: str, realm: str) -> None:
    rev = hub.mirror.rev + 1
    text = json.dumps(cfg(config_id, realm))
    c = hub.mirror.apply(StoreEvent(f"{rev}-1", "upsert", config_id, rev, text, EPOCH))
    hub.publish([c] if c else [])


def realms(texts: list[str]) -> list[str]:
    return [json.loads(t)["auth"]["realm"] for t in texts]


def test_an_idle_watcher_gets_each_change_written_and_nothing_queued() -> None:
    hub = hub_with("ns/gw")
    watcher, _ = hub.subscribe(Topic("ns", "gw"), Mode.V1)
    watcher.frames.clear()  # its snapshot, as the writer would have sent it
    watcher.sink = sink = RecordingSink()
    for i in range(1, 4):
        change(hub, "ns/gw", f"r-{i}")
    assert realms(sink.texts()) == ["r-1", "r-2", "r-3"]
    assert not watcher.frames
    assert watcher.written == 3


def test_one_change_is_one_frame_object_for_every_idle_watcher() -> None:
    hub = hub_with("ns/gw")
    watchers = [hub.subscribe(Topic(), Mode.V1)[0] for _ in range(3)]
    written: list[bytes] = []

    class Keeping(RecordingSink):
        def write(self, frame: bytes) -> None:
            written.append(frame)

    for w in watchers:
        w.frames.clear()
        w.sink = Keeping()
    change(hub, "ns/gw", "r-1")
    assert len(written) == 3
    assert all(frame is written[0] for frame in written)


def test_a_watcher_with_frames_queued_queues_until_the_writer_has_sent_them() -> None:
    hub = hub_with("ns/gw")
    watcher, _ = hub.subscribe(Topic(), Mode.V1)  # its snapshot is still queued
    watcher.sink = sink = RecordingSink()
    change(hub, "ns/other", "o-1")
    change(hub, "ns/gw", "r-1")
    assert sink.data == b""  # behind the snapshot, in order
    assert realms(list(watcher.frames)) == ["r-0", "o-1", "r-1"]


async def test_nothing_is_written_while_the_writer_sends_a_batch() -> None:
    hub = hub_with("ns/gw")
    watcher, _ = hub.subscribe(Topic(), Mode.V1)
    watcher.sink = sink = RecordingSink()
    batch = await watcher.next_batch()
    watcher.sending_since = 1.0  # what the writer sets in the step that took the batch
    change(hub, "ns/gw", "r-1")
    assert sink.data == b""
    assert realms(batch) == ["r-0"]
    watcher.sending_since = None  # batch sent
    assert realms(await watcher.next_batch()) == ["r-1"]
    change(hub, "ns/gw", "r-2")
    assert realms(sink.texts()) == ["r-2"]


def test_a_connection_that_cannot_take_a_frame_gets_it_queued_and_superseded() -> None:
    hub = hub_with("ns/gw")
    watcher, _ = hub.subscribe(Topic(), Mode.V1)
    watcher.frames.clear()
    watcher.sink = sink = RecordingSink()
    sink.open = False  # above the high-water mark, or closing
    change(hub, "ns/gw", "r-1")
    change(hub, "ns/gw", "r-2")
    sink.open = True
    change(hub, "ns/gw", "r-3")  # still queued behind: the queue is not empty
    assert sink.data == b""
    assert realms(list(watcher.frames)) == ["r-3"]
    assert watcher.superseded == 2


def test_a_closed_watcher_gets_nothing_written() -> None:
    hub = hub_with("ns/gw")
    watcher, _ = hub.subscribe(Topic(), Mode.V1)
    watcher.frames.clear()
    watcher.sink = sink = RecordingSink()
    watcher.close("going")
    change(hub, "ns/gw", "r-1")
    assert sink.data == b""


def test_v2_frames_written_directly_apply_as_patches_onto_the_snapshot() -> None:
    hub = hub_with("ns/gw")
    watcher, _ = hub.subscribe(Topic("ns", "gw"), Mode.V2)
    state = DeltaState()
    for frame in watcher.frames:
        state.apply(parse_envelope(frame))
    watcher.frames.clear()
    watcher.sink = sink = RecordingSink()
    for i in range(1, 4):
        change(hub, "ns/gw", f"r-{i}")
    envelopes = [parse_envelope(t) for t in sink.texts()]
    assert [e.type for e in envelopes] == ["patch", "patch", "patch"]
    for envelope in envelopes:
        state.apply(envelope)
    assert state.configs["ns/gw"]["auth"]["realm"] == "r-3"


def test_the_fanout_of_each_change_with_watchers_is_reported() -> None:
    hub = hub_with("ns/gw")
    took: list[float] = []
    hub.on_fanout = took.append
    change(hub, "ns/gw", "r-1")  # no watcher yet
    assert took == []
    watchers = [hub.subscribe(Topic("ns"), Mode.V1)[0] for _ in range(3)]
    for w in watchers[:2]:
        w.frames.clear()
        w.sink = RecordingSink()
    change(hub, "ns/gw", "r-2")
    change(hub, "other/gw", "o-1")  # not the watchers' namespace
    change(hub, "ns/gw", "r-3")
    assert len(took) == 2
    assert all(0 <= t < 5 for t in took)
