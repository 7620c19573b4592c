"""Random and mutated STUN/ChannelData bytes never make the engine raise or allocate unasked."""

from __future__ import annotations

import pytest
from aioice import stun
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stunnerd.turn import codec
from stunnerd.turn import effects as fx
from stunnerd.turn.engine import Policies, TurnEngine
from stunnerd.turn.policies import AllowAllPeers, StaticAuthenticator, UserQuota

CLIENT = ("192.0.2.9", 4000)


def engine() -> TurnEngine:
    return TurnEngine(
        relay_ip="192.0.2.1",
        nonce_secret=b"n" * 32,
        policies=Policies(StaticAuthenticator("r", "u", "p"), AllowAllPeers(), UserQuota()),
    )


def seeds() -> list[bytes]:
    out = []
    requests: list[tuple[stun.Method, dict[str, object]]] = [
        (stun.Method.BINDING, {}),
        (stun.Method.ALLOCATE, {"REQUESTED-TRANSPORT": 17 << 24, "LIFETIME": 600}),
        (stun.Method.CHANNEL_BIND, {"CHANNEL-NUMBER": 0x4000, "XOR-PEER-ADDRESS": ("1.2.3.4", 5)}),
        (stun.Method.CREATE_PERMISSION, {"XOR-PEER-ADDRESS": ("::1", 5)}),
    ]
    for method, attrs in requests:
        msg = stun.Message(method, stun.Class.REQUEST, attributes=dict(attrs))
        msg.attributes.update({"USERNAME": "u", "REALM": "r", "NONCE": b"0" * 40})
        msg.add_message_integrity(b"k" * 16)
        out.append(bytes(msg))
    send = stun.Message(
        stun.Method.SEND,
        stun.Class.INDICATION,
        attributes={"XOR-PEER-ADDRESS": ("1.2.3.4", 5), "DATA": b"hi"},
    )
    out.append(bytes(send))
    out.append(b"\x40\x00\x00\x04data")
    return out


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(seeds())))
    for _ in range(draw(st.integers(1, 8))):
        op = draw(st.integers(0, 2))
        if op == 0 and data:
            i = draw(st.integers(0, len(data) - 1))
            data[i] = draw(st.integers(0, 255))
        elif op == 1 and data:
            cut = draw(st.integers(0, len(data)))
            del data[cut:]
        else:
            data += draw(st.binary(max_size=16))
    return bytes(data)


PAYLOADS = st.one_of(st.binary(max_size=200), mutated())


def check(data: bytes) -> None:
    fast = codec.parse_send_indication(data)
    if fast is not None:  # the hand parser never disagrees with the full decoder
        full = codec.decode(data).message
        assert full.message_method == stun.Method.SEND
        assert (full.attributes["XOR-PEER-ADDRESS"], full.attributes["DATA"]) == fast
    eng = engine()
    effects = eng.handle_client(data, CLIENT, 1000.0)
    assert not any(isinstance(e, fx.OpenRelay) for e in effects)  # nobody authenticated
    assert eng.allocation_count == 0
    for effect in effects:
        assert isinstance(effect, fx.SendToClient)
    eng.tick(5000.0)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(PAYLOADS)
def test_random_and_mutated_bytes_never_raise_or_allocate(data: bytes) -> None:
    check(data)


@pytest.mark.slow
@settings(max_examples=20_000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(PAYLOADS)
def test_random_and_mutated_bytes_never_raise_or_allocate_long_run(data: bytes) -> None:
    check(data)
