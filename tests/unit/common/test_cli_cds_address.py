"""One CDS address for every tool: the flag, else CDS_SERVER_ADDR (upstream's
name), else a deprecated name with a warning, else 127.0.0.1:13478; and one token-file rule."""

from __future__ import annotations

from pathlib import Path

import pytest

from stunner_common.cli import DEFAULT_CDS_ADDRESS, cds_address, check_token_file


@pytest.mark.parametrize(
    ("env", "flag", "address", "warnings"),
    [
        ({}, None, DEFAULT_CDS_ADDRESS, []),
        ({"CDS_SERVER_ADDR": "cds:1"}, None, "cds:1", []),
        ({"CDS_SERVER_ADDR": "cds:1"}, "flag:2", "flag:2", []),
        (
            {"STUNNER_CDS_ADDR": "old:3"},
            None,
            "old:3",
            ["STUNNER_CDS_ADDR is deprecated: set CDS_SERVER_ADDR instead"],
        ),
        (
            {"AUTH_CDS_URL": "http://old:4"},
            None,
            "http://old:4",
            ["AUTH_CDS_URL is deprecated: set CDS_SERVER_ADDR instead"],
        ),
        (
            {"CDS_SERVER_ADDR": "cds:1", "STUNNER_CDS_ADDR": "old:3"},
            None,
            "cds:1",
            ["STUNNER_CDS_ADDR=old:3 is ignored: the CDS address comes from CDS_SERVER_ADDR"],
        ),
        ({"CDS_SERVER_ADDR": "cds:1", "STUNNER_CDS_ADDR": "cds:1"}, None, "cds:1", []),
        ({"CDS_SERVER_ADDR": "  "}, None, DEFAULT_CDS_ADDRESS, []),
    ],
)
def test_the_cds_address_and_its_warnings(
    env: dict[str, str], flag: str | None, address: str, warnings: list[str]
) -> None:
    assert cds_address(env, flag) == (address, warnings)


def test_a_token_file_must_exist_and_hold_a_token(tmp_path: Path) -> None:
    assert check_token_file(None) is None
    missing = tmp_path / "missing"
    assert check_token_file(missing) == (
        f"CDS token file {str(missing)!r}: No such file or directory"
    )
    empty = tmp_path / "empty"
    empty.write_text("\n")
    assert check_token_file(empty) == f"CDS token file {str(empty)!r} is empty"
    good = tmp_path / "token"
    good.write_text("s3cret\n")
    assert check_token_file(good) is None
