"""TURN URIs: parsing ``turn:``/``turns:`` URIs, the config one implies, and a listener's URI.

Both the RFC 7065 form (``turn:host:port?transport=udp``) and the form with credentials that
stunnerd and turncat take on their command line (``turn://user:pass@host:port?transport=tcp``)
are understood. The protocol mapping follows upstream: ``transport=tls``/``dtls`` win whatever
the scheme; otherwise ``turn`` + udp/tcp gives TURN-UDP/TURN-TCP and ``turns`` + udp/tcp gives
TURN-DTLS/TURN-TLS. The default port is 3478, or 443 for TLS and DTLS.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import parse_qsl, unquote

from stunner_common.config import (
    DEFAULT_HEALTHCHECK_ENDPOINT,
    DEFAULT_PORT,
    DEFAULT_REALM,
    ConfigValidationError,
    ListenerConfig,
    ListenerProtocol,
    StunnerConfig,
    self_signed_pair,
)
from stunner_common.contracts.listener_address import is_node_placeholder

__all__ = [
    "DEFAULT_CLUSTER_NAME",
    "DEFAULT_LISTENER_NAME",
    "TurnUri",
    "default_config_from_uri",
    "listener_turn_uri",
    "parse_turn_uri",
]

DEFAULT_LISTENER_NAME: Final = "default-listener"
DEFAULT_CLUSTER_NAME: Final = "allow-any"
DEFAULT_TLS_PORT: Final = 443

_SCHEMES: Final = ("turn", "turns")
_TRANSPORTS: Final = ("udp", "tcp", "tls", "dtls")
_HOST_RE = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_.])?$")
_URI_RE = re.compile(
    r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)?:(?://)?"
    r"(?:(?P<userinfo>[^@/?#]*)@)?"
    r"(?P<hostport>[^/?#]*)"
    r"(?P<path>/[^?#]*)?"
    r"(?:\?(?P<query>[^#]*))?"
    r"(?:#.*)?$",
    re.DOTALL,
)


@dataclass(frozen=True, slots=True)
class TurnUri:
    """A parsed TURN URI. `username`/`password` are None when the URI carries none."""

    scheme: str
    host: str
    port: int
    transport: str
    protocol: ListenerProtocol
    username: str | None = None
    password: str | None = field(default=None, repr=False)

    def __str__(self) -> str:
        """The URI in RFC 7065 form, without credentials."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}:{host}:{self.port}?transport={self.transport}"


def _error(text: str, message: str) -> ConfigValidationError:
    return ConfigValidationError("uri", text, f"invalid TURN URI {text!r}: {message}")


def _protocol(scheme: str, transport: str) -> ListenerProtocol:
    if transport == "tls":
        return "TURN-TLS"
    if transport == "dtls":
        return "TURN-DTLS"
    if scheme == "turns":
        return "TURN-DTLS" if transport == "udp" else "TURN-TLS"
    return "TURN-UDP" if transport == "udp" else "TURN-TCP"


def _split_hostport(text: str, hostport: str) -> tuple[str, str]:
    if hostport.startswith("["):
        end = hostport.find("]")
        if end < 0:
            raise _error(text, "unterminated [ in host")
        host, rest = hostport[1:end], hostport[end + 1 :]
        if rest and not rest.startswith(":"):
            raise _error(text, f"unexpected {rest!r} after host")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise _error(text, f"{host!r} is not an IPv6 address") from None
        return host, rest[1:]
    if hostport.count(":") > 1:
        try:
            return str(ipaddress.IPv6Address(hostport)), ""
        except ValueError:
            raise _error(text, "IPv6 hosts must be written in brackets") from None
    host, _, port = hostport.partition(":")
    return host, port


def parse_turn_uri(text: str) -> TurnUri:
    """Parse a TURN URI; raises `ConfigValidationError` naming what is wrong."""
    if not isinstance(text, str):
        raise ConfigValidationError("uri", text, f"invalid TURN URI: {text!r}")
    text = text.strip()
    found = _URI_RE.match(text)
    if found is None:
        raise _error(text, "expected turn:[//][user:pass@]host[:port][?transport=...]")
    scheme = (found.group("scheme") or "turn").lower()
    if scheme not in _SCHEMES:
        raise _error(text, f'unsupported scheme "{scheme}" (want turn or turns)')
    username = password = None
    if found.group("userinfo") is not None:
        user, sep, secret = found.group("userinfo").partition(":")
        username = unquote(user)
        password = unquote(secret) if sep else None
    host, port_text = _split_hostport(text, found.group("hostport"))
    if not host:
        raise _error(text, "missing host")
    if not _HOST_RE.match(host) and ":" not in host:
        raise _error(text, f'invalid host "{host}"')
    transport = "udp"
    for key, value in parse_qsl(found.group("query") or "", keep_blank_values=True):
        if key.lower() == "transport":
            transport = value.lower()
    if transport not in _TRANSPORTS:
        raise _error(text, f'unknown transport "{transport}" (want udp, tcp, tls or dtls)')
    protocol = _protocol(scheme, transport)
    port = _port(text, port_text, protocol)
    return TurnUri(scheme, host, port, transport, protocol, username, password)


def _port(text: str, port_text: str, protocol: str) -> int:
    """The URI's port, else the default of its protocol (5349 for TLS and DTLS, else 3478)."""
    if not port_text:
        return DEFAULT_TLS_PORT if protocol in ("TURN-TLS", "TURN-DTLS") else DEFAULT_PORT
    if port_text.isascii() and port_text.isdigit() and len(port_text) <= 5:
        port = int(port_text)
        if 1 <= port <= 65535:
            return port
    raise _error(text, f'invalid port "{port_text}"')


def default_config_from_uri(uri: str | TurnUri) -> StunnerConfig:
    """The config ``stunnerd turn://user:pass@host:port?transport=...`` runs (upstream §1.10).

    Static auth with the URI's credentials (both required and non-empty), one listener
    ``default-listener`` on the URI's host and port routing to the ``allow-any`` cluster
    (``0.0.0.0/0``). stunnerd does not relay to loopback peers unless a route names loopback
    explicitly, so when the URI's host is itself a loopback address (a local test set-up), the
    cluster names that host's loopback range too (``127.0.0.0/8`` or ``::1``). TLS and DTLS
    listeners get a fresh self-signed certificate.
    """
    parsed = parse_turn_uri(uri) if isinstance(uri, str) else uri
    if not parsed.username or not parsed.password:
        raise ConfigValidationError(
            "uri", str(parsed), "username/password must be set in the TURN URI"
        )
    listener: dict[str, object] = {
        "name": DEFAULT_LISTENER_NAME,
        "protocol": parsed.protocol,
        "address": parsed.host,
        "port": parsed.port,
        "routes": [DEFAULT_CLUSTER_NAME],
    }
    if parsed.protocol in ("TURN-TLS", "TURN-DTLS"):
        listener["cert"], listener["key"] = self_signed_pair(parsed.host)
    endpoints = ["0.0.0.0/0", *_loopback_range(parsed.host)]
    return StunnerConfig.model_validate(
        {
            "version": "v1",
            "admin": {"healthcheck_endpoint": DEFAULT_HEALTHCHECK_ENDPOINT},
            "auth": {
                "type": "static",
                "realm": DEFAULT_REALM,
                "credentials": {"username": parsed.username, "password": parsed.password},
            },
            "listeners": [listener],
            "clusters": [{"name": DEFAULT_CLUSTER_NAME, "type": "STATIC", "endpoints": endpoints}],
        }
    )


def _loopback_range(host: str) -> list[str]:
    try:
        addr = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return []
    if not addr.is_loopback:
        return []
    return ["127.0.0.0/8"] if addr.version == 4 else ["::1/128"]


def listener_turn_uri(listener: ListenerConfig) -> str:
    """The URI clients use for `listener`: public address/port first, else address/port."""
    address = listener.public_address or listener.address or "0.0.0.0"
    if is_node_placeholder(address):
        address = "0.0.0.0"
    port = listener.public_port or listener.port
    scheme = "turns" if listener.protocol in ("TURN-TLS", "TURN-DTLS") else "turn"
    transport = "udp" if listener.protocol in ("TURN-UDP", "TURN-DTLS") else "tcp"
    host = f"[{address}]" if ":" in address else address
    return f"{scheme}:{host}:{port}?transport={transport}"
