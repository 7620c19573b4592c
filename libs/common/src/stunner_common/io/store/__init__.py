"""The Redis config store: one writer API (the operator) and one reader API (the CDS).

Layout (names in ``stunner_common.contracts.redis_keys``; docs/architecture.md draws it): the
hash of canonical configs, the change stream and the revision counter, plus ``stunner:revs`` (id ->
revision of its last change, kept after a delete) so that a reader can answer "what changed since
revision N", and ``stunner:meta`` (field ``epoch``: which history of the store those revisions
count in).
"""

from stunner_common.io.store.publisher import (
    DEFAULT_STREAM_MAXLEN,
    CanonicalConfig,
    ConfigPublisher,
    InvalidConfigIdError,
    PublishResult,
    StoreError,
    canonical_text,
    new_epoch,
    split_config_id,
)
from stunner_common.io.store.reader import (
    ConfigReader,
    EventBatch,
    Position,
    Snapshot,
    StoreEvent,
    stream_id_ms,
)

__all__ = [
    "DEFAULT_STREAM_MAXLEN",
    "CanonicalConfig",
    "ConfigPublisher",
    "ConfigReader",
    "EventBatch",
    "InvalidConfigIdError",
    "Position",
    "PublishResult",
    "Snapshot",
    "StoreError",
    "StoreEvent",
    "canonical_text",
    "new_epoch",
    "split_config_id",
    "stream_id_ms",
]
