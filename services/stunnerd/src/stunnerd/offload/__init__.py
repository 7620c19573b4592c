"""Kernel fast path: TURN-UDP ChannelData relayed by an eBPF program (TC or XDP).

`libbpf` binds the C library through ctypes, `maps` declares the maps' keys and values,
`routes` asks the kernel where datagrams go, `datapath` loads and attaches the program and writes
its maps, `manager` decides which channels they hold, and `table` is a listener's view of it as a
`RouteTable`. The program's source is `services/stunnerd/bpf/stunner_offload.bpf.c`; `make setup`
builds the object next to this file.
"""
