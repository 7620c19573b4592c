"""Resolve `k8s://namespace/gateway:listener` through the config discovery service (CDS).

The CDS serves the stunnerd config of every Gateway (`GET /api/v1/configs/{ns}/{gw}`); the
listener named in the URI carries the public address, port and protocol a client should use,
and the config's auth section says how to log in. For ephemeral auth only the shared secret is
known, so fresh TURN REST credentials are minted for every session, as upstream turncat does.
The CDS address comes from `--cds-server-address`, else `CDS_SERVER_ADDR` (upstream's name;
`STUNNER_CDS_ADDR` still works, with a deprecation warning); without one, a kubeconfig
(`--kubeconfig`, `KUBECONFIG`, `~/.kube/config`; `--context`) finds the CDS pod and a
port-forward through the API server reaches it (`stunner_common.io.kube`, see
:func:`cds_endpoint`); without either, 127.0.0.1:13478 (where `make run` and compose put it).
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

from stunner_common.auth import ephemeral_credentials
from stunner_common.cli import cds_address, check_token_file
from stunner_common.config import ConfigError, ListenerConfig, StunnerConfig, parse_config
from stunner_common.io.cds import (
    CdsAddressError,
    CdsClient,
    CdsHttpError,
    CdsUnreachableError,
    TokenSource,
    token_source,
)
from stunner_common.io.cds import cds_base_url as _cds_base_url
from stunner_common.io.kube import (
    KubeApi,
    KubeDiscoveryError,
    KubeOptions,
    open_cds_forward,
    wants_kube_discovery,
)
from turncat.errors import (
    AuthFailedError,
    BadInputError,
    LookupFailedError,
    TurncatError,
    UnreachableError,
)
from turncat.session import Credentials, CredentialSource
from turncat.uri import TRANSPORT_BY_PROTOCOL, K8sTarget, TurnTarget

log = logging.getLogger(__name__)

EPHEMERAL_TTL_S = 3600
CDS_NAMESPACE_ENV = "CDS_SERVER_NAMESPACE"


@dataclass(frozen=True, slots=True)
class CdsEndpoint:
    """Where to ask the CDS and with which token; ``kube`` is the API server it was found
    through (None when given an address)."""

    address: str
    token: TokenSource | None
    kube: KubeApi | None = None

    @property
    def forwarded(self) -> bool:
        return self.kube is not None


def _discovery_error(exc: KubeDiscoveryError) -> TurncatError:
    if exc.reason == "forbidden":
        return AuthFailedError(str(exc), 403)
    if exc.reason == "unreachable":
        return UnreachableError(str(exc))
    if exc.reason == "kubeconfig":
        return BadInputError(str(exc))
    return LookupFailedError(str(exc))


@contextlib.asynccontextmanager
async def cds_endpoint(
    prog: str,
    env: Mapping[str, str],
    *,
    address_flag: str | None,
    token_file: str | None,
    kube: KubeOptions,
    timeout_s: float,
) -> AsyncIterator[CdsEndpoint]:
    """The CDS to use while inside: the address given, else one found through the kubeconfig
    (a port-forward, closed on leaving), else the loopback default.

    The token: ``--cds-token-file``, else (through the kubeconfig) the chart's Secret when the
    user may read it, else ``CDS_TOKEN_FILE`` or ``CDS_TOKEN``.
    """
    path = token_file or env.get("CDS_TOKEN_FILE") or None
    if (problem := check_token_file(path)) is not None:
        raise BadInputError(problem)
    configured = token_source(env, token_file)
    if not wants_kube_discovery(env, address_flag, kube):
        address, warnings = cds_address(env, address_flag)
        for warning in warnings:
            print(f"{prog}: warning: {warning}", file=sys.stderr)
        yield CdsEndpoint(address, configured)
        return
    if kube.namespace is None and env.get(CDS_NAMESPACE_ENV, "").strip():
        kube = KubeOptions(kube.kubeconfig, kube.context, env[CDS_NAMESPACE_ENV].strip())
    async with contextlib.AsyncExitStack() as stack:
        try:
            forward = await stack.enter_async_context(
                open_cds_forward(kube, env, timeout_s=timeout_s)
            )
        except KubeDiscoveryError as exc:
            raise _discovery_error(exc) from None
        token = configured
        if forward.token and not token_file:
            token = TokenSource(forward.token)
        log.info("the CDS through the kubeconfig: forward up in %.3fs", forward.started_s)
        yield CdsEndpoint(forward.address, token, forward.api)


def kube_options(args: object) -> KubeOptions:
    """kubectl's flags from parsed arguments (absent ones are None)."""
    return KubeOptions(
        kubeconfig=getattr(args, "kubeconfig", None),
        context=getattr(args, "context", None),
        namespace=getattr(args, "cds_server_namespace", None),
    )


def cds_base_url(address: str) -> str:
    """`host[:port]` or an http(s) URL to a base URL; the port defaults to 13478."""
    try:
        return _cds_base_url(address)
    except CdsAddressError as exc:
        raise LookupFailedError(str(exc)) from None


def cds_failure(
    exc: CdsUnreachableError | CdsHttpError, base: str, what: str, *, has_token: bool
) -> TurncatError:
    """The error to report for a failed CDS request about `what` (e.g. "gateway ns/name")."""
    if isinstance(exc, CdsUnreachableError):
        return UnreachableError(f"cannot reach the CDS at {base}: {exc}")
    if exc.status in (401, 403):
        return AuthFailedError(
            f"the CDS at {base} refused the request ({exc.status}): the bearer token is "
            f"{'wrong' if has_token else 'missing'}; set CDS_TOKEN or --cds-token-file",
            exc.status,
        )
    if exc.status == 404:
        return LookupFailedError(f"the CDS at {base} has no config for {what}")
    return LookupFailedError(
        f"the CDS at {base} answered {exc.status} for {what}: {exc.body[:200]}"
    )


async def diagnose_cds(client: CdsClient, namespace: str | None, name: str | None) -> str:
    """Why a lookup found nothing, in user terms: "" (nothing more to say), a hint naming the
    namespaces that do hold such a Gateway, or that the server is not a CDS at all.

    One more bounded GET of the config list: a CDS answers it with ``{"items": [...]}``; the
    auth service, a stunnerd health port or any other HTTP server does not.
    """
    try:
        body = await client.get()
        items = json.loads(body)["items"]
        names = [str(item["admin"]["name"]) for item in items or []]
    except (CdsUnreachableError, CdsHttpError, ValueError, KeyError, TypeError):
        return (
            f"{client.base_url} does not answer like a config discovery service "
            f"(GET /api/v1/configs gives no config list): point --cds or CDS_SERVER_ADDR at the "
            f"CDS (port 13478 unless moved)"
        )
    if name is not None:
        elsewhere = sorted(n for n in names if n.partition("/")[2] == name)
        if elsewhere:
            spots = ", ".join(elsewhere)
            ns = elsewhere[0].partition("/")[0]
            return f"it serves {spots}: try {ns}/{name} or -n {ns}"
        if names:
            return f"the Gateways it serves: {', '.join(sorted(names))}"
        return "it serves no Gateway at all"
    if namespace is not None:
        namespaces = sorted({n.partition("/")[0] for n in names})
        if namespaces:
            return f"its Gateways are in namespace(s) {', '.join(namespaces)}"
    return ""


async def fetch_config(
    target: K8sTarget,
    cds_address: str,
    timeout_s: float,
    token: str | TokenSource | None = None,
    *,
    env: Mapping[str, str],
) -> StunnerConfig:
    base = cds_base_url(cds_address)
    client = CdsClient(base, token=token, timeout_s=timeout_s)
    what = f"gateway {target.namespace}/{target.gateway}"
    try:
        body = await client.get(target.namespace, target.gateway)
    except (CdsUnreachableError, CdsHttpError) as exc:
        failure = cds_failure(exc, base, what, has_token=bool(token))
        if isinstance(exc, CdsHttpError) and exc.status == 404:
            hint = await diagnose_cds(client, target.namespace, target.gateway)
            failure = LookupFailedError(f"{failure}; {hint}" if hint else str(failure))
        raise failure from None
    try:
        return parse_config(body, env=env)
    except ConfigError as exc:
        hint = await diagnose_cds(client, None, None)
        raise LookupFailedError(
            hint or f"the CDS sent an invalid config for {target.namespace}/{target.gateway}: {exc}"
        ) from None


def pick_listener(config: StunnerConfig, target: K8sTarget) -> ListenerConfig:
    """The listener named `<ns>/<gateway>/<listener>` (the operator's naming), or an error."""
    found = [
        lst
        for lst in config.listeners
        if lst.name == f"{target.namespace}/{target.gateway}/{target.listener}"
        or (lst.name.count("/") == 2 and lst.name.split("/")[2] == target.listener)
    ]
    if not found:
        names = ", ".join(lst.name for lst in config.listeners) or "none"
        raise LookupFailedError(
            f"gateway {target.namespace}/{target.gateway} has no listener {target.listener!r} "
            f"(listeners: {names})"
        )
    if len(found) > 1:
        raise LookupFailedError(f"found multiple listeners named {target.listener!r}")
    return found[0]


def credential_source(config: StunnerConfig) -> CredentialSource:
    auth = config.auth
    creds = auth.credentials
    if auth.type == "static":
        user, password = creds.get("username"), creds.get("password")
        if not user or not password:
            raise LookupFailedError("static auth in the CDS config lacks username or password")
        fixed: Credentials = (user, password)
        return lambda: fixed
    if auth.type == "ephemeral":
        secret = creds.get("secret")
        if not secret:
            raise LookupFailedError("ephemeral auth in the CDS config lacks the secret")
        return lambda: ephemeral_credentials(secret, ttl_s=EPHEMERAL_TTL_S, now=time.time())
    return lambda: None


async def resolve_k8s(
    target: K8sTarget,
    cds_address: str | None,
    timeout_s: float,
    token: str | TokenSource | None = None,
    *,
    env: Mapping[str, str],
) -> tuple[TurnTarget, CredentialSource]:
    """Look the listener up in the CDS and return where to connect and how to log in; ``env``
    (the settings' ``environ``) fills the ``$VAR`` references of the config."""
    if not cds_address:
        raise LookupFailedError(
            "k8s:// needs the CDS address: pass --cds-server-address or set CDS_SERVER_ADDR"
        )
    config = await fetch_config(target, cds_address, timeout_s, token, env=env)
    listener = pick_listener(config, target)
    transport = TRANSPORT_BY_PROTOCOL.get(listener.protocol)
    if not listener.public_address or not listener.public_port or transport is None:
        raise LookupFailedError(
            f"listener {listener.name} has no public address/port yet "
            f"(public_address={listener.public_address!r}, public_port={listener.public_port})"
        )
    source = credential_source(config)
    log.info(
        "k8s://%s/%s:%s is %s://%s:%d",
        target.namespace,
        target.gateway,
        target.listener,
        transport,
        listener.public_address,
        listener.public_port,
    )
    return TurnTarget(listener.public_address, listener.public_port, transport), source
