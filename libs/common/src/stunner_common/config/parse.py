"""Reading stunnerd configs from files, CDS frames and dicts, the way upstream stunnerd does.

The pipeline (reference: stunner-dataplane §1.8): YAML or JSON text → a mapping → v1alpha1
converted to v1 → ``$VAR``/``${VAR}`` expanded in every string value except under
``auth.credentials`` (so a ``$`` in a password survives) → validated models. Expansion follows
Go's ``os.Expand`` (undefined variables become empty), and ``STUNNER_PORT`` falls back to
``STUNNER_PUBLIC_PORT`` or 3478 when unset, in a copy of the environment: os.environ is never
changed. Expansion works on parsed values rather than on the raw text, so a placeholder can also
stand in an integer field (``port: $STUNNER_PORT``) and a value can never break the syntax.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from stunner_common.config.errors import ConfigError, ConfigParseError, ConfigValidationError
from stunner_common.config.model import API_VERSION, DEFAULT_PORT, StunnerConfig

__all__ = ["MAX_CONFIG_NODES", "expand_env_vars", "load_config_file", "parse_config"]

V1ALPHA1 = "v1alpha1"
MAX_CONFIG_NODES = 200_000
MAX_CONFIG_DEPTH = 64
_DIGITS = re.compile(r"^[0-9]+$")
_GO_INT = re.compile(r"^[+-]?[0-9]{1,19}$")
_SPECIAL = frozenset("*#$@!?-0123456789")


def _load_yaml(data: str) -> Any:
    """PyYAML is imported only for a config that is not JSON (a file origin's YAML)."""
    import yaml

    # The C loader is much faster; PyYAML has it only when built against libyaml.
    loader: type[yaml.SafeLoader] | type[yaml.CSafeLoader] = getattr(
        yaml, "CSafeLoader", yaml.SafeLoader
    )
    try:
        return yaml.load(data, Loader=loader)
    except yaml.YAMLError as exc:
        raise _YamlError(exc) from exc


class _YamlError(Exception):
    """PyYAML's error, raised without PyYAML imported where it is caught."""


def _is_alnum(char: str) -> bool:
    return char == "_" or ("0" <= char <= "9") or ("a" <= char <= "z") or ("A" <= char <= "Z")


def _shell_name(text: str) -> tuple[str, int]:
    """Go's ``getShellName``: the variable name after a ``$`` and how many bytes it used."""
    if text[0] == "{":
        if len(text) > 2 and text[1] in _SPECIAL and text[2] == "}":
            return text[1], 3
        end = text.find("}", 1)
        if end == 1:
            return "", 2  # "${}" is bad syntax: eaten
        if end < 0:
            return "", 1  # "${" without "}" is bad syntax: eaten
        return text[1:end], end + 1
    if text[0] in _SPECIAL:
        return text[0], 1
    width = 0
    while width < len(text) and _is_alnum(text[width]):
        width += 1
    return text[:width], width


def expand_env_vars(text: str, env: Mapping[str, str]) -> str:
    """Expand ``$VAR`` and ``${VAR}`` like Go's ``os.Expand``; unknown names become ""."""
    if "$" not in text:
        return text
    out: list[str] = []
    start = 0
    index = 0
    while index < len(text):
        if text[index] == "$" and index + 1 < len(text):
            out.append(text[start:index])
            name, width = _shell_name(text[index + 1 :])
            if name == "" and width > 0:
                pass  # bad syntax: the characters are dropped
            elif name == "":
                out.append("$")
            else:
                out.append(env.get(name, ""))
            index += width
            start = index + 1
        index += 1
    out.append(text[start:])
    return "".join(out)


def _with_port_default(env: Mapping[str, str]) -> dict[str, str]:
    """Upstream sets STUNNER_PORT when unset or not numeric; we do it in a copy."""
    result = dict(env)
    if not _DIGITS.match(result.get("STUNNER_PORT", "")):
        public = result.get("STUNNER_PUBLIC_PORT", "").strip()
        result["STUNNER_PORT"] = str(int(public)) if _GO_INT.match(public) else str(DEFAULT_PORT)
    return result


def _load_text(data: str | bytes) -> Any:
    if not isinstance(data, str | bytes | bytearray):
        raise ConfigParseError(f"cannot read a config from a {type(data).__name__}")
    if isinstance(data, bytes | bytearray):
        try:
            data = bytes(data).decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise ConfigParseError(f"config is not UTF-8 text: {exc.reason}") from None
    if not data.strip():
        raise ConfigParseError("empty config")
    if data.lstrip().startswith("{"):
        # JSON is (nearly) a subset of YAML and parses to the same values; reading it as JSON
        # first is several times faster for the configs the CDS streams.
        try:
            return json.loads(data)
        except (ValueError, RecursionError):
            pass
    try:
        return _load_yaml(data)
    except (_YamlError, RecursionError, ValueError, TypeError) as yaml_error:
        try:
            return json.loads(data)
        except (ValueError, RecursionError):
            problem = str(yaml_error).replace("\n", " ")
            raise ConfigParseError(f"config is neither YAML nor JSON: {problem}") from None


class _Walker:
    """Copies the parsed tree into plain dicts/lists, expanding env vars where allowed.

    Bounded in depth and node count: YAML aliases can make a small document describe a huge
    tree, and the copy must not be the way to exhaust memory.
    """

    def __init__(self, env: Mapping[str, str] | None) -> None:
        self.env = env
        self.nodes = 0

    def copy(self, node: Any, depth: int, expand: bool) -> Any:
        self.nodes += 1
        if self.nodes > MAX_CONFIG_NODES:
            raise ConfigParseError(f"config too large (more than {MAX_CONFIG_NODES} values)")
        if depth > MAX_CONFIG_DEPTH:
            raise ConfigParseError(f"config nested too deeply (more than {MAX_CONFIG_DEPTH})")
        if isinstance(node, str):
            return expand_env_vars(node, self.env) if expand and self.env is not None else node
        if isinstance(node, Mapping):
            return {key: self.copy(value, depth + 1, expand) for key, value in node.items()}
        if isinstance(node, list | tuple):
            return [self.copy(item, depth + 1, expand) for item in node]
        return node


def _walk_root(raw: Mapping[Any, Any], env: Mapping[str, str] | None) -> dict[Any, Any]:
    """Copy the top level; nothing under auth.credentials (any key case) is expanded."""
    walker = _Walker(env)
    out: dict[Any, Any] = {}
    for key, value in raw.items():
        if isinstance(key, str) and key.casefold() == "auth" and isinstance(value, Mapping):
            auth: dict[Any, Any] = {}
            for auth_key, auth_value in value.items():
                secret = isinstance(auth_key, str) and auth_key.casefold() == "credentials"
                auth[auth_key] = walker.copy(auth_value, 2, not secret)
            walker.nodes += 1
            out[key] = auth
        else:
            out[key] = walker.copy(value, 1, True)
    return out


def _version_of(raw: Mapping[Any, Any]) -> Any:
    """The version as the model will see it: any key case, the last one wins, null is unset."""
    version: Any = ""
    for key, value in raw.items():
        if isinstance(key, str) and key.casefold() == "version":
            version = "" if value is None else value
    return version


def parse_config(
    data: str | bytes | Mapping[str, Any],
    *,
    env: Mapping[str, str] | None = None,
    expand_env: bool = True,
) -> StunnerConfig:
    """Parse and validate a stunnerd config (v1 or v1alpha1) from YAML/JSON text or a mapping.

    `env` defaults to ``os.environ`` and is only read. Pass ``expand_env=False`` to keep
    ``$VAR`` placeholders as they are: the operator and the CDS handle configs that are
    expanded later, on the dataplane host. Raises `ConfigError` for every kind of bad input.
    """
    raw = data if isinstance(data, Mapping) else _load_text(data)
    if not isinstance(raw, Mapping):
        raise ConfigParseError(f"config must be a mapping, not {type(raw).__name__}")
    version = _version_of(raw)
    if version not in (API_VERSION, V1ALPHA1):
        shown = version if isinstance(version, str) else repr(version)[:80]
        raise ConfigValidationError("version", version, f'unsupported API version: "{shown}"')
    values = _with_port_default(os.environ if env is None else env) if expand_env else None
    tree = _walk_root(raw, values)
    # v1alpha1 has the same admin, listener and cluster shapes; its auth types (plaintext,
    # longterm) are the legacy aliases that the v1 model maps anyway.
    tree = {k: v for k, v in tree.items() if not (isinstance(k, str) and k.casefold() == "version")}
    tree["version"] = API_VERSION
    try:
        return StunnerConfig.model_validate(tree)
    except ConfigError:
        raise
    except (RecursionError, TypeError, ValueError) as exc:  # pragma: no cover - defensive
        raise ConfigValidationError("", None, f"invalid config: {exc}") from None


def load_config_file(
    path: str | os.PathLike[str],
    *,
    env: Mapping[str, str] | None = None,
    expand_env: bool = True,
) -> StunnerConfig:
    """Read and parse a config file; unreadable files raise `ConfigParseError`."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigParseError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    return parse_config(data, env=env, expand_env=expand_env)
