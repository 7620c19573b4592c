"""Drive stunnerd's offload datapath by hand, inside a namespace: one JSON command per stdin line,
one JSON answer per stdout line. Tests use it to exercise the BPF program through its maps alone,
with no TURN server in the way.

Commands: {"op": "open"}, {"op": "attach", "engine": "TC", "interfaces": [...]},
{"op": "put" | "delete" | "counters", "client": [ip, port], "listener": [ip, port],
"channel": n, "peer": [ip, port], "relay": [ip, port]}, {"op": "count"}, {"op": "detach"},
{"op": "close"}.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from stunnerd.offload.datapath import ChannelEntries, Datapath, channel_entries


def _entries(cmd: dict[str, Any]) -> ChannelEntries:
    return channel_entries(
        tuple(cmd["client"]),
        tuple(cmd["listener"]),
        int(cmd["channel"]),
        tuple(cmd["peer"]),
        tuple(cmd["relay"]),
    )


def main() -> None:
    dp: Datapath | None = None
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        out: dict[str, Any] = {"ok": True}
        try:
            if op == "open":
                dp = Datapath()
            elif op == "attach":
                assert dp is not None
                out["modes"] = dp.attach(cmd["engine"], cmd.get("interfaces", []))
            elif op == "put":
                assert dp is not None
                dp.put(_entries(cmd))
            elif op == "delete":
                assert dp is not None
                to_peer, to_client = dp.delete(_entries(cmd))
                out["deleted"] = [to_peer is not None, to_client is not None]
            elif op == "counters":
                assert dp is not None
                e = _entries(cmd)
                a, b = dp.client_counters(e.client_key), dp.peer_counters(e.peer_key)
                out["to_peer"] = [a.packets, a.bytes] if a else None
                out["to_client"] = [b.packets, b.bytes] if b else None
            elif op == "count":
                assert dp is not None
                out["entries"] = list(dp.entry_count())
            elif op == "detach":
                assert dp is not None
                dp.detach()
            elif op == "close":
                if dp is not None:
                    dp.close()
                print(json.dumps(out), flush=True)
                return
        except Exception as exc:  # report, keep serving
            out = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
