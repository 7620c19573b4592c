"""The CDS wire formats: upstream v1 frames and bodies, and the ``stunner.cds.v2`` envelopes.

The v1 formats are a contract with unmodified upstream stunnerd and stunnerctl, so this module
reproduces Go's ``encoding/json`` output for a ``StunnerConfig``: struct fields in declaration
order, ``omitempty`` fields dropped when empty, and the exact bytes of the "zero config" that
signals a delete. The v2 envelopes are our own delta protocol; their encoders (the CDS writes)
and their parser and dataclasses (every client reads) live here so that both share one
definition. The client half is plain Python, so that a stunnerd following a CDS does not carry
pydantic; the OpenAPI models of the CDS's bodies are the CDS's own (``stunner_cds.api.schemas``).

Every v2 revision travels with the store's *epoch* (the id of the store's history, see
``stunner_common.io.store``): in each envelope, in the handshake answer (``x-stunner-epoch``) and
in a resume request (``?since=REV&epoch=E``), because revision N of one history says nothing about
N of another.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

CDS_V2_SUBPROTOCOL = "stunner.cds.v2"
"""WebSocket subprotocol a client offers to get delta envelopes instead of full v1 frames."""

REV_HEADER = "x-stunner-rev"
"""Handshake response header: the server's revision when the watch started."""

RESYNC_HEADER = "x-stunner-resync"
"""Handshake response header: ``delta`` when ``since`` was honoured, else ``full``."""

INITIAL_FRAMES_HEADER = "x-stunner-initial-frames"
"""Handshake response header: how many frames the snapshot or resync of this watch has. Once a
client has applied them all it holds the server's state at ``x-stunner-rev`` exactly."""

EPOCH_HEADER = "x-stunner-epoch"
"""Handshake response header: the epoch of the revisions this watch will carry."""

EPOCH_PARAM = "epoch"
"""Query parameter of a v2 resume: the epoch ``since`` counts in (absent: a full snapshot)."""

ZERO_CONFIG_REALM = "stunner.l7mp.io"
ZERO_CONFIG_USERNAME = "dummy-username"
ZERO_CONFIG_PASSWORD = "dummy-password"

# Go struct field order (pkg/apis/v1) and which fields are sent even when empty.
_TOP_ORDER = ("version", "admin", "auth", "listeners", "clusters")
_ADMIN_ORDER = (
    "name",
    "loglevel",
    "metrics_endpoint",
    "healthcheck_endpoint",
    "user_quota",
    "offload_engine",
    "offload_interfaces",
    "license_config",
)
_AUTH_ORDER = ("type", "realm", "credentials")
_LISTENER_ORDER = (
    "name",
    "protocol",
    "public_address",
    "public_port",
    "address",
    "port",
    "cert",
    "key",
    "routes",
)
_CLUSTER_ORDER = ("name", "type", "protocol", "endpoints")
_LICENSE_ORDER = ("key", "hmac")

_DUMPS = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def _empty(value: Any) -> bool:
    return value is None or value == "" or value == 0 or value == [] or value == {}


def _ordered(
    obj: Mapping[str, Any],
    order: tuple[str, ...],
    *,
    always: frozenset[str] = frozenset(),
    keep_empty_string: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in (*order, *sorted(k for k in obj if k not in order)):
        if key not in obj:
            continue
        value = obj[key]
        keep_empty = key in always or (key in keep_empty_string and value == "")
        if keep_empty or not _empty(value):
            out[key] = value
    return out


def go_ordered(config: Mapping[str, Any]) -> dict[str, Any]:
    """Return ``config`` as Go would marshal it: field order and ``omitempty`` applied."""
    top: dict[str, Any] = dict(config)
    admin = top.get("admin")
    if isinstance(admin, Mapping):
        admin_out = dict(admin)
        lic = admin_out.get("license_config")
        if isinstance(lic, Mapping):
            admin_out["license_config"] = _ordered(lic, _LICENSE_ORDER)
        # healthcheck_endpoint is a *string in Go: absent when nil, sent (even "") otherwise.
        top["admin"] = _ordered(
            admin_out, _ADMIN_ORDER, keep_empty_string=frozenset({"healthcheck_endpoint"})
        )
    else:
        top["admin"] = {}
    auth = top.get("auth")
    auth_map: dict[str, Any] = dict(auth) if isinstance(auth, Mapping) else {}
    creds = auth_map.get("credentials")
    if isinstance(creds, Mapping):
        auth_map["credentials"] = dict(sorted(creds.items()))  # Go sorts map keys
    # credentials has no omitempty: a nil map is sent as null.
    top["auth"] = _ordered(
        {"credentials": None, **auth_map}, _AUTH_ORDER, always=frozenset({"credentials"})
    )
    listeners = top.get("listeners")
    if isinstance(listeners, list):
        top["listeners"] = [
            _ordered(item, _LISTENER_ORDER) if isinstance(item, Mapping) else item
            for item in listeners
        ]
    clusters = top.get("clusters")
    if isinstance(clusters, list):
        top["clusters"] = [
            _ordered(item, _CLUSTER_ORDER, always=frozenset({"name"}))
            if isinstance(item, Mapping)
            else item
            for item in clusters
        ]
    return _ordered(top, _TOP_ORDER, always=frozenset({"admin", "auth"}))


def encode_v1_config(config: Mapping[str, Any]) -> str:
    """One upstream v1 frame: Go's ``json.Marshal`` of the config, no trailing newline."""
    return _DUMPS(go_ordered(config))


def zero_config_dict(config_id: str) -> dict[str, Any]:
    """Upstream's unvalidated ``ZeroConfig(id)``: the config a CDS sends when ``id`` is deleted."""
    return {
        "version": "v1",
        "admin": {"name": config_id},
        "auth": {
            "type": "static",
            "realm": ZERO_CONFIG_REALM,
            "credentials": {
                "password": ZERO_CONFIG_PASSWORD,
                "username": ZERO_CONFIG_USERNAME,
            },
        },
    }


def encode_v1_delete(config_id: str) -> str:
    """The exact v1 delete frame for ``config_id`` (the zero config, byte-for-byte upstream)."""
    return encode_v1_config(zero_config_dict(config_id))


def encode_config_list(configs: list[Mapping[str, Any]]) -> str:
    """A ``ConfigList`` body as upstream's ``json.Encoder`` writes it (trailing newline)."""
    items = ",".join(encode_v1_config(c) for c in configs)
    return '{"version":"v1","items":[' + items + "]}\n"


def encode_error(code: int, message: str) -> str:
    return _DUMPS({"code": code, "message": message}) + "\n"


def _envelope(kind: str, config_id: str, rev: int, epoch: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": kind, "id": config_id, "rev": rev}
    if epoch is not None:
        out["epoch"] = epoch
    return out


def encode_snapshot(
    config_id: str, rev: int, config: Mapping[str, Any], epoch: str | None = None
) -> str:
    return _DUMPS({**_envelope("snapshot", config_id, rev, epoch), "config": config})


def encode_patch(
    config_id: str, rev: int, patch: list[dict[str, Any]], epoch: str | None = None
) -> str:
    return _DUMPS({**_envelope("patch", config_id, rev, epoch), "patch": patch})


def encode_delete(config_id: str, rev: int, epoch: str | None = None) -> str:
    return _DUMPS(_envelope("delete", config_id, rev, epoch))


# --- the v2 envelopes as a client reads them ----------------------------------------------------


class EnvelopeError(ValueError):
    """A v2 frame that is not a well-formed envelope (the message names what is wrong)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SnapshotEnvelope:
    """The full config of ``id`` at revision ``rev``; replaces whatever the client held."""

    type: Literal["snapshot"] = "snapshot"
    id: str
    rev: int
    config: dict[str, Any]
    epoch: str | None = None
    """The store epoch ``rev`` counts in."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PatchEnvelope:
    """An RFC 6902 JSON Patch from the client's previous config of ``id`` to revision ``rev``."""

    type: Literal["patch"] = "patch"
    id: str
    rev: int
    patch: list[dict[str, Any]]
    epoch: str | None = None
    """The store epoch ``rev`` counts in."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteEnvelope:
    """``id`` was deleted at revision ``rev``."""

    type: Literal["delete"] = "delete"
    id: str
    rev: int
    epoch: str | None = None
    """The store epoch ``rev`` counts in."""


Envelope: TypeAlias = SnapshotEnvelope | PatchEnvelope | DeleteEnvelope

# A \uD800-\uDFFF escape: only a text that has one can decode to a lone surrogate.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


_JSON_KINDS = {dict: "object", list: "array", str: "string", int: "integer", float: "number"}


def _kind(value: object) -> str:
    """The JSON name of what ``json.loads`` made ``value`` from."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    return _JSON_KINDS.get(type(value), type(value).__name__)


def _shown(text: str) -> str:
    return repr(text if len(text) <= 60 else text[:60] + "...")


def _load(text: str | bytes) -> object:
    try:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        obj = json.loads(text)
        if _SURROGATE_ESCAPE.search(text):
            _DUMPS(obj).encode("utf-8")
    except UnicodeError as exc:
        raise EnvelopeError(f"invalid UTF-8 or a lone surrogate: {exc}") from None
    except RecursionError:
        raise EnvelopeError("not JSON: nested too deeply") from None
    except ValueError as exc:
        raise EnvelopeError(f"not JSON: {exc}") from None
    return obj


def parse_envelope(text: str | bytes) -> Envelope:
    """Parse one v2 frame; raises ``EnvelopeError`` on anything malformed.

    The frame must be JSON in UTF-8 (no escape that decodes to a lone surrogate) holding an
    object whose ``type`` is ``snapshot``, ``patch`` or ``delete``, with a string ``id``, an
    integer ``rev``, an object ``config`` (snapshot) or an array of objects ``patch`` (patch), and
    ``epoch`` absent, null or a string; other keys are ignored. ``rev`` must be a JSON integer:
    every writer of this protocol is ``_envelope`` above, so a string, a float or a boolean there
    is a broken peer, not a spelling to accept.
    """
    obj = _load(text)
    if not isinstance(obj, dict):
        raise EnvelopeError(f"not a JSON object but {_kind(obj)}")
    kind = obj.get("type")
    if kind not in ("snapshot", "patch", "delete"):
        shown = _shown(kind) if isinstance(kind, str) else _kind(kind)
        raise EnvelopeError(f"type {shown} is not snapshot, patch or delete")
    config_id = obj.get("id")
    if not isinstance(config_id, str):
        raise EnvelopeError(f"{kind}: id must be a string, not {_kind(config_id)}")
    what = f"{kind} for {_shown(config_id)}"
    rev = obj.get("rev")
    if not isinstance(rev, int) or isinstance(rev, bool):
        raise EnvelopeError(f"{what}: rev must be an integer, not {_kind(rev)}")
    epoch = obj.get("epoch")
    if epoch is not None and not isinstance(epoch, str):
        raise EnvelopeError(f"{what}: epoch must be a string, not {_kind(epoch)}")
    if kind == "snapshot":
        config = obj.get("config")
        if not isinstance(config, dict):
            raise EnvelopeError(f"{what}: config must be an object, not {_kind(config)}")
        return SnapshotEnvelope(id=config_id, rev=rev, config=config, epoch=epoch)
    if kind == "patch":
        patch = obj.get("patch")
        if not isinstance(patch, list):
            raise EnvelopeError(f"{what}: patch must be an array, not {_kind(patch)}")
        for i, op in enumerate(patch):
            if not isinstance(op, dict):
                raise EnvelopeError(f"{what}: patch[{i}] must be an object, not {_kind(op)}")
        return PatchEnvelope(id=config_id, rev=rev, patch=patch, epoch=epoch)
    return DeleteEnvelope(id=config_id, rev=rev, epoch=epoch)
