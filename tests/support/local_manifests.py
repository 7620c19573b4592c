"""The local examples (examples/local) copied for a test, with the Gateways' listener ports
moved to free ones: the defaults (3478/UDP, 3479/TCP) may be held by a running `make run`."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LISTENER_PORT = re.compile(r"\bport: (3478|3479)\b")


def copy_local_examples(dest: Path, udp_port: int, tcp_port: int) -> Path:
    """examples/local copied to `dest`, the UDP Gateway listening on `udp_port` and the TCP one
    on `tcp_port` (rewritten in one pass: a new port is never read as an old one)."""
    shutil.copytree(ROOT / "examples" / "local", dest)
    gateways = dest / "gateways.yaml"
    ports = {"3478": udp_port, "3479": tcp_port}
    text, count = LISTENER_PORT.subn(lambda m: f"port: {ports[m.group(1)]}", gateways.read_text())
    assert count == 2, f"{gateways}: expected the listener ports 3478 and 3479, found {count}"
    gateways.write_text(text)
    return dest
