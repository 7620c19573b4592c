"""The Redis key layout shared by the operator (writer) and the CDS (reader).

One definition so that writer, reader and any other tool agree on the names: a hash of canonical
configs, a change stream appended in the same atomic step as each hash write, and the global
revision counter that numbers those changes.
"""

CONFIGS_HASH = "stunner:configs"
"""Hash: field ``ns/name`` -> canonical JSON of that Gateway's stunnerd config."""

EVENTS_STREAM = "stunner:events"
"""Stream: one entry per change with fields ``op`` (upsert|delete), ``id``, ``rev``, ``config``."""

REV_COUNTER = "stunner:rev"
"""String counter: the global revision, incremented once by every change."""

NODE_ADDRESSES_HASH = "stunner:nodes"
"""Hash: Node name -> the address its stunnerd pods relay from when a listener asks for relay
address discovery (the Node's ExternalIP). The operator writes it; the CDS reads it to fill in
the node-address placeholder for a client that names its node."""
