"""Origin strings, config ids and the event type shared by every config origin.

Unlike upstream, a bare filesystem path is a file origin (upstream turned `-c /etc/x.conf` into an
HTTP URL); `host:port` without a scheme still means a CDS server, as upstream.
"""

from __future__ import annotations

import re
import socket
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol
from urllib.parse import urlsplit

from stunner_common.config import ConfigError, parse_config

if TYPE_CHECKING:
    from stunner_common.config import StunnerConfig

DEFAULT_ORIGIN = ":13478"
K8S_ORIGIN = "k8s"  # the CDS found through the kubeconfig (`stunnerd.origin.k8s`)
_HOST_PORT = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.\-]*):\d{1,5}(/.*)?$")


class ConfigOriginError(Exception):
    """The origin cannot be used: a bad origin string or id, or a one-shot load that failed."""


@dataclass(frozen=True, slots=True)
class ConfigEvent:
    """One validated config from an origin; `revision` is the CDS revision when known, in the
    store epoch `epoch`."""

    config: StunnerConfig
    origin: str
    revision: int | None = None
    epoch: str | None = None


def loaded_event(
    text: str | bytes, env: Mapping[str, str] | None, origin: str, invalid: str
) -> ConfigEvent:
    """The config a one-shot load read; one that does not validate is a `ConfigOriginError`
    saying `invalid` (the origin's words for it) and why."""
    try:
        config = parse_config(text, env=env)
    except ConfigError as exc:
        raise ConfigOriginError(f"{invalid}: {exc}") from exc
    return ConfigEvent(config, origin)


Rejected = Callable[[str, int | None, str | None], None]
"""Told of a config an origin refused as a whole: (reason, revision, epoch)."""


def ignore_rejection(reason: str, revision: int | None, epoch: str | None, /) -> None:
    return None


class ConfigOrigin(Protocol):
    """A source of configs. `load` reads once; `watch` follows changes until cancelled; every
    config it skips as invalid is reported to `on_rejected`."""

    on_rejected: Rejected

    async def load(self) -> ConfigEvent: ...

    def watch(self) -> AsyncIterator[ConfigEvent]: ...


OriginKind = Literal["file", "http", "ws"]


@dataclass(frozen=True, slots=True)
class OriginSpec:
    """A parsed `-c` value. For `file`, `location` is a path; otherwise a base URL."""

    kind: OriginKind
    location: str
    tls: bool = False


def is_k8s_origin(origin: str) -> bool:
    return origin.strip() == K8S_ORIGIN


def parse_origin(text: str) -> OriginSpec:
    """Classify an origin: `file://` or a path → file; http(s) → http; ws(s) → ws."""
    text = text.strip()
    if not text:
        raise ConfigOriginError("empty config origin")
    if text.startswith("file://"):
        path = text.removeprefix("file://")
        if not path:
            raise ConfigOriginError(f"invalid config origin {text!r}: empty file path")
        return OriginSpec("file", path)
    if "," in text and "://" in text:  # CDS replicas: "ws://a:13478,ws://b:13478"
        specs = [parse_origin(part) for part in text.split(",") if part.strip()]
        if len({(spec.kind, spec.tls) for spec in specs}) != 1 or specs[0].kind == "file":
            raise ConfigOriginError(
                f"invalid config origin {text!r}: replicas must all be http(s):// or all ws(s)://"
            )
        return OriginSpec(specs[0].kind, ",".join(s.location for s in specs), tls=specs[0].tls)
    if "://" in text:
        try:
            parts = urlsplit(text)
        except ValueError as exc:
            raise ConfigOriginError(f"invalid config origin {text!r}: {exc}") from None
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https", "ws", "wss"):
            raise ConfigOriginError(f"invalid config origin {text!r}: unknown scheme {scheme!r}")
        if not parts.netloc:
            raise ConfigOriginError(f"invalid config origin {text!r}: missing host")
        kind: OriginKind = "http" if scheme.startswith("http") else "ws"
        return OriginSpec(kind, f"{scheme}://{parts.netloc}", tls=scheme in ("https", "wss"))
    if _HOST_PORT.match(text):
        hostport = text.split("/", 1)[0]
        if hostport.startswith(":"):
            hostport = "127.0.0.1" + hostport
        return OriginSpec("http", f"http://{hostport}")
    return OriginSpec("file", text)


def resolve_id(flag: str | None, env: Mapping[str, str]) -> tuple[str, str]:
    """The `<namespace>/<name>` identity toward the CDS (flag, env pair, or a default)."""
    if flag:
        ident = flag
    elif env.get("STUNNER_NAMESPACE") and env.get("STUNNER_NAME"):
        ident = f"{env['STUNNER_NAMESPACE']}/{env['STUNNER_NAME']}"
    else:
        try:
            host = socket.gethostname()
        except OSError:
            host = ""
        if not host:
            import uuid  # (it imports platform) only for a host without a name

            host = str(uuid.uuid4())
        ident = f"default/stunnerd-{host}"
    parts = ident.split("/")
    if len(parts) != 2 or not all(parts):
        raise ConfigOriginError(f"invalid id {ident!r}: want <namespace>/<name>")
    return parts[0], parts[1]
