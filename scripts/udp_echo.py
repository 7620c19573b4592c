"""A UDP echo server: the media backend of the local demo stack (like upstream's udp-echo example).

python scripts/udp_echo.py [--host 127.0.0.1] [--port 9001]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from typing import cast

log = logging.getLogger("udp-echo")


class EchoProtocol(asyncio.DatagramProtocol):
    transport: asyncio.DatagramTransport

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.transport.sendto(data, addr)


async def serve(host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_datagram_endpoint(EchoProtocol, local_addr=(host, port))
    log.info("udp echo listening on %s:%d", host, port)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        transport.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9001)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    asyncio.run(serve(args.host, args.port))


if __name__ == "__main__":
    main()
