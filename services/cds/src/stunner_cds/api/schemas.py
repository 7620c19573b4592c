"""The bodies the CDS's OpenAPI document names: upstream's ``Error`` and ``ConfigList``.

The routes write these bodies as bytes (``stunner_common.cds.wire``, Go's encoding); the models
only describe them to ``/openapi.json``. They live with the service, not with the wire, so that a
client that parses the wire (stunnerd) does not import pydantic.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


class ErrorBody(BaseModel):
    """Every error the CDS answers with (upstream's ``Error`` schema)."""

    code: int = Field(description="The HTTP status code, repeated.")
    message: str = Field(description="What went wrong, naming the offending value.")


class ConfigListBody(BaseModel):
    """Upstream's ``ConfigList``: every matching config (``items`` is never null)."""

    version: Literal["v1"] = "v1"
    items: list[dict[str, Any]]
