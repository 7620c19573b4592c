"""TURN REST ephemeral credentials and the long-term key."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from stunner_common.auth import (
    ephemeral_credentials,
    ephemeral_expiry,
    ephemeral_password,
    ephemeral_user_id,
    ephemeral_username,
    ephemeral_username_valid,
    long_term_key,
    parse_ephemeral_username,
)

NOW = 1_700_000_000.0


def test_password_matches_the_pion_turn_rest_vector() -> None:
    assert ephemeral_password("foobar", "1599491771") == "Tpz/nKkyvX/vMSLKvL4sbtBt8Vs="


def test_password_is_base64_of_hmac_sha1_of_the_whole_username() -> None:
    username = "1700003600:alice"
    by_hand = base64.b64encode(
        hmac.new(b"my-secret", username.encode(), hashlib.sha1).digest()
    ).decode()
    assert ephemeral_password("my-secret", username) == by_hand
    assert ephemeral_password(b"my-secret", username) == by_hand
    assert len(by_hand) == 28
    assert by_hand.endswith("=")


@pytest.mark.parametrize(
    ("expiry", "user_id", "expected"),
    [(1700003600, None, "1700003600"), (1700003600, "alice", "1700003600:alice"), (5, "", "5:")],
)
def test_usernames_are_expiry_then_optional_user_id(
    expiry: int, user_id: str | None, expected: str
) -> None:
    assert ephemeral_username(expiry, user_id) == expected


def test_credentials_expire_ttl_seconds_from_now_truncated() -> None:
    username, password = ephemeral_credentials(
        "s", ttl_s=36000, now=NOW + 0.9, user_id="dummy_user"
    )
    assert username == f"{int(NOW) + 36000}:dummy_user"
    assert password == ephemeral_password("s", username)
    assert ephemeral_user_id(username) == "dummy_user"
    assert ephemeral_username_valid(username, NOW)


@pytest.mark.parametrize(
    ("username", "expiry"),
    [
        ("1700000100", 1700000100),
        ("1700000100:alice", 1700000100),
        ("alice:1700000100", 1700000100),
        ("alice:1700000100:random-crap", 1700000100),
        ("+1700000100", 1700000100),
        ("001700000100", 1700000100),
        ("-5:alice", -5),
        ("alice", None),
        ("", None),
        ("17 00", None),
        ("1_700_000_100", None),
        (" 1700000100", None),
        ("99999999999999999999:1700000100", 1700000100),
        ("99999999999999999999999:bob", None),
        ("9223372036854775808:bob", None),
        ("1700000100\n", None),
        ("\u0661\u0667\u0660\u0660", None),
    ],
)
def test_expiry_is_the_first_part_that_parses_as_a_go_integer(
    username: str, expiry: int | None
) -> None:
    assert ephemeral_expiry(username) == expiry


@pytest.mark.parametrize(
    ("username", "valid"),
    [
        (f"{int(NOW) + 60}", True),
        (f"{int(NOW) + 60}:alice", True),
        (f"alice:{int(NOW) + 60}", True),
        (f"alice:{int(NOW) + 60}:random-crap", True),
        (f"{int(NOW)}", True),
        (f"{int(NOW) - 1}:alice", False),
        ("0:alice", False),
        ("alice", False),
        ("-1", False),
        ("99999999999999999999999:bob", False),
        ("9223372036854775807:bob", True),
    ],
)
def test_username_is_valid_until_its_expiry_second(username: str, valid: bool) -> None:
    assert ephemeral_username_valid(username, NOW + 0.5) is valid


@pytest.mark.parametrize(
    ("username", "user_id"),
    [
        ("1700000100:alice", "alice"),
        ("alice:1700000100", "alice:1700000100"),
        ("1700000100", "1700000100"),
        ("1700000100:alice:x", "1700000100:alice:x"),
    ],
)
def test_user_id_is_the_suffix_only_for_expiry_colon_id(username: str, user_id: str) -> None:
    assert ephemeral_user_id(username) == user_id


def test_long_term_key_is_md5_of_user_realm_password() -> None:
    assert long_term_key("user", "realm", "pass") == hashlib.md5(b"user:realm:pass").digest()
    assert len(long_term_key("u", "r", "p")) == 16


def test_long_term_key_for_the_rfc_5769_long_term_sample() -> None:
    # RFC 5769 §2.4: username "マトリックス", realm "example.org", password "TheMatrIX" after
    # SASLprep. Upstream applies no SASLprep, so the raw password gives a different key.
    username = "\u30de\u30c8\u30ea\u30c3\u30af\u30b9"
    expected = hashlib.md5(f"{username}:example.org:TheMatrIX".encode()).digest()
    assert long_term_key(username, "example.org", "TheMatrIX") == expected
    assert long_term_key(username, "example.org", "The\u00adM\u00aatr\u2168") != expected


def test_long_term_key_agrees_with_aioice() -> None:
    turn = pytest.importorskip("aioice.turn")
    for username, realm, password in [
        ("u", "r", "p"),
        ("1700000100:alice", "stunner.l7mp.io", "x$"),
    ]:
        assert long_term_key(username, realm, password) == turn.make_integrity_key(
            username, realm, password
        )


@pytest.mark.parametrize(
    ("username", "parsed"),
    [
        ("1700000100:alice", (1700000100, "alice")),
        ("alice:1700000100", (1700000100, "alice:1700000100")),
        ("-5:alice", (-5, "alice")),
        ("0:alice", None),
        ("99999999999999999999999:bob", None),
        ("bob", None),
    ],
)
def test_parse_gives_expiry_and_user_id_or_none_without_a_usable_expiry(
    username: str, parsed: tuple[int, str] | None
) -> None:
    assert parse_ephemeral_username(username) == parsed
