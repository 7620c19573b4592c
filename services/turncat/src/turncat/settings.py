"""Timeouts and limits for turncat and stunnerctl, read once from `TURNCAT_*` environment variables.

None of these are flags because users rarely need them; tests and unusual networks do (a lossy
link wants a longer request timeout, a test wants refreshes every fraction of a second). Every
duration carries its unit in the name.
"""

from __future__ import annotations

from pydantic import AliasChoices, Field, ValidationError
from pydantic_settings import SettingsConfigDict

from stunner_common.process_settings import ProcessSettings, validation_message
from turncat.errors import BadInputError

OPERATOR_ADDR_ENV = "STUNNER_OPERATOR_ADDR"


class TurncatSettings(ProcessSettings):
    """What turncat and stunnerctl read from the environment, once, in their `main`.

    ``environ`` is what the CDS lookup reads (``CDS_SERVER_ADDR``, ``CDS_TOKEN[_FILE]``,
    ``CDS_SERVER_NAMESPACE``, ``KUBECONFIG``, ``HOME`` and ``PATH`` for a kubeconfig's
    credential plugin).
    """

    model_config = SettingsConfigDict(env_prefix="TURNCAT_")

    connect_timeout_s: float = Field(default=5.0, gt=0)
    """Opening the transport to the TURN server, including the TLS/DTLS handshake."""
    request_timeout_s: float = Field(default=5.0, gt=0)
    """One TURN transaction, retransmissions included (RFC 8489 §6.2.1 allows far longer)."""
    initial_rto_s: float = Field(default=0.25, gt=0)
    """First retransmission timeout on UDP and DTLS; doubles on each retry."""
    allocation_lifetime_s: int = Field(default=600, ge=0)
    """LIFETIME asked for in Allocate and Refresh (0: let the server pick)."""
    allocation_refresh_s: float | None = Field(default=None, gt=0)
    """Refresh the allocation this often; by default at half the granted lifetime."""
    permission_refresh_s: float = Field(default=240.0, gt=0)
    """Re-send CreatePermission and ChannelBind this often (permissions last 300 s)."""
    silence_probe_s: float = Field(default=5.0, gt=0)
    """A client that sent datagrams and heard nothing back for this long gets its permission
    and channel re-sent at once: a route deleted meanwhile (403) is reported then."""
    client_idle_timeout_s: float = Field(default=300.0, gt=0)
    """Deallocate a UDP local client that has sent nothing for this long."""
    stdin_linger_s: float = Field(default=1.0, ge=0)
    """After stdin ends, keep printing replies until the peer is silent for this long."""
    close_timeout_s: float = Field(default=2.0, gt=0)
    """Bound on the deallocation (Refresh with lifetime 0) when a session ends."""
    cds_timeout_s: float = Field(default=5.0, gt=0)
    """Bound on the CDS request that resolves a k8s:// URI."""
    pending_datagrams: int = Field(default=256, ge=1)
    """Datagrams held per local client while its allocation is being set up."""
    operator_addr: str | None = Field(
        default=None, validation_alias=AliasChoices(OPERATOR_ADDR_ENV)
    )
    """stunnerctl status: the operator whose `/gateways` report says which Gateway is degraded
    (`STUNNER_OPERATOR_ADDR`; "" asks none)."""


def load_settings() -> TurncatSettings:
    """The settings from the environment; an invalid value is bad input, said in one line."""
    try:
        return TurncatSettings()
    except ValidationError as exc:
        raise BadInputError(f"invalid TURNCAT_* setting: {validation_message(exc)}") from None
