"""From the stunnerd configs to what a WebRTC client needs: TURN URIs and credentials.

Pure functions with the time passed in. The answers follow upstream stunner-auth-service: a
TURN REST API stanza (draft-uberti-behave-turn-rest-00 §2.2: username, password, ttl, uris) for
``GET /?service=turn`` and an RTCConfiguration (``iceServers``, ``iceTransportPolicy``) for
``GET /ice``. Configs are selected by namespace and Gateway (the config id is ``ns/gateway``)
and listeners by name; configs that share the same auth settings share one ICE server entry,
so that a client gets one username and password per realm and secret.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from stunner_common.auth import credential_lifetime, ephemeral_credentials
from stunner_common.config import AuthConfig, ListenerConfig, StunnerConfig
from stunner_common.contracts.listener_address import (
    NODE_ADDRESS_PLACEHOLDER,
    POD_ADDRESS,
    WILDCARD_ADDRESSES,
)
from stunner_common.turnuri import listener_turn_uri

DEFAULT_TTL_S = 86400
"""Lifetime of ephemeral credentials when the client asks for none: one day, as upstream."""

IcePolicy = Literal["all", "relay"]
# A listener with none of these has no address a client can use: a wildcard, or a placeholder
# that only a stunnerd pod can expand (its pod IP, its node's address). Such a listener waits for
# a public address (a load balancer's, a node's external IP with the node port, or the Gateway's
# spec.addresses); until it has one, clients get no URI for it rather than a placeholder.
_UNREACHABLE = WILDCARD_ADDRESSES | {NODE_ADDRESS_PLACEHOLDER, POD_ADDRESS}


class NoMatchError(LookupError):
    """No config (or no listener with a usable address) matches the query."""


@dataclass(frozen=True, slots=True)
class IceQuery:
    """The filters of a request; None matches everything."""

    namespace: str | None = None
    gateway: str | None = None
    listener: str | None = None
    username: str | None = None
    ttl_s: int = DEFAULT_TTL_S
    ice_transport_policy: IcePolicy = "all"
    ttl_given: bool = False
    """The client asked for `ttl_s`; otherwise it is the service's default."""


@dataclass(frozen=True, slots=True)
class IceServer:
    urls: tuple[str, ...]
    username: str
    credential: str


def _listener_short_name(listener: ListenerConfig) -> str:
    """Listener names are ``ns/gateway/listener``; the query names the last part."""
    return listener.name.rsplit("/", 1)[-1]


def _client_address(listener: ListenerConfig) -> str:
    return listener.public_address or listener.address


def select_uris(
    configs: Mapping[str, StunnerConfig], query: IceQuery
) -> list[tuple[AuthConfig, list[str]]]:
    """The matching configs' URIs grouped by auth settings, in config id order."""
    groups: dict[AuthConfig, list[str]] = {}
    for config_id in sorted(configs):
        namespace, _, gateway = config_id.partition("/")
        if query.namespace is not None and namespace != query.namespace:
            continue
        if query.gateway is not None and gateway != query.gateway:
            continue
        config = configs[config_id]
        uris = [
            listener_turn_uri(listener)
            for listener in config.listeners
            if (
                query.listener is None
                or query.listener in (_listener_short_name(listener), listener.name)
            )
            and _client_address(listener) not in _UNREACHABLE
        ]
        if uris:
            groups.setdefault(config.auth, []).extend(uris)
    if not groups:
        raise NoMatchError(_describe(query))
    return list(groups.items())


def _describe(query: IceQuery) -> str:
    filters = [
        f"{name}={value}"
        for name, value in (
            ("namespace", query.namespace),
            ("gateway", query.gateway),
            ("listener", query.listener),
        )
        if value is not None
    ]
    where = f" matching {', '.join(filters)}" if filters else ""
    return f"no Gateway{where} has a listener with a client-reachable address"


def lifetime_s(auth: AuthConfig, query: IceQuery) -> int:
    """The lifetime of `auth`'s credentials: the GatewayConfig's `authLifetime` (carried in the
    ephemeral credentials) is the default and the ceiling; a shorter asked `ttl` wins."""
    limit = credential_lifetime(auth.credentials) if auth.type == "ephemeral" else None
    if limit is None:
        return query.ttl_s
    return min(query.ttl_s, limit) if query.ttl_given else limit


def credentials(auth: AuthConfig, query: IceQuery, now: float) -> tuple[str, str]:
    """(username, password) for `auth`: the static pair, or TURN REST ones valid for the TTL."""
    if auth.type == "ephemeral":
        return ephemeral_credentials(
            auth.credentials["secret"],
            ttl_s=lifetime_s(auth, query),
            now=now,
            user_id=query.username,
        )
    if auth.type == "static":
        return auth.credentials["username"], auth.credentials["password"]
    return "", ""


def ice_servers(
    configs: Mapping[str, StunnerConfig], query: IceQuery, now: float
) -> list[IceServer]:
    servers = []
    for auth, uris in select_uris(configs, query):
        username, password = credentials(auth, query, now)
        servers.append(IceServer(tuple(uris), username, password))
    return servers


def turn_rest_answer(
    configs: Mapping[str, StunnerConfig], query: IceQuery, now: float
) -> dict[str, object]:
    """The TURN REST API stanza: the first auth group's credentials and URIs."""
    auth, uris = select_uris(configs, query)[0]
    username, password = credentials(auth, query, now)
    return {
        "username": username,
        "password": password,
        "ttl": lifetime_s(auth, query),
        "uris": uris,
    }


def ice_config(
    configs: Mapping[str, StunnerConfig], query: IceQuery, now: float
) -> dict[str, object]:
    """An RTCConfiguration (W3C WebRTC §4.2.1) a browser can pass to RTCPeerConnection."""
    return {
        "iceServers": [
            {"urls": list(s.urls), "username": s.username, "credential": s.credential}
            for s in ice_servers(configs, query, now)
        ],
        "iceTransportPolicy": query.ice_transport_policy,
    }
