"""Settings of the auth service, built once in ``__main__`` and passed down.

Environment: ``AUTH_*`` (``AUTH_HOST``, ``AUTH_PORT``, ``AUTH_TOKEN``, ...), the CDS address as
every tool reads it (``CDS_SERVER_ADDR``, upstream's name, shared with turncat and stunnerctl; the
deprecated ``STUNNER_CDS_ADDR`` and ``AUTH_CDS_URL`` with a warning in `warnings`), and the CDS
bearer token from ``CDS_TOKEN_FILE`` (re-read when it changes) or ``CDS_TOKEN``.
"""

from __future__ import annotations

import os
from typing import Any

from pydantic import AliasChoices, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from stunner_auth.ice import DEFAULT_TTL_S
from stunner_common.cli import cds_address
from stunner_common.io.cds import cds_base_url
from stunner_common.io.http import HttpServiceSettings, listen_port

DEFAULT_PORT = 8088


class _CdsAddressSource(PydanticBaseSettingsSource):
    """The CDS address from the environment as `stunner_common.cli.cds_address` chooses it,
    with its warnings; the ``cds_url`` given to the constructor (the flag) wins."""

    def __init__(self, settings_cls: type[BaseSettings], init_kwargs: dict[str, Any]) -> None:
        super().__init__(settings_cls)
        self._flag = init_kwargs.get("cds_url")

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ answers for every field at once

    def __call__(self) -> dict[str, Any]:
        address, warnings = cds_address(os.environ, self._flag)
        return {"cds_url": address, "warnings": tuple(warnings)}


class AuthSettings(HttpServiceSettings):
    model_config = SettingsConfigDict(env_prefix="AUTH_")

    port: int = listen_port(DEFAULT_PORT)
    cds_url: str = Field(description="The CDS: host:port or http(s)://..., comma-separated.")
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
    max_connections_per_client: int = Field(
        256,
        ge=0,
        description="Open connections per client IP (0: unlimited); one more is answered 429 and"
        " closed before anything is read. Behind a proxy every client shares its address.",
    )
    warnings: tuple[str, ...] = Field(
        (), description="How the settings were given that deserves a warning (deprecated names)."
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        init_kwargs: dict[str, Any] = getattr(init_settings, "init_kwargs", {})
        cds = _CdsAddressSource(settings_cls, init_kwargs)
        return init_settings, cds, env_settings, dotenv_settings, file_secret_settings

    @field_validator("cds_url")
    @classmethod
    def _cds_url(cls, value: str) -> str:
        for address in value.split(","):
            cds_base_url(address)  # CdsAddressError is a ValueError: one line, no traceback
        return value
