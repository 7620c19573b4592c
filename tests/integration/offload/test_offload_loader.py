"""The offload loader's edges that need no namespace: route queries, clear load errors, and the
map layouts against the object's BTF."""

from __future__ import annotations

import ctypes
import os
import socket
from pathlib import Path

import pytest

from stunnerd.offload import routes
from stunnerd.offload.datapath import default_object_path
from stunnerd.offload.libbpf import BpfObject, OffloadError, btf_struct
from stunnerd.offload.maps import BTF_STRUCTS, client_key, destination, fwd, peer_key

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


@pytest.mark.parametrize(("struct", "btf_name"), BTF_STRUCTS, ids=[n for _s, n in BTF_STRUCTS])
def test_map_layouts_match_the_object_s_btf(struct: type[ctypes.Structure], btf_name: str) -> None:
    """Every field of the ctypes structures sits where the compiled object puts it, with the
    object's size, in the object's order: not just the same total size."""
    path = default_object_path()
    if not Path(path).exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must build the offload object: {path} is missing")
        pytest.skip(f"{path} is not built (make setup with clang and libbpf-dev)")
    size, members = btf_struct(path, btf_name)
    fields = [
        (name, getattr(struct, name).offset, getattr(struct, name).size)
        for name, *_ in struct._fields_
    ]
    assert (ctypes.sizeof(struct), fields) == (size, members)


def test_addresses_with_zero_bytes_are_written_whole() -> None:
    value = fwd(("10.0.0.1", 3478), ("192.168.0.5", 5000), ifindex=2, local=False)
    assert destination(value) == ("192.168.0.5", 5000)
    assert bytes(client_key(("10.0.0.5", 40000), 3478, 0x4000).client_ip) == bytes([10, 0, 0, 5])
    assert bytes(peer_key(("10.0.0.9", 5000), 49170).peer_ip) == bytes([10, 0, 0, 9])


def test_the_default_object_sits_next_to_the_package() -> None:
    assert default_object_path().endswith("stunnerd/offload/stunner_offload.bpf.o")
