"""The asyncio edge of the TURN server: sockets, listeners and relays around the sans-IO engine."""
