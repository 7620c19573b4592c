"""The sans-IO TURN core: bytes, addresses and time in; effects out. No I/O, no clocks."""
