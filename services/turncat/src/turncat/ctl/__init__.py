"""stunnerctl: inspect a running STUNner through its config discovery service (CDS).

`config` prints the Gateways' running stunnerd configs, `status` each stunnerd's `/status`, and
`icetest` allocates through every Gateway listener and measures the round trip to an echo
backend. It ships with turncat because it reuses turncat's CDS lookup and TURN client.
"""
