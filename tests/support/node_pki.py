"""The real node's certificates: support.kube_pki's set, with a serving certificate pods accept.

A pod's in-cluster client (the operator's) dials ``KUBERNETES_SERVICE_HOST`` (the
``kubernetes`` Service's ClusterIP, 10.96.0.1) and checks the API server's certificate against
the ServiceAccount's ``ca.crt``; kube_pki's serving certificate names only 127.0.0.1, localhost
and kubernetes.default.svc. This makes kube_pki's files, then a CA of its own (kube_pki keeps
no CA key) that signs a serving certificate naming the node IP, 10.96.0.1 and every
``kubernetes.default*`` name, and the admin's client certificate again, at the same paths.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from support.kube_pki import ClusterPki, make_pki

_DAY = datetime.timedelta(days=1)
SERVICE_NAMES = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)


def _name(common_name: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _builder(
    subject: x509.Name, key: ec.EllipticCurvePrivateKey, issuer: x509.Name, ca: bool
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _DAY)
        .not_valid_after(now + 30 * _DAY)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )


def _write(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    path.chmod(0o600)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def make_node_pki(folder: Path, ips: Sequence[str]) -> ClusterPki:
    """kube_pki's files in ``folder``, with the CA, serving and admin certificates replaced:
    the serving certificate names ``ips`` (the node IP, the ``kubernetes`` ClusterIP,
    127.0.0.1) and SERVICE_NAMES."""
    pki = make_pki(folder)
    pem = serialization.Encoding.PEM
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("stunner-node-cluster-ca")
    ca = _builder(ca_name, ca_key, ca_name, True).sign(ca_key, hashes.SHA256())
    serving_key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in SERVICE_NAMES]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    serving = (
        _builder(_name("kube-apiserver"), serving_key, ca_name, False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    admin_key = ec.generate_private_key(ec.SECP256R1())
    admin = (
        _builder(_name("kubernetes-admin", "system:masters"), admin_key, ca_name, False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    _write(pki.ca_cert, ca.public_bytes(pem))
    _write(pki.serving_cert, serving.public_bytes(pem))
    _write(pki.serving_key, _key_pem(serving_key))
    _write(pki.admin_cert, admin.public_bytes(pem))
    _write(pki.admin_key, _key_pem(admin_key))
    return pki
