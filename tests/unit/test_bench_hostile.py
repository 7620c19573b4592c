"""`bench hostile`'s limits part: its configs, its credentials and its report's helpers."""

from __future__ import annotations

import base64
import hashlib
import hmac

from stunner_common.auth import ephemeral_password, parse_ephemeral_username
from stunner_common.config import parse_config
from support.bench_modules import bench_module

hostile = bench_module("bench_hostile")
http = bench_module("hostile_http")


def test_the_quota_config_carries_the_quota_and_a_rest_secret_both_servers_share() -> None:
    config = parse_config(hostile.quota_config(3478))
    assert config.admin.user_quota == hostile.USER_QUOTA
    assert config.auth.type == "ephemeral"
    assert config.auth.credentials["secret"] == hostile.SECRET
    args = hostile.quota_args()
    assert f"--user-quota={hostile.USER_QUOTA}" in args
    assert f"--static-auth-secret={hostile.SECRET}" in args


def test_rest_credentials_are_the_turn_rest_pair_stunnerd_checks() -> None:
    username, password = hostile.rest_credentials("attacker", now=1_000_000)
    assert parse_ephemeral_username(username) == (1_003_600, "attacker")
    assert password == ephemeral_password(hostile.SECRET, username)
    digest = hmac.new(hostile.SECRET.encode(), username.encode(), hashlib.sha1).digest()
    assert password == base64.b64encode(digest).decode()


def test_the_tcp_config_adds_a_turn_tcp_listener_on_the_udp_port() -> None:
    config = parse_config(hostile.tcp_config(3478))
    assert sorted((lis.protocol, lis.port) for lis in config.listeners) == [
        ("TURN-TCP", 3478),
        ("TURN-UDP", 3478),
    ]


def test_slow_answers_count_closed_and_still_open_connections() -> None:
    answers = hostile.slow_answers(4, [10.2, 10.0, 10.4], 15.0)
    assert answers == {
        "stalled": 4,
        "closed by 15 s": 3,
        "median s to close": 10.2,
        "open at 15 s": 1,
    }
    assert "median s to close" not in hostile.slow_answers(2, [], 15.0)


def test_answers_list_codes_in_order_then_named_counts() -> None:
    answers = {486: 90, "kept": 64, 0: 10, "connected": 640}
    assert hostile.format_answers(answers) == "0: 10, 486: 90, kept: 64, connected: 640"
    assert hostile.format_answers({401: 31, -1: 1}) == "401: 31, no answer: 1"


def test_a_report_row_and_the_ratio_line() -> None:
    sd = hostile.Held(2**20 * 70, 2**20 * 71, 36, 100, 400, 0, {0: 10, 486: 90})
    coturn = hostile.Held(2**20 * 15, 2**20 * 19, 46, 238, 400, 2, {0: 10, 486: 90})
    row = hostile.held_row("user-quota", "stunnerd", sd)
    assert row.split() == [
        "user-quota", "stunnerd", "70.0MB", "71.0MB", "36->100", "0/400", "0:", "10,", "486:", "90",
    ]  # fmt: skip
    assert hostile.ratio_line("user-quota", sd, coturn) == (
        "RATIO limits_rss_growth[user-quota] stunnerd/coturn = 0.25 "
        "(stunnerd 1024 KiB, coturn 4096 KiB)"
    )
    shrank = hostile.Held(2**20 * 15, 2**20 * 14)
    assert hostile.ratio_line("x", sd, shrank) == (
        "limits_rss_growth[x]: coturn grew -1024 KiB; stunnerd 1024 KiB"
    )


def test_http_status_of_a_head_or_of_what_came_instead() -> None:
    assert http.status_of(b"HTTP/1.1 429 Too Many Requests\r\n") == 429
    assert http.status_of(b"") == "closed"
    assert http.status_of(b"garbage") == "unparsable"
    assert http.tally([429, 429, 101, "closed"]) == {429: 2, 101: 1, "closed": 1}


def test_oversized_requests_exceed_each_limit_by_the_stated_factor() -> None:
    requests = http.oversized_requests(1.0)
    assert len(requests) == 30
    head, query, body = requests[0], requests[10], requests[20]
    assert len(head) > 10 * http.MAX_HEADER_BYTES
    target = query.split(b" ")[1]
    assert 7 * http.MAX_QUERY_BYTES < len(target.split(b"?", 1)[1]) < http.MAX_HEADER_BYTES
    assert b"Content-Length: %d\r\n" % (10 * http.MAX_BODY_BYTES) in body
    assert len(http.oversized_requests(0.05)) == 3
