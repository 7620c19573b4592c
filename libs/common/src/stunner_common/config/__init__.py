"""The stunnerd config v1: models, parsing, endpoints and the derived (zero) configs.

Import from here: `StunnerConfig` and its parts, `parse_config` / `load_config_file`,
`parse_endpoint`, `zero_config` / `is_zero_config`, `load_tls_pair`, and the `ConfigError` tree.
"""

from stunner_common.config import model
from stunner_common.config.derived import is_zero_config, zero_config
from stunner_common.config.endpoint import MAX_PORT, Endpoint, parse_endpoint
from stunner_common.config.errors import ConfigError, ConfigParseError, ConfigValidationError
from stunner_common.config.model import *  # noqa: F403  (its __all__: the models and defaults)
from stunner_common.config.parse import expand_env_vars, load_config_file, parse_config
from stunner_common.config.tls import TlsPair, load_tls_pair, self_signed_pair

__all__ = [
    *model.__all__,
    "MAX_PORT",
    "ConfigError",
    "ConfigParseError",
    "ConfigValidationError",
    "Endpoint",
    "TlsPair",
    "expand_env_vars",
    "is_zero_config",
    "load_config_file",
    "load_tls_pair",
    "parse_config",
    "parse_endpoint",
    "self_signed_pair",
    "zero_config",
]
