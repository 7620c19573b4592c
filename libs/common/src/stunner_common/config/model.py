"""The stunnerd config v1 as frozen pydantic models: one definition for writer and reader.

The operator renders these, the CDS stores and serves them, stunnerd reconciles against them, so
an instance is always *validated and canonical*: defaults filled in, enums normalised, legacy
aliases mapped (``plaintext``→``static``, bare ``UDP``→``TURN-UDP``), routes, endpoints and
interfaces sorted, listeners and clusters sorted by name. Two configs that mean the same thing
are therefore equal, and `StunnerConfig.canonical_json` gives equal bytes for them.

Input keys match case-insensitively and unknown keys are ignored, like Go's JSON decoder that
upstream stunnerd uses; ``null`` means "use the default". Constructing a model with bad values
raises `ConfigValidationError` (never pydantic's ValidationError) whose message follows upstream's
text and names the field path, e.g. ``listeners[0].protocol: unknown listener protocol: "foo"``.
The shared base class and rule helpers live in ``base.py``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final, Literal

from pydantic import Field, StrictStr, ValidationInfo, field_validator, model_validator

from stunner_common.config.base import (
    GoInt,
    _check_url,
    _enum,
    _Model,
    _RuleError,
    config_error_from,
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
    "config_error_from",
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


def _enum_field(
    field: str, default: str, table: Mapping[str, str], message: str, *, fold: str = "upper"
) -> Any:
    """A validator of an enumerated field: empty means ``default``, else one of ``table``'s
    keys (folded as ``fold`` says), or the error ``message: "value"``."""

    def check(cls: type, value: Any) -> Any:
        if value == "":
            return default
        return _enum(value, table, message, fold=fold)

    return field_validator(field, mode="before")(check)


def _or_default(field: str, default: str) -> Any:
    """A validator that reads an empty string field as ``default``."""

    def check(cls: type, value: str) -> str:
        return value or default

    return field_validator(field, mode="after")(check)


def _name_field(what: str) -> Any:
    """A validator that refuses an empty ``name`` (``missing name in <what> configuration``)."""

    def check(cls: type, value: str) -> str:
        if not value:
            raise _RuleError(f"missing name in {what} configuration")
        return value

    return field_validator("name", mode="after")(check)


class LicenseConfig(_Model):
    """Licensing info passed through to the (open-source: no-op) license manager."""

    key: StrictStr = ""
    hmac: StrictStr = ""


class AdminConfig(_Model):
    """Process-wide settings: identity, logging, health and metrics servers, quota, offload."""

    name: StrictStr = DEFAULT_STUNNER_NAME
    loglevel: StrictStr = DEFAULT_LOGLEVEL
    metrics_endpoint: StrictStr = ""
    healthcheck_endpoint: StrictStr | None = DEFAULT_HEALTHCHECK_ENDPOINT
    user_quota: GoInt = 0
    offload_engine: OffloadEngine = "None"
    offload_interfaces: tuple[StrictStr, ...] = ()
    license_config: LicenseConfig | None = None

    _default_name = _or_default("name", DEFAULT_STUNNER_NAME)
    _default_loglevel = _or_default("loglevel", DEFAULT_LOGLEVEL)

    @field_validator("metrics_endpoint", mode="after")
    @classmethod
    def _check_metrics(cls, value: str) -> str:
        return _check_url(value, "metric server")

    @field_validator("healthcheck_endpoint", mode="after")
    @classmethod
    def _check_health(cls, value: str | None) -> str:
        if value is None:
            return DEFAULT_HEALTHCHECK_ENDPOINT
        return _check_url(value, "health-check server")

    @field_validator("user_quota", mode="after")
    @classmethod
    def _clamp_quota(cls, value: int) -> int:
        return max(value, 0)

    _offload = _enum_field(
        "offload_engine", "None", _OFFLOAD_ENGINES, "unknown offload mode", fold="lower"
    )

    @field_validator("offload_interfaces", mode="after")
    @classmethod
    def _sort_interfaces(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(sorted(value))


class AuthConfig(_Model):
    """TURN authentication: ``static`` user/password, ``ephemeral`` TURN REST secret, or none.

    `credentials` is a plain dict for upstream compatibility; treat it as read-only.
    """

    type: AuthType = "static"
    realm: StrictStr = DEFAULT_REALM
    credentials: dict[StrictStr, StrictStr] = Field(default_factory=dict, validate_default=True)

    _auth_type = _enum_field(
        "type", "static", _AUTH_TYPES, "unknown authentication type", fold="none"
    )

    _default_realm = _or_default("realm", DEFAULT_REALM)

    @field_validator("credentials", mode="after")
    @classmethod
    def _check_credentials(cls, value: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        auth_type = info.data.get("type")
        if auth_type == "static" and ("username" not in value or "password" not in value):
            raise _RuleError("static: empty username or password")
        if auth_type == "ephemeral" and "secret" not in value:
            raise _RuleError("no secret found in ephemeral auth config")
        return dict(sorted(value.items()))

    def __hash__(self) -> int:
        return hash((self.type, self.realm, tuple(sorted(self.credentials.items()))))


class ListenerConfig(_Model):
    """One TURN listener. `address` is the relay IP advertised to clients (often `$STUNNER_ADDR`
    before env substitution), so any string is kept; stunnerd checks it is an IP."""

    name: StrictStr
    protocol: ListenerProtocol = "TURN-UDP"
    address: StrictStr = "0.0.0.0"
    port: GoInt = DEFAULT_PORT
    public_address: StrictStr = ""
    public_port: GoInt = 0
    cert: StrictStr = Field(default="", validate_default=True)
    key: StrictStr = Field(default="", validate_default=True)
    routes: tuple[StrictStr, ...] = ()

    _name_required = _name_field("listener")
    _protocol = _enum_field(
        "protocol", "TURN-UDP", _LISTENER_PROTOCOLS, "unknown listener protocol"
    )

    @field_validator("address", mode="after")
    @classmethod
    def _address(cls, value: str) -> str:
        if value == "":
            return "0.0.0.0"
        if value.lower() == "localhost":
            return "127.0.0.1"
        return value

    @field_validator("port", mode="after")
    @classmethod
    def _port(cls, value: int) -> int:
        if value == 0:
            return DEFAULT_PORT
        if not 1 <= value <= MAX_PORT:
            raise _RuleError(f"invalid port: {value}")
        return value

    @field_validator("public_port", mode="after")
    @classmethod
    def _public_port(cls, value: int) -> int:
        if not 0 <= value <= MAX_PORT:
            raise _RuleError(f"invalid public port: {value}")
        return value

    @field_validator("cert", "key", mode="after")
    @classmethod
    def _tls_material(cls, value: str, info: ValidationInfo) -> str:
        protocol = info.data.get("protocol")
        if protocol not in TLS_PROTOCOLS:
            return value
        what = info.field_name or "cert"
        if not value.strip():
            label = "cert" if what == "cert" else "key"
            raise _RuleError(f"empty TLS {label} for {protocol} listener")
        try:
            decode_pem(value, what=what)
        except ValueError as exc:
            raise _RuleError(str(exc)) from None
        return strip_base64(value)

    @field_validator("routes", mode="after")
    @classmethod
    def _sort_routes(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(sorted(value))


class ClusterConfig(_Model):
    """A set of peers: STATIC endpoints (prefix + port range) or STRICT_DNS names."""

    name: StrictStr
    type: ClusterType = "STATIC"
    protocol: ClusterProtocol = "UDP"
    endpoints: tuple[StrictStr, ...] = ()

    _name_required = _name_field("cluster")
    _type = _enum_field("type", "STATIC", _CLUSTER_TYPES, "unknown cluster type")
    _protocol = _enum_field("protocol", "UDP", _CLUSTER_PROTOCOLS, "unknown cluster protocol")

    @field_validator("endpoints", mode="after")
    @classmethod
    def _endpoints(cls, value: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        if info.data.get("type", "STATIC") != "STATIC":
            return tuple(sorted(value))
        canonical = []
        for text in value:
            try:
                canonical.append(canonical_endpoint(text))
            except ConfigValidationError as exc:
                raise _RuleError(exc.message) from None
        return tuple(sorted(canonical))


def _unique_names(items: tuple[ListenerConfig, ...] | tuple[ClusterConfig, ...], kind: str) -> None:
    seen: set[str] = set()
    for item in items:
        if item.name in seen:
            raise _RuleError(f'duplicate {kind} name: "{item.name}"')
        seen.add(item.name)


class StunnerConfig(_Model):
    """A whole stunnerd config, validated and in canonical form."""

    version: StrictStr = API_VERSION
    admin: AdminConfig = Field(default_factory=AdminConfig)
    auth: AuthConfig
    listeners: tuple[ListenerConfig, ...] = ()
    clusters: tuple[ClusterConfig, ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _auth_present(cls, data: Any) -> Any:
        # A missing auth section is an empty one, which fails with upstream's message (static
        # auth without credentials) instead of a bare "field required".
        if not isinstance(data, Mapping):
            return data
        for key, value in data.items():
            if isinstance(key, str) and key.casefold() == "auth" and value is not None:
                return data
        return {**data, "auth": {}}

    @field_validator("version", mode="after")
    @classmethod
    def _version(cls, value: str) -> str:
        if value != API_VERSION:
            raise _RuleError(f'unsupported API version: "{value}"')
        return value

    @field_validator("listeners", mode="after")
    @classmethod
    def _sort_listeners(cls, value: tuple[ListenerConfig, ...]) -> tuple[ListenerConfig, ...]:
        _unique_names(value, "listener")
        return tuple(sorted(value, key=lambda item: item.name))

    @field_validator("clusters", mode="after")
    @classmethod
    def _sort_clusters(cls, value: tuple[ClusterConfig, ...]) -> tuple[ClusterConfig, ...]:
        _unique_names(value, "cluster")
        return tuple(sorted(value, key=lambda item: item.name))

    def canonical_json(self) -> str:
        """Byte-stable JSON: sorted keys, no spaces. Equal configs give equal strings."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    def listener(self, name: str) -> ListenerConfig | None:
        """The listener called `name`, if any."""
        return next((item for item in self.listeners if item.name == name), None)

    def cluster(self, name: str) -> ClusterConfig | None:
        """The cluster called `name`, if any."""
        return next((item for item in self.clusters if item.name == name), None)
