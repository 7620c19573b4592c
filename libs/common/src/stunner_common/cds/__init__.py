"""The CDS wire contract shared by the config discovery service and its clients.

Upstream v1 (full configs as Go marshals them, the zero config on delete) and our
``stunner.cds.v2`` delta envelopes, plus the one client of both (``CdsClient``).
"""

from stunner_common.cds import client
from stunner_common.cds.client import *  # noqa: F403  (its __all__: the client and its errors)
from stunner_common.cds.token import TokenSource, token_source
from stunner_common.cds.wire import (
    CDS_V2_SUBPROTOCOL,
    EPOCH_HEADER,
    EPOCH_PARAM,
    INITIAL_FRAMES_HEADER,
    RESYNC_HEADER,
    REV_HEADER,
    ConfigListBody,
    DeleteEnvelope,
    Envelope,
    ErrorBody,
    PatchEnvelope,
    SnapshotEnvelope,
    encode_config_list,
    encode_delete,
    encode_error,
    encode_patch,
    encode_snapshot,
    encode_v1_config,
    encode_v1_delete,
    go_ordered,
    parse_envelope,
    zero_config_dict,
)

__all__ = [
    *client.__all__,
    "CDS_V2_SUBPROTOCOL",
    "EPOCH_HEADER",
    "EPOCH_PARAM",
    "INITIAL_FRAMES_HEADER",
    "RESYNC_HEADER",
    "REV_HEADER",
    "ConfigListBody",
    "DeleteEnvelope",
    "Envelope",
    "ErrorBody",
    "PatchEnvelope",
    "SnapshotEnvelope",
    "TokenSource",
    "encode_config_list",
    "encode_delete",
    "encode_error",
    "encode_patch",
    "encode_snapshot",
    "encode_v1_config",
    "encode_v1_delete",
    "go_ordered",
    "parse_envelope",
    "token_source",
    "zero_config_dict",
]
