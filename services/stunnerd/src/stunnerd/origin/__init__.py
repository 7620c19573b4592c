"""Where configs come from: a watched file, a one-shot CDS GET, or a CDS WebSocket watch.

Every origin yields validated `StunnerConfig` values as `ConfigEvent`s; none of them knows about
the TURN server. A bad update is logged and skipped, so the running config is never replaced by
garbage, and a lost connection simply yields nothing until it is back.
"""
