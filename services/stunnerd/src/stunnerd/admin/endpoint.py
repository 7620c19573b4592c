"""Where the health and metrics servers listen, parsed the way upstream parses it.

Only host and port of the endpoint URL matter; an empty host is the wildcard and an empty port is
the server's default (8086 for health, 8080 for metrics). `""` disables the server.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

DEFAULT_HEALTH_ENDPOINT = "http://:8086"
DEFAULT_HEALTH_PORT = 8086
DEFAULT_METRICS_PORT = 8080


class EndpointError(ValueError):
    """An admin endpoint that cannot be parsed."""


@dataclass(frozen=True, slots=True)
class BindAddress:
    host: str
    port: int
    path: str = "/"


def parse_admin_endpoint(value: str | None, default_port: int) -> BindAddress | None:
    """`None` means the default endpoint; `""` means disabled (returns None)."""
    if value is None:
        value = DEFAULT_HEALTH_ENDPOINT if default_port == DEFAULT_HEALTH_PORT else ""
    if value == "":
        return None
    parts = urlsplit(value if "//" in value else f"http://{value}")
    if parts.scheme not in ("http", ""):
        raise EndpointError(f"admin endpoint {value!r}: only http is supported")
    host = parts.hostname or "0.0.0.0"
    try:
        port = default_port if parts.port is None else parts.port
    except ValueError as exc:
        raise EndpointError(f"admin endpoint {value!r}: {exc}") from exc
    return BindAddress(host, port, parts.path or "/")
