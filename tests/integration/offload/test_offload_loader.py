"""The offload loader's edges that need no namespace: route queries and clear load errors."""

from __future__ import annotations

import ctypes
import socket
from pathlib import Path

import pytest

from stunnerd.offload import routes
from stunnerd.offload.datapath import ClientKey, Fwd, PeerKey, default_object_path
from stunnerd.offload.libbpf import BpfObject, OffloadError

pytestmark = pytest.mark.integration


def test_a_loopback_destination_is_local_through_lo() -> None:
    route = routes.lookup("127.0.0.1")
    assert route.local
    assert route.src == "127.0.0.1"
    assert socket.if_indextoname(route.ifindex) == "lo"


def test_ipv6_is_not_offloaded() -> None:
    with pytest.raises(routes.RouteError, match="only IPv4"):
        routes.lookup("::1")


def test_a_missing_object_names_the_file_and_the_fix(tmp_path: Path) -> None:
    missing = tmp_path / "nothing.bpf.o"
    with pytest.raises(OffloadError, match=r"nothing\.bpf\.o is missing .*make setup"):
        BpfObject(str(missing))


def test_a_broken_object_is_refused_with_libbpf_s_reason(tmp_path: Path) -> None:
    junk = tmp_path / "junk.bpf.o"
    junk.write_bytes(b"\x7fELF not really")
    with pytest.raises(OffloadError, match="cannot open"):
        BpfObject(str(junk))


def test_map_layouts_match_the_c_structures() -> None:
    """The sizes the BPF object declares (12, 8 and 56 bytes) are what ctypes builds."""
    assert ctypes.sizeof(ClientKey) == 12
    assert ctypes.sizeof(PeerKey) == 8
    assert ctypes.sizeof(Fwd) == 56


def test_the_default_object_sits_next_to_the_package() -> None:
    assert default_object_path().endswith("stunnerd/offload/stunner_offload.bpf.o")
