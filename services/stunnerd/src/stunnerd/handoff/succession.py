"""Succession: how a running stunnerd hands over to the next one and what it does afterwards.

`serve_handoff` listens at `STUNNERD_HANDOFF_SOCKET` for a successor (the state, the TURN-UDP
sockets and the admin servers' listening sockets travel to it: `local.listen`);
`signal_or_handoff` waits for a signal or for a successor that serves. Then the old process
exits, or with `STUNNERD_HANDOFF_IDLE` it lets go of everything and waits, serving nothing,
until SIGTERM/SIGINT (`idle`), so that a pod's container does not end and is not restarted.
`successor_on_sigusr2`: SIGUSR2 starts the same command line again as the successor (nginx's
binary upgrade), for VMs and local runs; in Kubernetes the new pod is the successor instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from stunnerd.reconcile.dataplane import Dataplane
from stunnerd.settings import StunnerdSettings

if TYPE_CHECKING:
    from stunnerd.handoff.transport.channel import HandoffServer
    from stunnerd.handoff.transport.named import NamedSocket

log = logging.getLogger(__name__)

_successors: list[subprocess.Popen[bytes]] = []
"""Successors started on SIGUSR2 (kept so that they are not reported as leaked)."""


async def serve_handoff(
    settings: StunnerdSettings,
    dataplane: Dataplane,
    named: Callable[[], Sequence[NamedSocket]],
) -> HandoffServer | None:
    """Listen for a successor at `STUNNERD_HANDOFF_SOCKET`, `named` (the admin servers'
    listening sockets) handed over beside the state."""
    if not settings.handoff_socket:
        return None
    from stunnerd.handoff.local import listen

    return await listen(Path(settings.handoff_socket), dataplane, named)


async def signal_or_handoff(
    signals: asyncio.Queue[int], handoff: HandoffServer | None
) -> int | None:
    """The first signal, or None once a successor serves on what this process handed over."""
    if handoff is None:
        return await signals.get()
    waits = [
        asyncio.ensure_future(signals.get()),
        asyncio.ensure_future(handoff.handed_over.wait()),
    ]
    done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    if waits[0] in done:
        return int(waits[0].result())
    log.info("handoff: the new process serves")
    return None


async def idle(
    close: Callable[[], Awaitable[None]],
    handoff: HandoffServer | None,
    signals: asyncio.Queue[int],
) -> None:
    """`--handoff-idle`: after handing over, let go of everything and wait for a signal.

    In a pod the container does not end, so the kubelet does not restart it (a restarted
    stunnerd would take the sockets back from the new pod); its probes reach the new process
    through the handed-over health socket. The signal ends the process at once: it holds no
    allocation any more."""
    if handoff is not None:
        await handoff.close()
    await close()
    # A successor started from here now would take the sockets back from the new process.
    asyncio.get_running_loop().add_signal_handler(
        signal.SIGUSR2, log.warning, "SIGUSR2 ignored: this process handed over and idles"
    )
    log.info("handoff: idle until SIGTERM (the new process serves)")
    sig = await signals.get()
    log.info("%s received while idle: exiting", signal.Signals(sig).name)


@contextlib.contextmanager
def successor_on_sigusr2(settings: StunnerdSettings) -> Iterator[None]:
    """With a handoff socket, SIGUSR2 starts this very command line again (same interpreter,
    arguments and environment) as a successor, which takes over through the socket."""
    if not settings.handoff_socket:
        yield
        return
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR2, start_successor)
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGUSR2)


def start_successor() -> None:
    """Re-execute this process's command line; the new process finds this one at the socket."""
    argv = [sys.executable, *sys.orig_argv[1:]]
    log.info("SIGUSR2: starting a successor: %s", " ".join(argv))
    try:
        _successors.append(subprocess.Popen(argv))  # the environment is inherited
    except OSError as exc:
        log.error("SIGUSR2: cannot start a successor: %s", exc)
