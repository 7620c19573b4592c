"""The agreements between stunner's processes, each defined once, typed, with its codec beside it.

One module per contract: the listener address (operator → CDS → stunnerd), the listener port
(operator's config, Service and pod), the Redis key layout (operator, CDS, stunnerd's quota,
the ACL), the listener socket key (stunnerd's supervisor and its workers) and the
supervisor ↔ worker messages. Every module is pure (no I/O, no logging), so that every service
can import it; ``lint-imports`` holds them to that (docs/architecture.md lists the contracts).
"""
