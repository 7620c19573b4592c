"""One allocator for every port the local stack (`make run`) hands out.

The stack has two kinds of ports:

* fixed ones, that users and tools know by number: the CDS (13478, stunnerctl's and turncat's
  default), the auth service (8088), Redis and the UDP echo backend. `reserve` claims them; one
  already in use is an error that names the port, what wanted it and how to fix it.
* movable ones, that only the stack's own table needs to show: the operator's health and metrics
  ports and, per stunnerd, its health and metrics ports. `allocate` gives the first port from a
  start that no other part of the stack holds and no other program uses.

Gateway listener ports come from the user's YAML: `claim_check` says whether one can be had
before its stunnerd starts (and which part of the stack holds it if not); once bound, `allocate`
skips it like any port in use.

Every port is owned by a name ("auth service", "stunnerd stunner/udp-gateway health"), so a
collision message names both sides, and `release` frees all of one owner's ports at once (a
Gateway that left the manifests).
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass, field

TCP = socket.SOCK_STREAM
UDP = socket.SOCK_DGRAM
HOST = "127.0.0.1"
SEARCH_SPAN = 1000
"""How far past its start `allocate` looks for a free port."""


def proto_name(kind: int) -> str:
    return "udp" if kind == UDP else "tcp"


def port_in_use(port: int, kind: int = TCP, host: str = HOST) -> bool:
    """True when binding `host:port` fails now (another program holds it)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, kind) as sock:
        if kind == TCP:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


class PortError(Exception):
    """A port the stack needs cannot be had; the message says which, why and what to do."""


@dataclass
class PortAllocator:
    """Ports by (port, kind) and their owners; `in_use` probes the system (tests replace it)."""

    host: str = HOST
    in_use: Callable[[int, int], bool] = field(default=lambda port, kind: port_in_use(port, kind))
    owners: dict[tuple[int, int], str] = field(default_factory=dict)

    def owner(self, port: int, kind: int = TCP) -> str | None:
        return self.owners.get((port, kind))

    def reserve(self, what: str, port: int, kind: int = TCP, fix: str = "") -> int:
        """Claim a fixed port for `what`; PortError when the stack or another program has it."""
        holder = self.owner(port, kind)
        if holder is not None and holder != what:
            raise PortError(
                f"port {port}/{proto_name(kind)} is wanted by both {holder} and {what}"
                + (f": {fix}" if fix else "")
            )
        if holder is None and self.in_use(port, kind):
            raise PortError(
                f"port {port}/{proto_name(kind)} ({what}) is already in use"
                + (f": {fix}" if fix else "")
            )
        self.owners[(port, kind)] = what
        return port

    def allocate(self, what: str, start: int, kind: int = TCP) -> int:
        """The first port from `start` that no part of the stack holds and no program uses."""
        for port in range(start, min(65536, start + SEARCH_SPAN)):
            if (port, kind) in self.owners or self.in_use(port, kind):
                continue
            self.owners[(port, kind)] = what
            return port
        raise PortError(
            f"no free {proto_name(kind)} port for {what} in {start}-{start + SEARCH_SPAN - 1}"
        )

    def claim_check(self, what: str, port: int, kind: int) -> str | None:
        """Can a port the user chose (a listener's) be had? None, or why not (nothing is held)."""
        holder = self.owner(port, kind)
        if holder is not None:
            return f"port {port}/{proto_name(kind)} ({what}) is the {holder}'s port"
        if self.in_use(port, kind):
            return f"port {port}/{proto_name(kind)} ({what}) is in use by another program"
        return None

    def release(self, prefix: str) -> list[int]:
        """Free every port whose owner is `prefix` or starts with `prefix + " "`."""
        mine = (prefix, prefix + " ")
        gone = [k for k, who in self.owners.items() if who == prefix or who.startswith(mine[1])]
        for key in gone:
            del self.owners[key]
        return sorted(port for port, _ in gone)
