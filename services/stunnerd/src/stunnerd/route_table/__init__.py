"""A listener's channel routes, kept in every table that relays on its own.

`table` is the interface the three copies share (the asyncio edge's dicts, the C relay's hash
tables, the kernel offload's BPF maps), `python` the asyncio edge's copy, and `channels` the
driver that turns the engine's `ChannelRouteAdded` / `ChannelRouteRemoved` effects into calls
on each table. Nothing here imports `net`, `fastpath` or `offload`: they import this.
"""
