"""The stunnerd config v1 as frozen models: one definition for writer and reader.

The operator renders these, the CDS stores and serves them, stunnerd reconciles against them, so
an instance is always *validated and canonical*: defaults filled in, enums normalised, legacy
aliases mapped (``plaintext``→``static``, bare ``UDP``→``TURN-UDP``), routes, endpoints and
interfaces sorted, listeners and clusters sorted by name. Two configs that mean the same thing
are therefore equal, and `StunnerConfig.canonical_json` gives equal bytes for them.

Input keys match case-insensitively and unknown keys are ignored, like Go's JSON decoder that
upstream stunnerd uses; ``null`` means "use the default". Constructing a model with bad values
raises `ConfigValidationError` whose message follows upstream's text and names the field path,
e.g. ``listeners[0].protocol: unknown listener protocol: "foo"``. The models are plain slotted
classes (``base.py`` says why, and holds the base class and the checks of JSON types); each
lists its `Field`s in declaration order, which is also the order the rules are checked in.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Final, Literal

from stunner_common.config.base import (
    _check_url,
    _enum,
    _Model,
    _RuleError,
    field,
    go_int,
    str_dict,
    str_tuple,
    strict_str,
)
from stunner_common.config.endpoint import MAX_PORT, canonical_endpoint
from stunner_common.config.errors import ConfigValidationError
from stunner_common.config.tls import decode_pem, strip_base64

__all__ = [
    "API_VERSION",
    "DEFAULT_HEALTHCHECK_ENDPOINT",
    "DEFAULT_LOGLEVEL",
    "DEFAULT_PORT",
    "DEFAULT_REALM",
    "DEFAULT_STUNNER_NAME",
    "TLS_PROTOCOLS",
    "AdminConfig",
    "AuthConfig",
    "AuthType",
    "ClusterConfig",
    "ClusterProtocol",
    "ClusterType",
    "LicenseConfig",
    "ListenerConfig",
    "ListenerProtocol",
    "OffloadEngine",
    "StunnerConfig",
]

API_VERSION: Final = "v1"
DEFAULT_STUNNER_NAME: Final = "default-stunnerd"
DEFAULT_LOGLEVEL: Final = "all:INFO"
DEFAULT_HEALTHCHECK_ENDPOINT: Final = "http://:8086"
DEFAULT_REALM: Final = "stunner.l7mp.io"
DEFAULT_PORT: Final = 3478

AuthType = Literal["static", "ephemeral", "none"]
ListenerProtocol = Literal["TURN-UDP", "TURN-TCP", "TURN-TLS", "TURN-DTLS"]
ClusterType = Literal["STATIC", "STRICT_DNS"]
ClusterProtocol = Literal["UDP", "TCP"]
OffloadEngine = Literal["None", "XDP", "TC", "Auto"]

TLS_PROTOCOLS: Final = frozenset({"TURN-TLS", "TURN-DTLS"})

# auth.type is case-sensitive upstream; the others are not.
_AUTH_TYPES: Final[Mapping[str, AuthType]] = {
    "static": "static",
    "plaintext": "static",
    "ephemeral": "ephemeral",
    "longterm": "ephemeral",
    "none": "none",
}
_LISTENER_PROTOCOLS: Final[Mapping[str, ListenerProtocol]] = {
    "UDP": "TURN-UDP",
    "TCP": "TURN-TCP",
    "TLS": "TURN-TLS",
    "DTLS": "TURN-DTLS",
    "TURN-UDP": "TURN-UDP",
    "TURN-TCP": "TURN-TCP",
    "TURN-TLS": "TURN-TLS",
    "TURN-DTLS": "TURN-DTLS",
}
_CLUSTER_TYPES: Final[Mapping[str, ClusterType]] = {"STATIC": "STATIC", "STRICT_DNS": "STRICT_DNS"}
_CLUSTER_PROTOCOLS: Final[Mapping[str, ClusterProtocol]] = {"UDP": "UDP", "TCP": "TCP"}
_OFFLOAD_ENGINES: Final[Mapping[str, OffloadEngine]] = {
    "none": "None",
    "xdp": "XDP",
    "tc": "TC",
    "auto": "Auto",
}


Check = Callable[[Any, Mapping[str, Any]], Any]


def _enum_field(
    default: str, table: Mapping[str, str], message: str, *, fold: str = "upper"
) -> Check:
    """The check of an enumerated field: empty means ``default``, else one of ``table``'s keys
    (folded as ``fold`` says), or the error ``message: "value"``."""

    def check(value: Any, data: Mapping[str, Any]) -> str:
        if value == "":
            return default
        return _enum(value, table, message, fold=fold)

    return check


def _or_default(default: str) -> Check:
    """The check of a string field that reads an empty string as ``default``."""

    def check(value: Any, data: Mapping[str, Any]) -> str:
        return strict_str(value) or default

    return check


def _missing_name(what: str) -> str:
    return f"missing name in {what} configuration"


def _name(what: str) -> Check:
    """The check of a ``name`` that may not be empty (``missing name in <what> configuration``)."""

    def check(value: Any, data: Mapping[str, Any]) -> str:
        name = strict_str(value)
        if not name:
            raise _RuleError(_missing_name(what))
        return name

    return check


def _sorted_strs(value: Any, data: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(sorted(str_tuple(value)))


class LicenseConfig(_Model):
    """Licensing info passed through to the (open-source: no-op) license manager."""

    key: str = field(strict_str, default="")
    hmac: str = field(strict_str, default="")


def _metrics_endpoint(value: Any, data: Mapping[str, Any]) -> str:
    return _check_url(strict_str(value), "metric server")


def _health_endpoint(value: Any, data: Mapping[str, Any]) -> str:
    return _check_url(strict_str(value), "health-check server")


def _user_quota(value: Any, data: Mapping[str, Any]) -> int:
    return max(go_int(value), 0)


class AdminConfig(_Model):
    """Process-wide settings: identity, logging, health and metrics servers, quota, offload."""

    name: str = field(_or_default(DEFAULT_STUNNER_NAME), default=DEFAULT_STUNNER_NAME)
    loglevel: str = field(_or_default(DEFAULT_LOGLEVEL), default=DEFAULT_LOGLEVEL)
    metrics_endpoint: str = field(_metrics_endpoint, default="")
    healthcheck_endpoint: str = field(_health_endpoint, default=DEFAULT_HEALTHCHECK_ENDPOINT)
    user_quota: int = field(_user_quota, default=0)
    offload_engine: OffloadEngine = field(
        _enum_field("None", _OFFLOAD_ENGINES, "unknown offload mode", fold="lower"), default="None"
    )
    offload_interfaces: tuple[str, ...] = field(_sorted_strs, default=())
    license_config: LicenseConfig | None = field(LicenseConfig.check, default=None)


def _credentials(value: Any, data: Mapping[str, Any]) -> dict[str, str]:
    credentials = str_dict(value)
    auth_type = data.get("type")
    if auth_type == "static" and ("username" not in credentials or "password" not in credentials):
        raise _RuleError("static: empty username or password")
    if auth_type == "ephemeral" and "secret" not in credentials:
        raise _RuleError("no secret found in ephemeral auth config")
    return dict(sorted(credentials.items()))


class AuthConfig(_Model):
    """TURN authentication: ``static`` user/password, ``ephemeral`` TURN REST secret, or none.

    `credentials` is a plain dict for upstream compatibility; treat it as read-only.
    """

    type: AuthType = field(
        _enum_field("static", _AUTH_TYPES, "unknown authentication type", fold="none"),
        default="static",
    )
    realm: str = field(_or_default(DEFAULT_REALM), default=DEFAULT_REALM)
    credentials: dict[str, str] = field(_credentials, default_factory=dict, validate_default=True)

    def __hash__(self) -> int:
        return hash((self.type, self.realm, tuple(sorted(self.credentials.items()))))


def _address(value: Any, data: Mapping[str, Any]) -> str:
    text = strict_str(value)
    if text == "":
        return "0.0.0.0"
    if text.lower() == "localhost":
        return "127.0.0.1"
    return text


def _port(value: Any, data: Mapping[str, Any]) -> int:
    port = go_int(value)
    if port == 0:
        return DEFAULT_PORT
    if not 1 <= port <= MAX_PORT:
        raise _RuleError(f"invalid port: {port}")
    return port


def _public_port(value: Any, data: Mapping[str, Any]) -> int:
    port = go_int(value)
    if not 0 <= port <= MAX_PORT:
        raise _RuleError(f"invalid public port: {port}")
    return port


def _tls_material(what: str) -> Check:
    """The check of ``cert`` or ``key``: base64 PEM on a TLS or DTLS listener, else anything."""

    def check(value: Any, data: Mapping[str, Any]) -> str:
        text = strict_str(value)
        protocol = data.get("protocol")
        if protocol not in TLS_PROTOCOLS:
            return text
        if not text.strip():
            raise _RuleError(f"empty TLS {what} for {protocol} listener")
        try:
            decode_pem(text, what=what)
        except ValueError as exc:
            raise _RuleError(str(exc)) from None
        return strip_base64(text)

    return check


class ListenerConfig(_Model):
    """One TURN listener. `address` is the relay IP advertised to clients (often `$STUNNER_ADDR`
    before env substitution), so any string is kept; stunnerd checks it is an IP."""

    name: str = field(_name("listener"), missing=_missing_name("listener"))
    protocol: ListenerProtocol = field(
        _enum_field("TURN-UDP", _LISTENER_PROTOCOLS, "unknown listener protocol"),
        default="TURN-UDP",
    )
    address: str = field(_address, default="0.0.0.0")
    port: int = field(_port, default=DEFAULT_PORT)
    public_address: str = field(strict_str, default="")
    public_port: int = field(_public_port, default=0)
    cert: str = field(_tls_material("cert"), default="", validate_default=True)
    key: str = field(_tls_material("key"), default="", validate_default=True)
    routes: tuple[str, ...] = field(_sorted_strs, default=())


def _endpoints(value: Any, data: Mapping[str, Any]) -> tuple[str, ...]:
    texts = str_tuple(value)
    if data.get("type", "STATIC") != "STATIC":
        return tuple(sorted(texts))
    canonical = []
    for text in texts:
        try:
            canonical.append(canonical_endpoint(text))
        except ConfigValidationError as exc:
            raise _RuleError(exc.message) from None
    return tuple(sorted(canonical))


class ClusterConfig(_Model):
    """A set of peers: STATIC endpoints (prefix + port range) or STRICT_DNS names."""

    name: str = field(_name("cluster"), missing=_missing_name("cluster"))
    type: ClusterType = field(
        _enum_field("STATIC", _CLUSTER_TYPES, "unknown cluster type"), default="STATIC"
    )
    protocol: ClusterProtocol = field(
        _enum_field("UDP", _CLUSTER_PROTOCOLS, "unknown cluster protocol"), default="UDP"
    )
    endpoints: tuple[str, ...] = field(_endpoints, default=())


def _unique_names(items: tuple[ListenerConfig, ...] | tuple[ClusterConfig, ...], kind: str) -> None:
    seen: set[str] = set()
    for item in items:
        if item.name in seen:
            raise _RuleError(f'duplicate {kind} name: "{item.name}"')
        seen.add(item.name)


def _version(value: Any, data: Mapping[str, Any]) -> str:
    version = strict_str(value)
    if version != API_VERSION:
        raise _RuleError(f'unsupported API version: "{version}"')
    return version


def _listeners(value: Any, data: Mapping[str, Any]) -> tuple[ListenerConfig, ...]:
    items = ListenerConfig.tuple_of(value)
    _unique_names(items, "listener")
    return tuple(sorted(items, key=lambda item: item.name))


def _clusters(value: Any, data: Mapping[str, Any]) -> tuple[ClusterConfig, ...]:
    items = ClusterConfig.tuple_of(value)
    _unique_names(items, "cluster")
    return tuple(sorted(items, key=lambda item: item.name))


class StunnerConfig(_Model):
    """A whole stunnerd config, validated and in canonical form."""

    version: str = field(_version, default=API_VERSION)
    admin: AdminConfig = field(AdminConfig.check, default_factory=AdminConfig)
    # A missing auth section is an empty one, which fails with upstream's message (static auth
    # without credentials) instead of "missing required field".
    auth: AuthConfig = field(AuthConfig.check, default_factory=dict, validate_default=True)
    listeners: tuple[ListenerConfig, ...] = field(_listeners, default=())
    clusters: tuple[ClusterConfig, ...] = field(_clusters, default=())

    def canonical_json(self) -> str:
        """Byte-stable JSON: sorted keys, no spaces. Equal configs give equal strings."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    def listener(self, name: str) -> ListenerConfig | None:
        """The listener called `name`, if any."""
        return next((item for item in self.listeners if item.name == name), None)

    def cluster(self, name: str) -> ClusterConfig | None:
        """The cluster called `name`, if any."""
        return next((item for item in self.clusters if item.name == name), None)
