"""The CDS wire contract shared by the config discovery service and its clients.

Upstream v1 (full configs as Go marshals them, the zero config on delete) and our
``stunner.cds.v2`` delta envelopes, and the client's delta state and errors: all pure. The one
client of both (``CdsClient``) and its token source are ``stunner_common.io.cds``.
"""

from stunner_common.cds.delta import (
    CdsAddressError,
    CdsClientError,
    CdsHttpError,
    CdsProtocolError,
    CdsUnreachableError,
    ConfigChange,
    ConfigFrame,
    DeltaState,
)
from stunner_common.cds.wire import (
    CDS_V2_SUBPROTOCOL,
    EPOCH_HEADER,
    EPOCH_PARAM,
    INITIAL_FRAMES_HEADER,
    RESYNC_HEADER,
    REV_HEADER,
    DeleteEnvelope,
    Envelope,
    EnvelopeError,
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
    "EPOCH_HEADER",
    "EPOCH_PARAM",
    "INITIAL_FRAMES_HEADER",
    "RESYNC_HEADER",
    "REV_HEADER",
    "CdsAddressError",
    "CdsClientError",
    "CdsHttpError",
    "CdsProtocolError",
    "CdsUnreachableError",
    "ConfigChange",
    "ConfigFrame",
    "DeleteEnvelope",
    "DeltaState",
    "Envelope",
    "EnvelopeError",
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
    "zero_config_dict",
]
