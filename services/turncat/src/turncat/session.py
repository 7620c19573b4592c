"""One TURN allocation that carries one local client's datagrams or stream to one peer.

A session opens its own connection to the TURN server, allocates a UDP relay (RFC 8656 §7),
installs a permission for the peer (§9) and binds a channel to it (§12), then moves data as
ChannelData both ways. It refreshes the allocation before it expires and re-sends the permission
and the channel binding before theirs do, and on close it deletes the allocation with a Refresh
of lifetime 0 (§7.3). Only the configured peer's data reaches the local client: ChannelData on our
channel, or a Data indication whose XOR-PEER-ADDRESS is the peer; everything else is dropped.

A `tcp://` peer is reached through a TCP allocation instead (RFC 6062): Allocate with
REQUESTED-TRANSPORT TCP on a TCP or TLS connection, a permission for the peer, then `connect()`
sends Connect (§4.3), opens a second connection to the server, the data connection, and binds it
to the peer connection with ConnectionBind; after its success response the data connection
carries the peer's bytes as they are. An IPv6 peer gets an IPv6 relay: the Allocate carries
REQUESTED-ADDRESS-FAMILY IPv6 (RFC 8656 §7.1).

Requests, retransmissions and long-term credentials (RFC 8489 §9.2) are `turncat.transactions`';
the session turns the error answers that are about the peer into their own error class: a 403
to a permission or channel means the peer is not allowed, a 440/442 that the server does not
offer the relay asked for, a 446/447 that the TCP peer cannot be reached.

aioice's TURN client is not used, only its STUN codec (via `stunner_common.stun`): it has no
DTLS, no CreatePermission, cannot decode Data indications and starts a task per datagram sent.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import Callable
from typing import Any, Literal

from stunner_common.framing import channel_data, is_channel_data, parse_channel_data
from stunner_common.stun import (
    CHANNEL_MIN,
    FAMILY_IPV6,
    TRANSPORT_TCP,
    TRANSPORT_UDP,
    Class,
    Message,
    Method,
    address_family,
)
from turncat.carrier import CarrierOpener, ServerLink, TlsOptions, open_carrier
from turncat.errors import (
    PeerConnectFailedError,
    PeerForbiddenError,
    TurncatError,
    TurnError,
    UnreachableError,
    UnsupportedError,
)
from turncat.settings import TurncatSettings
from turncat.streams import DataStream
from turncat.transactions import Credentials as Credentials
from turncat.transactions import Exchange, Transactions
from turncat.uri import Transport
from turncat.wire import parse_stun

log = logging.getLogger(__name__)

CredentialSource = Callable[[], Credentials | None]
DataCallback = Callable[[bytes], None]
LostCallback = Callable[[Exception | None], None]

PeerTransport = Literal["udp", "tcp"]

DEFAULT_LIFETIME_S = 600


def _discard(frame: bytes) -> None:
    pass


class TurnSession:
    """A TURN allocation with a permission and a channel to one peer."""

    def __init__(
        self,
        *,
        transport: Transport,
        server: tuple[str, int],
        peer: tuple[str, int],
        credentials: CredentialSource,
        tls: TlsOptions,
        settings: TurncatSettings,
        on_data: DataCallback,
        on_lost: LostCallback | None = None,
        name: str = "session",
        opener: CarrierOpener = open_carrier,
        peer_transport: PeerTransport = "udp",
    ) -> None:
        self._link = ServerLink(transport, server, tls, opener)
        self._peer = (str(ipaddress.ip_address(peer[0])), peer[1])
        self._credentials = credentials
        self._settings = settings
        self._on_data = on_data
        self._on_lost = on_lost
        self.name = name
        self.peer_transport: PeerTransport = peer_transport
        self._tx = Transactions(server, settings)
        self._channel = CHANNEL_MIN
        self._pad = False
        self._send_frame: Callable[[bytes], None] = _discard
        self._refresher: asyncio.Task[None] | None = None
        self._allocated = False
        self._open = False
        self._closing = False
        self.relayed_address: tuple[str, int] | None = None
        self.mapped_address: tuple[str, int] | None = None
        self.lifetime_s = DEFAULT_LIFETIME_S
        self.dropped = 0
        """Frames that were not for us: other channels, other peers, malformed."""
        self._last_tx = 0.0  # loop time of the last datagram sent to the peer
        self._last_rx = 0.0  # loop time of the last datagram from the peer (or of the open)

    # -- lifecycle -------------------------------------------------------------------------

    async def open(self) -> None:
        """Allocate, permit the peer and bind a channel; raise a `TurncatError` on failure."""
        try:
            carrier = await self._link.open(self, self._settings.connect_timeout_s)
            self._tx.carrier = carrier
            self._pad = carrier.reliable
            self._send_frame = carrier.send
            self._tx.credentials = self._credentials()
            attrs: dict[str, Any] = {
                "REQUESTED-TRANSPORT": TRANSPORT_TCP
                if self.peer_transport == "tcp"
                else TRANSPORT_UDP
            }
            if address_family(self._peer[0]) == FAMILY_IPV6:
                attrs["REQUESTED-ADDRESS-FAMILY"] = FAMILY_IPV6
            if self._settings.allocation_lifetime_s:
                attrs["LIFETIME"] = self._settings.allocation_lifetime_s
            resp = await self._request(Method.ALLOCATE, attrs)
            self._allocated = True
            self.relayed_address = resp.attributes.get("XOR-RELAYED-ADDRESS")
            self.mapped_address = resp.attributes.get("XOR-MAPPED-ADDRESS")
            self.lifetime_s = int(resp.attributes.get("LIFETIME", DEFAULT_LIFETIME_S))
            await self._install_peer()
            if self._closing:
                # close() ran while we were waiting: undo what was made since.
                await self._teardown()
                raise UnreachableError(f"{self.name}: closed while opening")
        except BaseException:
            await self.close()
            raise
        self._open = True
        self._refresher = asyncio.create_task(self._refresh_loop(), name=f"{self.name}-refresh")
        self._refresher.add_done_callback(self._refresher_done)
        log.info(
            "%s: %s relay %s via %s %s:%d to peer %s:%d",
            self.name,
            self.peer_transport.upper(),
            self.relayed_address,
            self._link.transport,
            *self._link.server,
            *self._peer,
        )

    async def connect(self) -> DataStream:
        """RFC 6062 §4.3: have the server connect to the peer (Connect), open a data connection
        and bind it to that peer connection (ConnectionBind); return the data connection, which
        from then on carries the peer's bytes both ways. Raise a `TurncatError` on failure."""
        if self.peer_transport != "tcp" or not self._open:
            raise TurnError(f"{self.name}: connect() needs an open TCP allocation")
        resp = await self._request(
            Method.CONNECT, {"XOR-PEER-ADDRESS": self._peer}, about_peer=True
        )
        connection_id = resp.attributes.get("CONNECTION-ID")
        if connection_id is None:
            raise TurnError("Connect succeeded without a CONNECTION-ID")
        reader, writer = await self._link.data_connection(self._settings.connect_timeout_s)
        try:
            await self._request(
                Method.CONNECTION_BIND,
                {"CONNECTION-ID": connection_id},
                about_peer=True,
                exchange=lambda msg: self._tx.stream_exchange(reader, writer, msg),
            )
        except BaseException:
            writer.close()
            raise
        log.info(
            "%s: TCP connection %#x to peer %s:%d bound", self.name, connection_id, *self._peer
        )
        return reader, writer

    async def close(self) -> None:
        """Stop refreshing, delete the allocation (bounded in time) and close the connection."""
        if self._closing:
            return
        self._closing = True
        self._open = False
        if self._refresher is not None and self._refresher is not asyncio.current_task():
            self._refresher.cancel()
            await asyncio.gather(self._refresher, return_exceptions=True)
        await self._teardown()

    async def _teardown(self) -> None:
        carrier = self._tx.carrier
        if self._allocated and carrier is not None and not self._tx.lost:
            try:
                async with asyncio.timeout(self._settings.close_timeout_s):
                    await self._request(Method.REFRESH, {"LIFETIME": 0})
                log.debug("%s: allocation deleted", self.name)
            except (TurncatError, TimeoutError) as exc:
                log.debug("%s: deallocation failed: %s", self.name, exc)
        self._allocated = False
        if carrier is not None:
            carrier.close()
        self._tx.fail_pending(UnreachableError("session closed"))

    @property
    def is_open(self) -> bool:
        return self._open

    # -- data path -------------------------------------------------------------------------

    def send(self, payload: bytes) -> None:
        """Relay one datagram to the peer as ChannelData (dropped if the session is not open)."""
        if not self._open:
            return
        self._last_tx = asyncio.get_running_loop().time()
        self._send_frame(channel_data(self._channel, payload, stream=self._pad))

    def frame_received(self, frame: bytes) -> None:
        if is_channel_data(frame):
            parsed = parse_channel_data(frame)
            if self._open and parsed is not None and parsed[0] == self._channel:
                self._last_rx = asyncio.get_running_loop().time()
                self._on_data(parsed[1])
            else:
                self.dropped += 1
            return
        msg = parse_stun(frame)
        if msg is None:
            self.dropped += 1
            return
        if msg.message_class in (Class.RESPONSE, Class.ERROR):
            self._tx.answer_received(msg)
            return
        if msg.message_class == Class.INDICATION and msg.message_method == Method.DATA:
            # RFC 8656 §11.6: a Data indication from anyone but our peer is dropped.
            data = msg.attributes.get("DATA")
            if (
                self._open
                and data is not None
                and msg.attributes.get("XOR-PEER-ADDRESS") == (self._peer)
            ):
                self._last_rx = asyncio.get_running_loop().time()
                self._on_data(data)
                return
        self.dropped += 1

    def carrier_lost(self, exc: Exception | None) -> None:
        err = UnreachableError(
            f"connection to TURN server {self._link.server[0]}:{self._link.server[1]} lost"
            + (f": {exc}" if exc else "")
        )
        self._tx.fail_pending(err)
        if self._closing or self._tx.lost:
            return
        self._tx.lost = True
        was_open = self._open
        self._open = False
        if was_open and self._on_lost is not None:
            self._on_lost(exc)

    # -- transactions ----------------------------------------------------------------------

    async def _request(
        self,
        method: Method,
        attrs: dict[str, Any],
        *,
        about_peer: bool = False,
        exchange: Exchange | None = None,
    ) -> Message:
        """A transaction with long-term authentication; raise the matching error on failure."""

        def refused(method: Method, code: int, reason: str) -> TurncatError:
            return self._refusal(method, code, reason, about_peer=about_peer)

        return await self._tx.request(method, attrs, refused, exchange)

    def _refusal(self, method: Method, code: int, reason: str, *, about_peer: bool) -> TurncatError:
        """The error for an error answer: about the peer (RFC 8656 §9, §12), the relay asked for
        (§7.2, RFC 6062 §4.2) or a TCP peer connection (RFC 6062 §4.3), or a plain `TurnError`."""
        if code == 403 and about_peer:
            again = ": no route admits it any more (was its UDPRoute deleted or changed?)"
            return PeerForbiddenError(
                f"peer {self._peer[0]}:{self._peer[1]} is not allowed by the TURN server "
                f"({method.name}: 403 {reason}){again if self._open else ''}",
                code,
            )
        if code in (440, 442):
            wanted = (
                "an IPv6 relay"
                if code == 440
                else f"a {self.peer_transport.upper()} relay (RFC 6062)"
            )
            return UnsupportedError(
                f"the TURN server does not offer {wanted}: {method.name} failed with "
                f"{code} {reason}",
                code,
            )
        if code in (446, 447):
            why = (
                "already has a connection to it on this allocation"
                if code == 446
                else "could not connect to it"
            )
            return PeerConnectFailedError(
                f"TCP peer {self._peer[0]}:{self._peer[1]}: the TURN server {why} "
                f"({method.name}: {code} {reason})",
                code,
            )
        return TurnError(f"{method.name} failed: {code} {reason}", code)

    async def _install_peer(self) -> None:
        peer_attr = {"XOR-PEER-ADDRESS": self._peer}
        await self._request(Method.CREATE_PERMISSION, peer_attr, about_peer=True)
        if self.peer_transport == "tcp":
            return  # data goes over data connections, not channels (RFC 6062 §4.1)
        await self._request(
            Method.CHANNEL_BIND,
            {"CHANNEL-NUMBER": self._channel, **peer_attr},
            about_peer=True,
        )

    # -- refresh ---------------------------------------------------------------------------

    async def _refresh_loop(self) -> None:
        loop = asyncio.get_running_loop()
        s = self._settings
        alloc_every = s.allocation_refresh_s or max(self.lifetime_s / 2, 1.0)
        next_alloc = loop.time() + alloc_every
        next_peer = loop.time() + s.permission_refresh_s
        self._last_rx = loop.time()
        next_probe = loop.time() + s.silence_probe_s
        while True:
            await asyncio.sleep(max(0.0, min(next_alloc, next_peer, next_probe) - loop.time()))
            now = loop.time()
            if now >= next_probe:
                next_probe = now + s.silence_probe_s
                if self._last_tx > self._last_rx and now - self._last_rx >= s.silence_probe_s:
                    # Sending and hearing nothing back: ask the server now rather than at the
                    # next refresh, so a route deleted meanwhile (403) is reported within
                    # seconds, not minutes.
                    log.debug(
                        "%s: nothing from the peer for a while: checking the permission", self.name
                    )
                    await self._install_peer()
                    self._last_rx = now  # one probe per silence
            if now >= next_alloc:
                attrs: dict[str, Any] = {}
                if s.allocation_lifetime_s:
                    attrs["LIFETIME"] = s.allocation_lifetime_s
                resp = await self._request(Method.REFRESH, attrs)
                self.lifetime_s = int(resp.attributes.get("LIFETIME", self.lifetime_s))
                alloc_every = s.allocation_refresh_s or max(self.lifetime_s / 2, 1.0)
                next_alloc = now + alloc_every
                log.debug("%s: allocation refreshed (lifetime %d s)", self.name, self.lifetime_s)
            if now >= next_peer:
                await self._install_peer()
                next_peer = now + s.permission_refresh_s
                log.debug(
                    "%s: permission%s refreshed",
                    self.name,
                    "" if self.peer_transport == "tcp" else " and channel",
                )

    def _refresher_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or self._closing:
            return
        exc = task.exception()
        log.warning("%s: refresh failed, dropping the client: %s", self.name, exc)
        self._open = False
        if not self._tx.lost:
            self._tx.lost = True
            if self._on_lost is not None:
                self._on_lost(exc if isinstance(exc, Exception) else None)
