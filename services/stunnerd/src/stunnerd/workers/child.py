"""A worker process: one `LocalDataplane` whose sockets share their ports with the other workers.

Started by `WorkerPool` as `python -m stunnerd.worker_main` (its edge, which reads the command
line and the environment); it obeys requests on stdin and answers on stdout (`protocol`, the
records of `stunner_common.contracts.worker_messages`). Logs go to stderr, which the supervisor
shares, in the supervisor's format (`--log-format`, text or JSON) with the worker's tag. The
worker exits when stdin closes, so it never outlives its supervisor.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from stunner_common.config import ConfigError, parse_config
from stunner_common.contracts.worker_messages import (
    ApplyReply,
    ApplyRequest,
    CloseRequest,
    DoneReply,
    DrainRequest,
    ErrorReply,
    FreezeRequest,
    PingRequest,
    Reply,
    Request,
    StatsReply,
    StatsRequest,
    WorkerMessageError,
    decode_request,
)
from stunner_common.loglevel import apply_log_spec
from stunnerd.handoff.transport.journal import JournalWriter
from stunnerd.handoff.transport.records import RecordJournal
from stunnerd.handoff.transport.state import HandoffFormatError, decode_state
from stunnerd.net.guard import ClientLimits
from stunnerd.net.server import ServerOptions, TurnServer
from stunnerd.net.tuning import ServerTuning
from stunnerd.offload.manager import OffloadManager
from stunnerd.quota import ClusterQuota
from stunnerd.workers.local import LocalDataplane
from stunnerd.workers.protocol import MAX_LINE_BYTES, encode
from stunnerd.workers.sockets import FdChannel, InheritedSockets

if TYPE_CHECKING:
    from stunnerd.offload.datapath import Datapath

log = logging.getLogger(__name__)


async def handle(
    dataplane: LocalDataplane,
    message: Request,
    log_override: str | None = None,
    inherited: InheritedSockets | None = None,
) -> Reply:
    match message:
        case ApplyRequest():
            return await apply(dataplane, message, log_override, inherited)
        case StatsRequest():
            offload = dataplane.offload_status()  # folds the kernel's counts in first
            return StatsReply(
                dataplane.stats().to_dict(), offload, dataplane.quota_status(), message.id
            )
        case DrainRequest():
            await dataplane.stop_accepting()
        case FreezeRequest():  # a handoff is being prepared: requests are left to the next process
            for listener in dataplane.server.listeners.values():
                listener.frozen = message.frozen
        case PingRequest():
            pass
        case CloseRequest():
            return ErrorReply("close is not answered", message.id)
    return DoneReply(message.id)


async def apply(
    dataplane: LocalDataplane,
    message: ApplyRequest,
    log_override: str | None,
    inherited: InheritedSockets | None,
) -> ApplyReply:
    if inherited is not None:
        # The supervisor sent this config's listener sockets before the request.
        inherited.drain()
        inherited.retain(message.sockets)
        adopt_journaled(dataplane, message.adopt, inherited.take_relays())
    try:
        config = parse_config(message.config, expand_env=False)
    except ConfigError as exc:
        return ApplyReply(error=f"invalid config: {exc}", id=message.id)
    outcome = await dataplane.apply(config)
    if outcome.applied:
        apply_log_spec(log_override or config.admin.loglevel)
    return ApplyReply(
        applied=outcome.applied,
        ignored=outcome.ignored,
        restarted=tuple(outcome.restarted),
        error=outcome.error,
        duration_s=outcome.duration_s,
        started=tuple(outcome.started),
        listeners=tuple(state.to_json() for state in outcome.listeners),
        id=message.id,
    )


def adopt_journaled(
    dataplane: LocalDataplane, document: str | None, relays: list[socket.socket]
) -> None:
    """A dead predecessor's journaled allocations and their relay sockets: each listener
    carries its own on as it starts (`net.adopt`). A document that cannot be read is logged and
    its sockets closed: those clients get 437 and allocate again."""
    if document is None:
        for sock in relays:
            sock.close()
        return
    try:
        state = decode_state(document.encode())
        dataplane.server.adopt(state, relays)
    except (HandoffFormatError, ValueError) as exc:
        log.error("the journaled allocations cannot be adopted: %s", exc)
        for sock in relays:
            sock.close()
        return
    log.info("adopting %d journaled allocation(s)", state.allocation_count())


@dataclass(frozen=True, slots=True)
class ChildOptions:
    """What a worker process serves with: its command line, as the supervisor writes it
    (`stunnerd.workers.worker.Worker`) and `stunnerd.worker_main` reads it."""

    index: int = 0
    """The worker's place in the pool (its log tag)."""
    bind_host: str = "0.0.0.0"
    """Where listener and relay sockets bind (the supervisor's `--bind`)."""
    relay_addresses: tuple[str, ...] = ()
    """Relay addresses beyond the listeners' own (`STUNNERD_RELAY_ADDRESSES`)."""
    node_address: str = ""
    """This node's address, for listeners with the node-address placeholder."""
    tuning: ServerTuning = field(default_factory=ServerTuning)
    limits: ClientLimits = field(default_factory=ClientLimits)
    log_override: str | None = None
    """A log spec over the config's `admin.loglevel` (the supervisor's)."""
    fd_channel: int | None = None
    """The socket channel to the supervisor (listener and relay sockets, the nonce key and the
    offload maps in; the allocation journal out); None: the worker binds its own sockets, makes
    its own nonce key and journals nothing."""
    journal: bool = True
    """Journal the TURN-UDP allocations to the supervisor over `fd_channel` (the supervisor's
    `worker_journal`); False: they die with this worker."""

    def server_options(self) -> ServerOptions:
        """Its `TurnServer`'s: every listener socket shares its port with the other workers
        (SO_REUSEPORT), and no TCP relays (see the stunnerd README: TCP relays and worker
        processes)."""
        return ServerOptions(
            bind_host=self.bind_host,
            relay_addresses=self.relay_addresses,
            node_address=self.node_address,
            reuse_port=True,
            tcp_relays=False,
            tuning=self.tuning,
            limits=self.limits,
        )


def shared_maps(inherited: InheritedSockets) -> Callable[[], Datapath]:
    """The worker's offload datapath: duplicates of the maps the supervisor sent last."""

    def factory() -> Datapath:
        from stunnerd.offload.datapath import SharedMaps
        from stunnerd.offload.libbpf import OffloadError

        fds = inherited.offload_fds
        if "chan" not in fds or "peer" not in fds:
            raise OffloadError(inherited.offload_reason or "no offload maps from the supervisor")
        info = inherited.offload_info
        return SharedMaps(
            os.dup(fds["chan"]), os.dup(fds["peer"]), dict(info["modes"]), int(info["owner"])
        )

    return factory


async def serve(options: ChildOptions, quota: ClusterQuota | None = None) -> int:
    """Serve requests from stdin until it closes or asks to close; `quota` is the cluster-wide
    quota the worker's edge built from its command line and environment (None: none)."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=MAX_LINE_BYTES)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    w_transport, _ = await loop.connect_write_pipe(asyncio.Protocol, sys.stdout)
    inherited = None
    writer: JournalWriter | None = None
    if options.fd_channel is None:
        server = TurnServer(options.server_options(), quota=quota)
    else:
        inherited = InheritedSockets(FdChannel.from_fd(options.fd_channel))
        if options.journal:
            writer = JournalWriter(inherited.channel, loop.call_soon)
        server = TurnServer(
            options.server_options(),
            nonce_key=inherited.wait_nonce_key(),
            socket_source=inherited.take,
            quota=quota,
            offload=OffloadManager(shared_maps(inherited)),
            journal=RecordJournal(writer) if writer is not None else None,
        )
    dataplane = LocalDataplane(server)
    log.info("worker %d ready (pid %d)", options.index, os.getpid())
    try:
        while True:
            line = await reader.readline()
            if not line:
                break
            try:
                message = decode_request(line)
            except WorkerMessageError as exc:
                log.error("%s", exc)
                w_transport.write(encode(ErrorReply(str(exc), exc.ident or 0)))
                continue
            if isinstance(message, CloseRequest):
                break
            reply = await handle(dataplane, message, options.log_override, inherited)
            if writer is not None:
                writer.flush()  # the supervisor reads the journal up to here with the reply
            w_transport.write(encode(reply))
    finally:
        await dataplane.close()
        if writer is not None:
            writer.flush()
        if inherited is not None:
            inherited.close()
        w_transport.close()
    return 0
