"""Settings of the auth service, built once in ``__main__`` and passed down.

Environment: ``AUTH_*`` (``AUTH_HOST``, ``AUTH_PORT``, ``AUTH_TOKEN``, ...), the CDS address from
``CDS_SERVER_ADDR`` (upstream's name, shared with turncat and stunnerctl; ``AUTH_CDS_URL`` is a
deprecated alias that ``__main__`` warns about), and the CDS bearer token from
``CDS_TOKEN_FILE`` (re-read when it changes) or ``CDS_TOKEN``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from stunner_auth.ice import DEFAULT_TTL_S

DEFAULT_PORT = 8088


class AuthSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="AUTH_", frozen=True, populate_by_name=True)

    host: str = "0.0.0.0"
    port: int = Field(DEFAULT_PORT, ge=0, le=65535)
    cds_url: str = Field(
        "http://127.0.0.1:13478",
        validation_alias=AliasChoices("cds_url", "CDS_SERVER_ADDR", "AUTH_CDS_URL"),
    )
    cds_token: SecretStr | None = Field(
        None, validation_alias=AliasChoices("cds_token", "CDS_TOKEN", "AUTH_CDS_TOKEN")
    )
    cds_token_file: str | None = Field(
        None, validation_alias=AliasChoices("cds_token_file", "CDS_TOKEN_FILE")
    )
    token: SecretStr | None = Field(
        None, description="Bearer token clients must send; unauthenticated when unset."
    )
    cors_origins: str = Field(
        "", description="Comma-separated origins allowed to call the API from a browser ('*': any)."
    )
    default_ttl_s: int = Field(DEFAULT_TTL_S, gt=0)
    max_ttl_s: int = Field(7 * 86400, gt=0)
    cds_timeout_s: float = Field(5.0, gt=0)
    shutdown_timeout_s: float = Field(5.0, gt=0)
    log_level: str = "INFO"
    log_format: Literal["text", "json"] = "text"
