"""Parsing of turncat's three positional addresses, with no I/O.

turncat takes a local address (`udp://`, `tcp://` or `-`), a TURN server (`turn://`, `turns://`
or `k8s://ns/gateway:listener`) and a peer (`udp://host:port`, or `tcp://host:port` through
an RFC 6062 TCP allocation; IPv6 literals in brackets). Getting any of them wrong must end
with one clear line naming the offending text, before a single socket is opened, so all the
parsing lives here and raises `BadInputError`. TURN URI syntax itself is shared with stunnerd and
lives in `stunner_common.turnuri`; this module only adds what turncat needs on top of it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal
from urllib.parse import SplitResult, urlsplit

from stunner_common.config import ConfigError
from stunner_common.turnuri import parse_turn_uri
from turncat.errors import BadInputError

LocalKind = Literal["udp", "tcp", "stdio"]
Transport = Literal["udp", "tcp", "tls", "dtls"]

# Listener protocols of the stunnerd config and the client transport each one means.
TRANSPORT_BY_PROTOCOL: dict[str, Transport] = {
    "TURN-UDP": "udp",
    "TURN-TCP": "tcp",
    "TURN-TLS": "tls",
    "TURN-DTLS": "dtls",
}

_K8S_NAME = re.compile(r"^[0-9A-Za-z_.-]+$")


@dataclass(frozen=True, slots=True)
class LocalAddress:
    """Where turncat accepts its local clients."""

    kind: LocalKind
    host: str = ""
    port: int = 0


@dataclass(frozen=True, slots=True)
class TurnTarget:
    """A TURN server to reach and the credentials to reach it with (None: no auth)."""

    host: str
    port: int
    transport: Transport
    username: str | None = None
    password: str | None = None

    @property
    def secure(self) -> bool:
        return self.transport in ("tls", "dtls")


@dataclass(frozen=True, slots=True)
class K8sTarget:
    """A `k8s://namespace/gateway:listener` reference, resolved later through the CDS."""

    namespace: str
    gateway: str
    listener: str


@dataclass(frozen=True, slots=True)
class PeerAddress:
    host: str
    port: int
    transport: Literal["udp", "tcp"] = "udp"


def _split(text: str, what: str) -> SplitResult:
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - urlsplit validates the port lazily
    except ValueError as exc:
        raise BadInputError(f"invalid {what} {text!r}: {exc}") from None
    return parts


def _host_port(text: str, what: str) -> tuple[str, int]:
    parts = _split(text, what)
    port = parts.port
    if port is None or port == 0:
        raise BadInputError(f"invalid {what} {text!r}: a port is required")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise BadInputError(f"invalid {what} {text!r}: expected {parts.scheme}://host:port")
    return parts.hostname or "", port


def parse_local(text: str) -> LocalAddress:
    """Parse the local address: `udp://host:port`, `tcp://host:port` or `-` for stdin/stdout."""
    if text == "-":
        return LocalAddress("stdio")
    scheme = _split(text, "local address").scheme.lower()
    if scheme not in ("udp", "tcp"):
        raise BadInputError(
            f"invalid local address {text!r}: expected udp://host:port, tcp://host:port or -"
        )
    host, port = _host_port(text, "local address")
    return LocalAddress("udp" if scheme == "udp" else "tcp", host or "0.0.0.0", port)


def parse_peer(text: str) -> PeerAddress:
    """Parse the peer address: `udp://host:port`, or `tcp://host:port` (a TCP relay)."""
    scheme = _split(text, "peer address").scheme.lower()
    if scheme not in ("udp", "tcp"):
        raise BadInputError(
            f"invalid peer address {text!r}: expected udp://host:port or tcp://host:port"
        )
    host, port = _host_port(text, "peer address")
    if not host:
        raise BadInputError(f"invalid peer address {text!r}: a host is required")
    return PeerAddress(host, port, "tcp" if scheme == "tcp" else "udp")


def parse_k8s(text: str, default_namespace: str = "default") -> K8sTarget:
    """Parse `k8s://namespace/gateway:listener` (or `k8s:///gateway:listener`)."""
    rest = text[len("k8s://") :]
    ns, sep, gw_listener = rest.partition("/")
    gateway, colon, listener = gw_listener.partition(":")
    if not sep or not colon:
        raise BadInputError(
            f"invalid server URI {text!r}: expected k8s://namespace/gateway:listener"
        )
    ns = ns or default_namespace
    for label, value in (("namespace", ns), ("gateway", gateway), ("listener", listener)):
        if not _K8S_NAME.match(value):
            raise BadInputError(f"invalid server URI {text!r}: bad {label} name {value!r}")
    return K8sTarget(ns, gateway, listener)


def _reason(exc: ConfigError, text: str) -> str:
    """What is wrong with a TURN URI, without the field name and the URI said again."""
    message = str(getattr(exc, "message", exc))
    for prefix in (f"invalid TURN URI {text.strip()!r}: ", "invalid TURN URI: "):
        if message.startswith(prefix):
            return message[len(prefix) :]
    return message


def parse_server(text: str, default_namespace: str = "default") -> TurnTarget | K8sTarget:
    """Parse the TURN server: `turn://user:pass@host:port?transport=…`, `turns://…` or `k8s://…`."""
    scheme = text.partition(":")[0].lower()
    if scheme == "k8s":
        if not text.lower().startswith("k8s://"):
            raise BadInputError(
                f"invalid server URI {text!r}: expected k8s://namespace/gateway:listener"
            )
        return parse_k8s(text, default_namespace)
    if scheme not in ("turn", "turns"):
        raise BadInputError(
            f"invalid server URI {text!r}: unknown scheme {scheme!r} "
            "(expected turn://, turns:// or k8s://)"
        )
    try:
        uri = parse_turn_uri(text)
    except ConfigError as exc:
        raise BadInputError(f"invalid server URI {text!r}: {_reason(exc, text)}") from None
    transport = TRANSPORT_BY_PROTOCOL.get(uri.protocol)
    if transport is None:
        raise BadInputError(f"invalid server URI {text!r}: unsupported protocol {uri.protocol}")
    if not uri.username or not uri.password:
        raise BadInputError(
            f"invalid server URI {text!r}: username and password must be set (turn://user:pass@…)"
        )
    if not uri.host:
        raise BadInputError(f"invalid server URI {text!r}: a host is required")
    return TurnTarget(uri.host, uri.port, transport, uri.username, uri.password)
