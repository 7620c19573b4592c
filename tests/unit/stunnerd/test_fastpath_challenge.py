"""The first Allocate of an allocation (no credentials yet) challenged by the C fast path: the
engine's own 401, byte for byte, read back by aioice's decoder (which checks FINGERPRINT); what
the engine would not answer that way left to it untouched; the challenge budget per source shared
with the engine. Real sockets on the loopback addresses, ports chosen by the kernel."""

from __future__ import annotations

import hashlib
import socket
import struct
import time
from collections.abc import Iterator
from typing import Any

import pytest
from aioice import stun

from stunnerd import fastpath
from stunnerd.turn import effects as fx
from stunnerd.turn.engine import Policies, TurnEngine
from stunnerd.turn.policies import AllowAllPeers, NoAuthenticator, StaticAuthenticator, UserQuota
from support.c_relay import fast_relay, poll, udp_socket, watched_listener

pytestmark = pytest.mark.skipif(not fastpath.available(), reason="stunnerd._fastpath not built")

SOFTWARE = "stunnerd/challenge-test"
REALM = "stunner.l7mp.io"
MAX_STUN = 1500
NOW = 5_000.0
ALLOCATE, REFRESH = 0x0003, 0x0004


@pytest.fixture
def relay() -> Iterator[Any]:
    with fast_relay() as r:
        yield r


def _engine(auth: Any = None) -> TurnEngine:
    policies = Policies(
        auth or StaticAuthenticator(REALM, "user1", "pass1"), AllowAllPeers(), UserQuota(0)
    )
    return TurnEngine(
        relay_ip="127.0.0.1", nonce_secret=b"k" * 32, policies=policies, software=SOFTWARE
    )


def _listener(relay: Any, engine: TurnEngine, host: str = "127.0.0.1") -> socket.socket:
    sock = watched_listener(relay, host, MAX_STUN)
    relay.answer_challenges(sock.fileno(), engine.challenge_template(NOW) or b"", 30.0)
    return sock


def _allocate(**attributes: Any) -> stun.Message:
    message = stun.Message(stun.Method.ALLOCATE, stun.Class.REQUEST)
    message.attributes["REQUESTED-TRANSPORT"] = 17 << 24  # UDP, then three bytes RFFU
    message.attributes.update(attributes)
    return message


def _engine_answer(engine: TurnEngine, request: bytes, client: tuple[str, int]) -> bytes:
    (effect,) = engine.handle_client(request, client, NOW)
    assert isinstance(effect, fx.SendToClient)
    return effect.data


def test_an_allocate_without_credentials_gets_the_engine_s_401_from_c(
    relay: Any, aioice_turn_attributes: None
) -> None:
    engine = _engine()
    listener, client = _listener(relay, engine), udp_socket("127.0.0.1")
    request = bytes(_allocate())
    client.sendto(request, listener.getsockname())
    assert poll(relay) == []
    answer, source = client.recvfrom(2048)
    assert source == listener.getsockname()
    message = stun.parse_message(answer)  # raises on a wrong FINGERPRINT
    assert (message.message_method, message.message_class) == (
        stun.Method.ALLOCATE,
        stun.Class.ERROR,
    )
    assert message.transaction_id == request[8:20]
    assert message.attributes["ERROR-CODE"] == (401, "Unauthorized")
    assert message.attributes["REALM"] == REALM
    assert answer == _engine_answer(engine, request, client.getsockname())
    assert relay.stats()["challenged"] == 1
    assert relay.take_drops(listener.fileno()) == (0, 0, 0)


def test_the_nonce_c_hands_out_is_one_the_engine_accepts(
    relay: Any, aioice_turn_attributes: None
) -> None:
    engine = _engine()
    listener, client = _listener(relay, engine, "::1"), udp_socket("::1")
    client.sendto(bytes(_allocate()), listener.getsockname()[:2])
    assert poll(relay) == []
    challenge = stun.parse_message(client.recv(2048))
    key = hashlib.md5(f"user1:{REALM}:pass1".encode()).digest()
    signed = _allocate(USERNAME="user1", REALM=REALM, NONCE=challenge.attributes["NONCE"])
    signed.add_message_integrity(key)
    effects = engine.handle_client(bytes(signed), client.getsockname()[:2], NOW + 1)
    assert [type(e) for e in effects] == [fx.OpenRelay]  # no 401 or 438: the relay is opened


@pytest.mark.parametrize(
    "build",
    [
        "integrity",
        "integrity-and-fingerprint",
        "refresh",
        "indication",
    ],
)
def test_what_c_does_not_challenge_reaches_the_engine_untouched(
    relay: Any, build: str, aioice_turn_attributes: None
) -> None:
    listener, client = _listener(relay, _engine()), udp_socket("127.0.0.1")
    message = _allocate(USERNAME="user1", REALM=REALM, NONCE=b"x" * 24)
    if build.startswith("integrity"):
        message.add_message_integrity(b"k" * 16)
        if build.endswith("fingerprint"):
            message.add_fingerprint()
        request = bytes(message)
    elif build == "refresh":
        request = bytes(stun.Message(stun.Method.REFRESH, stun.Class.REQUEST))
    else:
        request = struct.pack("!HHI", 0x0013, 0, stun.COOKIE) + bytes(12)
    client.sendto(request, listener.getsockname())
    assert poll(relay) == [(listener.fileno(), request, client.getsockname())]
    assert relay.stats()["challenged"] == 0


def test_an_allocate_whose_length_is_wrong_is_dropped_unanswered(
    relay: Any, aioice_turn_attributes: None
) -> None:
    listener, client = _listener(relay, _engine()), udp_socket("127.0.0.1")
    client.sendto(bytes(_allocate()) + bytes(4), listener.getsockname())  # 4 past its length
    assert poll(relay) == []
    assert (relay.stats()["dropped"], relay.stats()["challenged"]) == (1, 0)


def test_a_fingerprint_without_integrity_is_still_a_request_without_credentials(
    relay: Any, aioice_turn_attributes: None
) -> None:
    listener, client = _listener(relay, _engine()), udp_socket("127.0.0.1")
    message = _allocate()
    message.add_fingerprint()
    client.sendto(bytes(message), listener.getsockname())
    assert poll(relay) == []
    assert stun.parse_message(client.recv(2048)).attributes["ERROR-CODE"][0] == 401


def test_no_template_a_stale_one_or_turn_off_leave_every_allocate_to_the_engine(
    relay: Any, aioice_turn_attributes: None
) -> None:
    engine = _engine()
    listener, client = _listener(relay, engine), udp_socket("127.0.0.1")
    assert _engine(NoAuthenticator()).challenge_template(NOW) is None  # 400 is the engine's
    for template, valid_s in ((b"", 30.0), (engine.challenge_template(NOW), 0.05)):
        relay.answer_challenges(listener.fileno(), template, valid_s)
        time.sleep(0.1)
        request = bytes(_allocate())
        client.sendto(request, listener.getsockname())
        assert poll(relay) == [(listener.fileno(), request, client.getsockname())]


def test_a_source_over_its_budget_gets_no_challenge_and_shares_it_with_the_engine(
    relay: Any, aioice_turn_attributes: None
) -> None:
    listener = _listener(relay, _engine())
    relay.challenge_budget(listener.fileno(), 0.001, 2.0, 16)
    a, b = udp_socket("127.0.0.1"), udp_socket("127.0.0.2")
    for _ in range(3):
        a.sendto(bytes(_allocate()), listener.getsockname())
        assert poll(relay) == []
    assert [stun.parse_message(a.recv(2048)).attributes["ERROR-CODE"][0] for _ in range(2)] == [
        401,
        401,
    ]
    a.settimeout(0.2)
    with pytest.raises(TimeoutError):
        a.recv(2048)
    assert relay.stats()["challenged"] == 2
    assert relay.take_drops(listener.fileno()) == (0, 0, 1)  # not sent: the source over budget
    assert relay.take_drops(listener.fileno()) == (0, 0, 0)
    # The engine's own challenges (a 438, another method) spend from the same buckets.
    assert relay.challenge_allow(listener.fileno(), "127.0.0.1") is False
    assert relay.challenge_allow(listener.fileno(), "127.0.0.2") is True
    b.sendto(bytes(_allocate()), listener.getsockname())
    assert poll(relay) == []
    assert stun.parse_message(b.recv(2048)).attributes["ERROR-CODE"][0] == 401
    relay.challenge_budget(listener.fileno(), 0.0, 1.0, 16)  # no limit
    assert all(relay.challenge_allow(listener.fileno(), "127.0.0.1") for _ in range(5))


def test_a_template_c_cannot_fill_is_refused(relay: Any) -> None:
    from stunnerd import _fastpath

    engine = _engine()
    sock = udp_socket("127.0.0.1")
    relay.watch(sock.fileno(), _fastpath.LISTENER, 0, MAX_STUN)
    template = engine.challenge_template(NOW)
    assert template is not None
    with_txid = template[:8] + b"\x01" * 12 + template[20:]
    for bad in (template[:-8], with_txid, b"\x01\x13" + template[2:20], bytes(2000)):
        with pytest.raises(ValueError, match="401 template"):
            relay.answer_challenges(sock.fileno(), bad, 1.0)
    with pytest.raises(ValueError, match="not a watched listener"):
        relay.answer_challenges(sock.fileno() + 100, template, 1.0)
    with pytest.raises(ValueError, match="not a watched listener"):
        relay.challenge_allow(sock.fileno() + 100, "127.0.0.1")


def test_watching_the_socket_number_again_forgets_the_challenge(
    relay: Any, aioice_turn_attributes: None
) -> None:
    from stunnerd import _fastpath

    listener, client = _listener(relay, _engine()), udp_socket("127.0.0.1")
    relay.unwatch(listener.fileno())
    relay.watch(listener.fileno(), _fastpath.LISTENER, 0, MAX_STUN)
    request = bytes(_allocate())
    client.sendto(request, listener.getsockname())
    assert poll(relay) == [(listener.fileno(), request, client.getsockname())]
