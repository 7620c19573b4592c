"""GatewayConfig → ``auth`` of the stunnerd config (https://github.com/l7mp/stunner/blob/main/docs/AUTH.md).

Credentials come either inline from the GatewayConfig or, when ``authRef`` is set, exclusively
from that Secret (no fallback to the inline fields). Upstream's type aliases apply in both places:
``static``/``plaintext`` and ``ephemeral``/``timewindowed``/``longterm``. Any problem is critical
for the Gateway, and the message names the object and field to fix. ``stunMode: true`` overrides
all of it: auth type ``none`` without credentials, so stunnerd answers STUN Binding on every
listener and refuses every TURN request. ``authLifetime`` (ephemeral auth only) travels in the
credentials as ``lifetime``: the auth service's default and ceiling for the credentials it gives.
"""

from __future__ import annotations

from typing import cast

from stunner_common.auth import CREDENTIAL_LIFETIME_KEY
from stunner_common.config import AuthConfig, AuthType, ConfigError
from stunner_common.crds import GatewayConfig, Secret
from stunner_operator.render.store import View

_ALIASES = {
    "static": "static",
    "plaintext": "static",
    "ephemeral": "ephemeral",
    "timewindowed": "ephemeral",
    "longterm": "ephemeral",
}


class AuthError(Exception):
    """A critical auth problem: ``reason`` is the condition reason, the text says what to fix."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def _normalise(auth_type: str, where: str) -> str:
    kind = _ALIASES.get(auth_type)
    if kind is None:
        raise AuthError(
            "InvalidAuthType",
            f"{where}: unknown auth type {auth_type!r} (use static or ephemeral)",
        )
    return kind


def render_auth(view: View, gwconfig: GatewayConfig) -> AuthConfig:
    spec = gwconfig.spec
    realm = spec.realm
    if spec.stun_mode:
        return AuthConfig(type="none", realm=realm, credentials={})
    if spec.auth_ref is not None:
        where, kind, credentials = _secret_credentials(view, gwconfig)
    else:
        where, kind, credentials = _inline_credentials(gwconfig)
    if kind == "ephemeral" and spec.auth_lifetime is not None and spec.auth_lifetime > 0:
        # for the auth service: the lifetime of the credentials it hands out
        credentials[CREDENTIAL_LIFETIME_KEY] = str(spec.auth_lifetime)
    try:
        return AuthConfig(type=cast(AuthType, kind), realm=realm, credentials=credentials)
    except (ConfigError, ValueError) as err:
        raise AuthError("InvalidAuthConfig", f"{where}: invalid auth config: {err}") from None


def _secret_credentials(view: View, gwconfig: GatewayConfig) -> tuple[str, str, dict[str, str]]:
    """(where, auth type, credentials) from the Secret the GatewayConfig's authRef names."""
    ref = gwconfig.spec.auth_ref
    assert ref is not None
    if (ref.group or "") not in ("", "v1") or (ref.kind or "Secret") != "Secret":
        raise AuthError(
            "ExternalAuthCredentialsNotFound",
            f"GatewayConfig {gwconfig.metadata.namespace}/{gwconfig.metadata.name}: authRef "
            f"must point to a Secret, not group {ref.group!r} kind {ref.kind!r}",
        )
    ns = ref.namespace or gwconfig.metadata.namespace
    secret = view.get(Secret, ns, ref.name)
    if secret is None:
        raise AuthError("ExternalAuthCredentialsNotFound", f"Secret {ns}/{ref.name} not found")
    where = f"Secret {ns}/{ref.name}"
    values = {k: v.decode("utf-8", errors="replace") for k, v in secret.values().items()}
    kind = _normalise(values.get("type", "static"), where)
    if kind == "static":
        if not values.get("username") or not values.get("password"):
            raise AuthError(
                "InvalidUsernamePassword",
                f"{where}: static auth needs the keys username and password",
            )
        return where, kind, {"username": values["username"], "password": values["password"]}
    secret_value = values.get("secret") or values.get("sharedSecret")
    if not secret_value:
        raise AuthError("InvalidSharedSecret", f"{where}: ephemeral auth needs the key secret")
    return where, kind, {"secret": secret_value}


def _inline_credentials(gwconfig: GatewayConfig) -> tuple[str, str, dict[str, str]]:
    """(where, auth type, credentials) from the GatewayConfig's own fields."""
    spec = gwconfig.spec
    where = f"GatewayConfig {gwconfig.metadata.namespace}/{gwconfig.metadata.name}"
    kind = _normalise(spec.auth_type, where)
    if kind == "static":
        if not spec.user_name or not spec.password:
            raise AuthError(
                "InvalidUsernamePassword",
                f"{where}: static auth needs spec.userName and spec.password "
                "(or an authRef Secret)",
            )
        return where, kind, {"username": spec.user_name, "password": spec.password}
    if not spec.shared_secret:
        raise AuthError(
            "InvalidSharedSecret",
            f"{where}: ephemeral auth needs spec.sharedSecret (or an authRef Secret)",
        )
    return where, kind, {"secret": spec.shared_secret}
