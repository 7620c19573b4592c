"""Kernel fast path: TURN-UDP ChannelData relayed by an eBPF program (TC or XDP).

`libbpf` binds the C library through ctypes, `routes` asks the kernel where datagrams go,
`datapath` loads and attaches the program and writes its maps. The program's source is
`services/stunnerd/bpf/stunner_offload.bpf.c`; `make setup` builds the object next to this file.
"""
