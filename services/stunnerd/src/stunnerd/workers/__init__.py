"""Where the TURN server runs: in this process, or in N worker processes sharing each port.

`LocalDataplane` drives one `TurnServer` through the reconciler. `WorkerPool` runs one
`LocalDataplane` per worker process (`--udp-thread-num N`), with every listener socket bound with
SO_REUSEPORT so the kernel spreads clients over the workers by 5-tuple; configs fan out to all
workers and their counters are summed. Both present the same `Dataplane` interface to the command.
"""
