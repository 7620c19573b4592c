"""The zero config: what the CDS sends when a gateway's config is deleted.

It doubles as stunnerd's bootstrap config in watch mode. Recognising it must survive a round trip
through validation and a different log level, so `is_zero_config` compares against a freshly
validated zero config with the candidate's name and loglevel.
"""

from __future__ import annotations

from stunner_common.config.model import DEFAULT_REALM, StunnerConfig

__all__ = ["ZERO_PASSWORD", "ZERO_USERNAME", "is_zero_config", "zero_config"]

ZERO_USERNAME = "dummy-username"
ZERO_PASSWORD = "dummy-password"


def zero_config(name: str) -> StunnerConfig:
    """The validated zero config for the id `name` (``namespace/gateway``)."""
    return StunnerConfig.model_validate(
        {
            "version": "v1",
            "admin": {"name": name},
            "auth": {
                "type": "static",
                "realm": DEFAULT_REALM,
                "credentials": {"username": ZERO_USERNAME, "password": ZERO_PASSWORD},
            },
        }
    )


def is_zero_config(cfg: StunnerConfig) -> bool:
    """True if `cfg` is the zero (deleted) config for its own name, whatever its loglevel."""
    if cfg.listeners or cfg.clusters:
        return False
    zero = zero_config(cfg.admin.name)
    zero = zero.model_copy(
        update={"admin": zero.admin.model_copy(update={"loglevel": cfg.admin.loglevel})}
    )
    return cfg == zero
