"""The HTTP and WebSocket API of the CDS: upstream v1 paths plus the v2 delta protocol."""
