"""The Redis config store: one writer API (the operator) and one reader API (the CDS).

Layout (SPEC §4, names in ``stunner_common.redis_keys``): the hash of canonical configs, the
change stream and the revision counter, plus ``stunner:revs`` (id -> revision of its last change,
kept after a delete) so that a reader can answer "what changed since revision N".
"""

from stunner_common.store.publisher import (
    DEFAULT_STREAM_MAXLEN,
    REVS_HASH,
    CanonicalConfig,
    ConfigPublisher,
    InvalidConfigIdError,
    PublishResult,
    StoreError,
    canonical_text,
    split_config_id,
)
from stunner_common.store.reader import (
    ConfigReader,
    EventBatch,
    Snapshot,
    StoreEvent,
    stream_id_ms,
)

__all__ = [
    "DEFAULT_STREAM_MAXLEN",
    "REVS_HASH",
    "CanonicalConfig",
    "ConfigPublisher",
    "ConfigReader",
    "EventBatch",
    "InvalidConfigIdError",
    "PublishResult",
    "Snapshot",
    "StoreError",
    "StoreEvent",
    "canonical_text",
    "split_config_id",
    "stream_id_ms",
]
