"""The CDS wire contract shared by the config discovery service and its clients.

Upstream v1 (full configs as Go marshals them, the zero config on delete) and our
``stunner.cds.v2`` delta envelopes, plus a small client for the latter.
"""

from stunner_common.cds.client import (
    CdsClientError,
    CdsProtocolError,
    ConfigChange,
    DeltaState,
    watch_configs,
    watch_url,
)
from stunner_common.cds.wire import (
    CDS_V2_SUBPROTOCOL,
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
    "CDS_V2_SUBPROTOCOL",
    "RESYNC_HEADER",
    "REV_HEADER",
    "CdsClientError",
    "CdsProtocolError",
    "ConfigChange",
    "ConfigListBody",
    "DeleteEnvelope",
    "DeltaState",
    "Envelope",
    "ErrorBody",
    "PatchEnvelope",
    "SnapshotEnvelope",
    "encode_config_list",
    "encode_delete",
    "encode_error",
    "encode_patch",
    "encode_snapshot",
    "encode_v1_config",
    "encode_v1_delete",
    "go_ordered",
    "parse_envelope",
    "watch_configs",
    "watch_url",
    "zero_config_dict",
]
