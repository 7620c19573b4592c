"""stunnerd's TURN server and offload manager in one process, with a hand on the engine's clock.

    python tests/support/offload_server.py CONFIG.json

Runs inside the server namespace. Prints `ready`, then answers one JSON line per stdin command:
`status` (the offload status and the kernel's entry counts), `advance S` (every listener's engine
runs its timers as if S seconds had passed: what a channel, permission or allocation expiry does,
without waiting minutes for it), `quit`. Lifetimes are minutes long, so this is how the tests see
that an expiry removes the kernel's entries at once.
"""

from __future__ import annotations

import asyncio
import json
import sys

from stunner_common.config import load_config_file
from stunnerd.net.server import TurnServer
from stunnerd.offload.manager import OffloadManager
from stunnerd.workers.local import LocalDataplane


async def main(path: str) -> None:
    config = load_config_file(path)
    offload = OffloadManager()
    server = TurnServer(offload=offload)
    dataplane = LocalDataplane(server)
    outcome = await dataplane.apply(config)
    if outcome.error:
        raise SystemExit(outcome.error)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    print("ready", flush=True)
    try:
        while line := (await reader.readline()).decode().strip():
            cmd, *args = line.split()
            if cmd == "quit":
                break
            if cmd == "advance":
                later = loop.time() + float(args[0])
                for listener in server.listeners.values():
                    listener.apply(listener.engine.tick(later))
            entries = offload.datapath.entry_count() if offload.datapath else (0, 0)
            print(json.dumps({"offload": offload.status(), "entries": entries}), flush=True)
    finally:
        await dataplane.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
