"""No bearer token or URL password survives into a log line, whoever logged it."""

from __future__ import annotations

import io
import logging

import pytest

from stunner_common.logs import configure_logging, redact_secrets


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("< authorization: Bearer abc.def-1", "< authorization: Bearer ***"),
        ("{'Authorization': 'Bearer xyz'}", "{'Authorization': 'Bearer ***'}"),
        ("Authorization: Basic dXNlcjpw", "Authorization: Basic ***"),
        ("redis://stunner-cds:s3cr%t@10.0.0.1:6379/0", "redis://stunner-cds:***@10.0.0.1:6379/0"),
        (
            "turn://user-1:pass-1@127.0.0.1:3478?transport=udp",
            "turn://user-1:***@127.0.0.1:3478?transport=udp",
        ),
        ("http://127.0.0.1:8080/metrics", "http://127.0.0.1:8080/metrics"),
        (
            "ws://127.0.0.1:13478/api/v1/configs?watch=true",
            "ws://127.0.0.1:13478/api/v1/configs?watch=true",
        ),
        ("user user-1 authenticated", "user user-1 authenticated"),
    ],
)
def test_redact_secrets_hides_tokens_and_url_passwords_only(text: str, expected: str) -> None:
    assert redact_secrets(text) == expected


def test_a_library_logging_a_header_at_debug_gets_redacted() -> None:
    out = io.StringIO()
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        configure_logging("json", logging.DEBUG, stream=out)
        logging.getLogger("some.library").debug("< %s: %s", "authorization", "Bearer tok-123")
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
    assert "tok-123" not in out.getvalue()
    assert "Bearer ***" in out.getvalue()
