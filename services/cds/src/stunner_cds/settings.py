"""Settings of the config discovery service, built once in ``__main__`` and passed down.

Environment: ``CDS_*`` (``CDS_HOST``, ``CDS_PORT``, ``CDS_TOKEN``, ...) and ``REDIS_URL``. Every
timeout carries its unit in its name.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from stunner_common.io.http import HttpServiceSettings, listen_port
from stunner_common.redis_acl import redact_url

DEFAULT_PORT = 13478


class CdsSettings(HttpServiceSettings):
    model_config = SettingsConfigDict(env_prefix="CDS_")

    port: int = listen_port(DEFAULT_PORT)
    redis_url: str = Field(
        "redis://127.0.0.1:6379/0",
        validation_alias=AliasChoices("redis_url", "REDIS_URL", "CDS_REDIS_URL"),
    )
    token: SecretStr | None = Field(None, description="Bearer token required on the API.")
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    ping_interval_s: float = Field(5.0, gt=0)
    ping_timeout_s: float = Field(10.0, gt=0)
    queue_size: int = Field(256, ge=1)
    v1_min_interval_s: float = Field(
        0.25,
        ge=0,
        description="Least time between two frames of one config to a v1 watcher (0: none);"
        " a change that comes sooner is held and the newest one sent when the time is up.",
    )
    send_timeout_s: float = Field(10.0, gt=0)
    redis_block_ms: int = Field(1000, ge=1)
    redis_timeout_s: float = Field(5.0, gt=0)
    reconnect_min_s: float = Field(0.05, gt=0)
    reconnect_max_s: float = Field(2.0, gt=0)
    ws_max_message_bytes: int = Field(
        64 * 1024, ge=1024, description="A WebSocket message from a client (closed with 1009)."
    )
    max_http_connections_per_client: int = Field(
        64,
        ge=0,
        description="Open HTTP connections per client IP that are not (yet) WebSockets"
        " (0: unlimited); one more is answered 429 and closed before anything is read.",
    )
    max_watchers_per_client: int = Field(
        256,
        ge=0,
        description="Open watches per client IP (0: unlimited); one more is refused with 429.",
    )
    ws_max_messages_per_s: float = Field(
        10.0,
        ge=0,
        description="WebSocket messages a watcher may send per second, on average (0: unlimited);"
        " the protocol needs none, so a client over it is closed with 1008.",
    )
    ws_message_burst: int = Field(
        50, ge=1, description="WebSocket messages a watcher may send at once."
    )

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: str) -> str:
        """Refuse a URL redis-py cannot use here, not as a traceback at startup."""
        from redis.connection import parse_url

        try:
            parse_url(value)  # type: ignore[no-untyped-call]
        except ValueError as exc:
            raise ValueError(f"invalid Redis URL {redact_url(value)!r}: {exc}") from None
        return value

    @model_validator(mode="after")
    def _tls_pair(self) -> CdsSettings:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file must be given together")
        if self.reconnect_min_s > self.reconnect_max_s:
            raise ValueError("reconnect_min_s must not exceed reconnect_max_s")
        return self
