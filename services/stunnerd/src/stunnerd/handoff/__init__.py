"""Hot handoff: a new stunnerd takes over a running one's sockets and allocations.

Two layers. `transport` is the plain part, which knows no server, worker or setting: the
versioned state document (`transport.state`), the Unix socket that carries it with the sockets
(`transport.channel`), a live allocation as the document's record (`transport.records`) and the
journal a worker keeps of those records with its supervisor (`transport.journal`). The workers
and the admin servers use it as well.

Above it, the orchestration, which drives the dataplane (`stunnerd.workers`, `stunnerd.net`),
the reconciler's `Dataplane` and the admin servers:

- `succession`: what the process does around a handoff (listening for a successor, waiting for
  it, `--handoff-idle`, SIGUSR2 starting one);
- `local`: the old side of a single-process stunnerd (`LocalHandoffSource`), the listening
  (`listen`), and the new side of either kind (`successor_at`, `Successor`);
- `pool`: the old and new sides with worker processes (`PoolHandoffSource`, `seed`);
- `admin`: admin servers on the listening sockets a predecessor handed over, and the sockets
  this process hands on (`stunnerd.admin.servers` serves with them).

The edge's part, adopting handed-over allocations into a listener, is `stunnerd.net.adopt`: the
edge imports no handoff module and sees the handed state only through the interfaces of
`stunnerd.net.ports` (`HandedState`, `AllocationJournal`), which the transport's records fit.
"""
