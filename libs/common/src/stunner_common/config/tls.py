"""TLS material carried in listener configs: base64 of PEM, checked early and loaded late.

Validation only checks that `cert` and `key` base64-decode to PEM blocks of the right kind, which
is cheap enough to run on every config the operator renders. `load_tls_pair` does the full job
(parse the chain and the key, check that they belong together) and is what the dataplane calls
before it opens a TLS or DTLS listener. `self_signed_pair` backs the default config a
``turns:`` URI implies. Both import cryptography when called, so that a process whose listeners
carry no TLS material never loads it.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
from dataclasses import dataclass
from typing import TYPE_CHECKING

from stunner_common.config.errors import ConfigValidationError

if TYPE_CHECKING:
    import datetime

__all__ = ["TlsPair", "decode_pem", "load_tls_pair", "self_signed_pair", "strip_base64"]

_SELF_SIGNED_VALIDITY_DAYS = 365


@dataclass(frozen=True, slots=True)
class TlsPair:
    """A certificate chain and its private key, both as PEM bytes, known to belong together."""

    cert_pem: bytes
    key_pem: bytes


def strip_base64(text: str) -> str:
    """Drop the whitespace a base64 value may be wrapped with (YAML block scalars do this)."""
    return "".join(text.split())


def decode_pem(b64: str, *, what: str) -> bytes:
    """Base64-decode `b64` and check it holds a PEM block; `what` is ``cert`` or ``key``.

    Raises `ValueError` with an upstream-style message (``invalid TLS certificate:
    base64-decode error``); the model turns it into a `ConfigValidationError` with a field path.
    """
    label = "certificate" if what == "cert" else "key"
    try:
        pem = base64.b64decode(strip_base64(b64), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"invalid TLS {label}: base64-decode error") from None
    marker = b"CERTIFICATE-----" if what == "cert" else b"PRIVATE KEY-----"
    if b"-----BEGIN " not in pem or marker not in pem:
        kind = "CERTIFICATE" if what == "cert" else "PRIVATE KEY"
        raise ValueError(f"invalid TLS {label}: no PEM {kind} block")
    return pem


def load_tls_pair(cert_b64: str, key_b64: str) -> TlsPair:
    """Decode and load a listener's cert/key, checking that the key matches the certificate.

    Raises `ConfigValidationError` (``cannot load cert/key pair: ...``) on any failure.
    """
    from cryptography import x509
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization

    try:
        cert_pem = decode_pem(cert_b64, what="cert")
        key_pem = decode_pem(key_b64, what="key")
    except ValueError as exc:
        raise ConfigValidationError("cert", "", f"cannot load cert/key pair: {exc}") from None
    try:
        chain = x509.load_pem_x509_certificates(cert_pem)
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise ConfigValidationError("cert", "", f"cannot load cert/key pair: {exc}") from None
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if chain[0].public_key().public_bytes(*spki) != key.public_key().public_bytes(*spki):
        raise ConfigValidationError(
            "key", "", "cannot load cert/key pair: private key does not match the certificate"
        )
    return TlsPair(cert_pem, key_pem)


def self_signed_pair(host: str, *, now: datetime.datetime | None = None) -> tuple[str, str]:
    """A fresh self-signed ECDSA P-256 cert and key for `host`, both as base64 of PEM."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    start = now or datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host or "localhost")])
    alt: x509.GeneralName
    try:
        alt = x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        alt = x509.DNSName(host or "localhost")
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start - datetime.timedelta(minutes=5))
        .not_valid_after(start + datetime.timedelta(days=_SELF_SIGNED_VALIDITY_DAYS))
        .add_extension(x509.SubjectAlternativeName([alt]), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return base64.b64encode(cert_pem).decode(), base64.b64encode(key_pem).decode()
