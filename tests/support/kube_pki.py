"""Certificates and keys of the test cluster: a CA, the API server's serving certificate, the
admin's client certificate (group system:masters) and the service-account signing key.

Made with ``cryptography`` into the cluster's folder on each start; nothing is reused between
clusters and nothing leaves the machine.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_DAY = datetime.timedelta(days=1)


@dataclass(frozen=True, slots=True)
class ClusterPki:
    ca_cert: Path
    serving_cert: Path
    serving_key: Path
    admin_cert: Path
    admin_key: Path
    sa_key: Path
    sa_pub: Path


def _name(common_name: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _pem_key(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _issue(
    subject: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool = False,
    server: bool = False,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _DAY)
        .not_valid_after(now + 30 * _DAY)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    x509.DNSName("kubernetes.default.svc"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                ]
            ),
            critical=False,
        )
    if not ca:
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else None
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([usage] if usage else [ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
    return builder.sign(issuer_key, hashes.SHA256())


def make_pki(folder: Path) -> ClusterPki:
    folder.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("stunner-test-cluster-ca")
    ca = _issue(ca_name, ca_key, ca_name, ca_key, ca=True)
    serving_key = ec.generate_private_key(ec.SECP256R1())
    serving = _issue(_name("kube-apiserver"), serving_key, ca_name, ca_key, server=True)
    admin_key = ec.generate_private_key(ec.SECP256R1())
    admin = _issue(_name("kubernetes-admin", "system:masters"), admin_key, ca_name, ca_key)
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    def write(name: str, data: bytes) -> Path:
        path = folder / name
        path.write_bytes(data)
        path.chmod(0o600)
        return path

    pem = serialization.Encoding.PEM
    return ClusterPki(
        ca_cert=write("ca.crt", ca.public_bytes(pem)),
        serving_cert=write("apiserver.crt", serving.public_bytes(pem)),
        serving_key=write("apiserver.key", _pem_key(serving_key)),
        admin_cert=write("admin.crt", admin.public_bytes(pem)),
        admin_key=write("admin.key", _pem_key(admin_key)),
        sa_key=write("sa.key", _pem_key(sa_key)),
        sa_pub=write(
            "sa.pub",
            sa_key.public_key().public_bytes(pem, serialization.PublicFormat.SubjectPublicKeyInfo),
        ),
    )
