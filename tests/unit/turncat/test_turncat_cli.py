"""The CLI's argument handling, certificate name matching and DTLS record packing (no sockets)."""

from __future__ import annotations

import datetime
import ipaddress

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from OpenSSL import crypto

from turncat.carrier import cert_matches, pack_records
from turncat.cli import main


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["unix:///x", "turn://u:p@h:1", "udp://1.2.3.4:5"], "invalid local address"),
        (["udp://127.0.0.1:9", "turn://h:1", "udp://1.2.3.4:5"], "username and password"),
        (["udp://127.0.0.1:9", "stun://h:1", "udp://1.2.3.4:5"], "unknown scheme 'stun'"),
        (["udp://127.0.0.1:9", "turn://u:p@h:1", "sctp://1.2.3.4:5"], "invalid peer address"),
        (["udp://127.0.0.1:9", "turn://u:p@h:1", "tcp://1.2.3.4:5"], "local address must be tcp"),
        (["-", "turn://u:p@h:1?transport=udp", "tcp://1.2.3.4:5"], "needs a TCP or TLS connection"),
        (
            ["-", "turn://u:p@h:1?transport=dtls", "tcp://[::1]:5"],
            "needs a TCP or TLS connection",
        ),
        (["-", "k8s://ns/gw", "udp://1.2.3.4:5"], "expected k8s://namespace/gateway:listener"),
        (["-", "turn://u:p@h:1", "udp://1.2.3.4:5", "--ca", "/no/such/ca.pem"], "CA file"),
        (["-l", "all:NOPE", "-", "turn://u:p@h:1", "udp://1.2.3.4:5"], "invalid log spec"),
        (["-l", "bogus:XYZ", "-", "turn://u:p@h:1", "udp://1.2.3.4:5"], "invalid log spec"),
    ],
)
def test_bad_input_exits_2_with_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("turncat: ")
    assert message in err[0]


def test_missing_arguments_print_usage_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["udp://127.0.0.1:9"])
    assert info.value.code == 2
    assert "usage: turncat" in capsys.readouterr().err


def test_bad_setting_from_the_environment_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TURNCAT_REQUEST_TIMEOUT_S", "-1")
    assert main(["-", "turn://u:p@h:1", "udp://1.2.3.4:5"]) == 2
    assert "TURNCAT_" in capsys.readouterr().err


def _cert(*names: x509.GeneralName) -> crypto.X509:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "t")])
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(names)), critical=False)
    return crypto.X509.from_cryptography(builder.sign(key, hashes.SHA256()))


def test_certificate_names_match_by_ip_dns_and_single_label_wildcard() -> None:
    cert = _cert(
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.DNSName("turn.example.com"),
        x509.DNSName("*.stunner.example"),
    )
    assert cert_matches(cert, "127.0.0.1")
    assert not cert_matches(cert, "127.0.0.2")
    assert cert_matches(cert, "TURN.example.com.")
    assert cert_matches(cert, "a.stunner.example")
    assert not cert_matches(cert, "a.b.stunner.example")
    assert not cert_matches(cert, "example.com")
    assert not cert_matches(_cert(), "127.0.0.1")


def _record(content_type: int, body: bytes) -> bytes:
    return (
        bytes([content_type])
        + b"\xfe\xfd"
        + b"\x00\x00"
        + b"\x00" * 6
        + len(body).to_bytes(2, "big")
        + body
    )


def test_dtls_records_are_packed_into_datagrams_without_splitting_one() -> None:
    records = [_record(22, b"a" * 500), _record(22, b"b" * 500), _record(22, b"c" * 300)]
    datagrams = pack_records(b"".join(records), 1200)
    assert datagrams == [records[0] + records[1], records[2]]
    assert pack_records(records[0], 100) == [records[0]]  # an oversized record goes alone
    assert pack_records(b"", 1200) == []
