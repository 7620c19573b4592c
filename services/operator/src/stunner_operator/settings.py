"""Settings of the operator, built once in ``__main__`` and passed down.

Environment: ``OPERATOR_*`` (``OPERATOR_MANIFESTS``, ``OPERATOR_CDS_ADDRESS``, ...) and
``REDIS_URL``; command-line flags override both. Every timeout carries its unit in its name.
The Kubernetes client finds its cluster in ``environ`` (``KUBECONFIG``, ``HOME``,
``KUBERNETES_SERVICE_HOST``/``PORT``, a credential plugin's environment), read with the rest.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field, model_validator
from pydantic_settings import SettingsConfigDict

from stunner_common.process_settings import ProcessSettings
from stunner_operator.render.options import DEFAULT_CDS_ADDRESS
from stunner_operator.render.status import CONTROLLER_NAME


class OperatorSettings(ProcessSettings):
    model_config = SettingsConfigDict(env_prefix="OPERATOR_", populate_by_name=True)

    manifests: Path | None = None
    kubeconfig: Path | None = None
    redis_url: str = Field(
        "redis://127.0.0.1:6379/0",
        validation_alias=AliasChoices("redis_url", "REDIS_URL", "OPERATOR_REDIS_URL"),
    )
    controller_name: str = Field(
        CONTROLLER_NAME,
        validation_alias=AliasChoices(
            "controller_name",
            "OPERATOR_CONTROLLER_NAME",
            "STUNNER_GATEWAY_OPERATOR_CONTROLLER_NAME",
        ),
    )
    label_filter: str | None = Field(
        None,
        validation_alias=AliasChoices(
            "label_filter", "OPERATOR_LABEL_FILTER", "STUNNER_GATEWAY_OPERATOR_LABEL_FILTER"
        ),
    )
    """Comma-separated Gateway label keys not copied onto the dataplane (upstream's variable);
    unset: upstream's default list, empty: none."""
    quota_redis_secret: str = ""
    """A Secret the stunnerd pods read ``STUNNERD_QUOTA_REDIS_URL`` from (key
    ``quota_redis_secret_key``): ``userQuota`` then holds across replicas."""
    quota_redis_secret_key: str = "url"
    cds_address: str = DEFAULT_CDS_ADDRESS
    cds_token_secret: str = ""
    """A Secret the stunnerd pods read ``CDS_TOKEN`` from (key ``cds_token_secret_key``), in
    their own namespace; empty: they get no token."""
    cds_token_secret_key: str = "token"
    endpoint_discovery: bool = True
    enforce_reference_grants: bool = False
    """Cross-namespace backendRefs and certificateRefs need a Gateway API ReferenceGrant
    (``--enforce-reference-grants``); off, as upstream STUNner, they resolve without one."""
    redis_timeout_s: float = Field(5.0, gt=0)
    kube_timeout_s: float = Field(10.0, gt=0)
    throttle_s: float = Field(0.05, ge=0)
    """How long the render loop gathers events into one render (``OPERATOR_THROTTLE_S``).
    Upstream's operator waits 250 ms (``--throttle-timeout``); a shorter wait gives a change to
    the watchers sooner, a longer one sends fewer configs under endpoint churn
    (docs/upstream-differences.md)."""
    writers: int = Field(8, ge=1, le=64)
    """Writes to the API server in flight at once (``OPERATOR_WRITERS``), each to another
    object (`stunner_operator.controller.loops.ControllerOptions.writers`)."""
    leader_elect: bool = True
    lease_namespace: str = Field(
        "default",
        validation_alias=AliasChoices(
            "lease_namespace", "OPERATOR_LEASE_NAMESPACE", "POD_NAMESPACE"
        ),
    )
    lease_name: str = "stunner-gateway-operator"
    lease_duration_s: int = Field(15, ge=2)
    lease_renew_s: float = Field(5.0, gt=0)
    publish_retry_s: float = Field(1.0, gt=0)
    redis_startup_timeout_s: float = Field(30.0, ge=0)
    """How long a starting operator waits for Redis before it exits (2) saying so."""
    health_address: str = ":8081"
    """HOST:PORT of /healthz and /readyz; empty turns them off."""
    metrics_address: str = ":8080"
    """HOST:PORT of /metrics; empty turns it off."""
    watch_debounce_ms: int = Field(50, ge=1)
    watch_timeout_s: int = Field(300, ge=1)
    """How long one watch request of the Kubernetes API lasts before it is renewed from the last
    resource version seen (a resource version the server has compacted away means a new list)."""
    log_level: str = "INFO"
    log_format: str = Field("text", pattern="^(text|json)$")

    @model_validator(mode="after")
    def _renew_within_lease(self) -> OperatorSettings:
        if self.lease_renew_s >= self.lease_duration_s:
            raise ValueError("lease_renew_s must be shorter than lease_duration_s")
        return self
