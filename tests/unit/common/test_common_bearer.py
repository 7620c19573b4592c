"""The one bearer-token rule the CDS and the auth service apply."""

from __future__ import annotations

import pytest

from stunner_common.bearer import bearer_matches


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("Bearer s3cret", True),
        ("bearer s3cret", True),
        ("Bearer  s3cret ", True),
        ("Bearer wrong", False),
        ("Bearer s3cret-and-more", False),
        ("Basic s3cret", False),
        ("s3cret", False),
        ("", False),
        ("Bearer ", False),
    ],
)
def test_a_header_matches_only_with_the_bearer_scheme_and_the_exact_token(
    header: str, expected: bool
) -> None:
    assert bearer_matches(header, b"s3cret") is expected
