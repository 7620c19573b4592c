"""The few libbpf calls the offload needs, through ctypes: open and load an object, find its
programs and maps, read and write map entries, attach to TC (clsact ingress) and XDP.

libbpf ≥ 1.0 (Debian's `libbpf1`) is a plain C library with a stable ABI, so ctypes needs no
compiler at run time and no extra wheel. Every failure becomes an `OffloadError` whose message
names the call and the errno, plus the last lines libbpf logged (the verifier's complaint when
a load fails), so a warning in stunnerd's log says what went wrong.
"""

from __future__ import annotations

import ctypes
import errno as errno_mod
import os
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

BPF_TC_INGRESS = 1
BPF_TC_F_REPLACE = 1
XDP_FLAGS_UPDATE_IF_NOEXIST = 1 << 0
XDP_FLAGS_SKB_MODE = 1 << 1
XDP_FLAGS_DRV_MODE = 1 << 2
XDP_FLAGS_REPLACE = 1 << 4
BPF_ANY = 0
BTF_KIND_STRUCT = 4
_PROG_INFO_NAME_OFFSET = 64  # struct bpf_prog_info: name[16] after 64 bytes of fixed fields
_PROG_INFO_BYTES = 256
_LOG_LINES = 8


class OffloadError(Exception):
    """Loading, attaching or driving the kernel program failed; the message is the reason."""


_INT, _U32 = ctypes.c_int, ctypes.c_uint32


class _Opts(ctypes.Structure):
    """A libbpf options structure: its own size first, so libbpf knows which fields we know."""

    def __init__(self, **fields: Any) -> None:
        super().__init__(sz=ctypes.sizeof(self), **fields)


class _TcHook(_Opts):
    _fields_ = [("sz", ctypes.c_size_t), ("ifindex", _INT), ("attach_point", _INT)]
    _fields_ += [("parent", _U32), ("_pad", _U32)]


class _TcOpts(_Opts):
    _fields_ = [("sz", ctypes.c_size_t), ("prog_fd", _INT), ("flags", _U32), ("prog_id", _U32)]
    _fields_ += [("handle", _U32), ("priority", _U32), ("_pad", _U32)]


class _TestRunOpts(_Opts):
    """`struct bpf_test_run_opts`."""

    _fields_ = [("sz", ctypes.c_size_t), ("data_in", ctypes.c_void_p)]
    _fields_ += [("data_out", ctypes.c_void_p), ("data_size_in", _U32)]
    _fields_ += [("data_size_out", _U32), ("ctx_in", ctypes.c_void_p)]
    _fields_ += [("ctx_out", ctypes.c_void_p), ("ctx_size_in", _U32), ("ctx_size_out", _U32)]
    _fields_ += [("retval", _U32), ("repeat", _INT), ("duration", _U32), ("flags", _U32)]
    _fields_ += [("cpu", _U32), ("batch_size", _U32)]


_PRINT_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)


class Libbpf:
    """The loaded `libbpf.so.1`, with argument types declared once."""

    _instance: Libbpf | None = None
    _lock = threading.Lock()
    library = ""
    """The library to load, set by the command from its settings; empty: the system's."""

    def __init__(self) -> None:
        # ctypes.util (with shutil, tempfile, bz2 and lzma) only once the offload starts.
        import ctypes.util

        name = self.library or ctypes.util.find_library("bpf") or "libbpf.so.1"
        try:
            self.lib = ctypes.CDLL(name, use_errno=True)
        except OSError as exc:
            raise OffloadError(f"libbpf not found ({name}): install libbpf1") from exc
        self._libc = ctypes.CDLL(None)
        self._libc.vsnprintf.argtypes = [
            ctypes.c_char_p,
            ctypes.c_size_t,
            ctypes.c_char_p,
            ctypes.c_void_p,
        ]
        self.log: deque[str] = deque(maxlen=_LOG_LINES)
        self._print = _PRINT_FN(self._on_print)
        lib = self.lib
        vp, i, u32, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_size_t
        sigs: dict[str, tuple[Any, list[Any]]] = {
            "libbpf_set_print": (vp, [_PRINT_FN]),
            "bpf_object__open_file": (vp, [ctypes.c_char_p, vp]),
            "bpf_object__load": (i, [vp]),
            "bpf_object__close": (None, [vp]),
            "bpf_object__find_program_by_name": (vp, [vp, ctypes.c_char_p]),
            "bpf_object__find_map_by_name": (vp, [vp, ctypes.c_char_p]),
            "bpf_program__fd": (i, [vp]),
            "bpf_map__fd": (i, [vp]),
            "bpf_map_update_elem": (i, [i, vp, vp, ctypes.c_uint64]),
            "bpf_map_lookup_elem": (i, [i, vp, vp]),
            "bpf_map_delete_elem": (i, [i, vp]),
            "bpf_map_lookup_and_delete_elem": (i, [i, vp, vp]),
            "bpf_map_get_next_key": (i, [i, vp, vp]),
            "bpf_tc_hook_create": (i, [ctypes.POINTER(_TcHook)]),
            "bpf_tc_attach": (i, [ctypes.POINTER(_TcHook), ctypes.POINTER(_TcOpts)]),
            "bpf_tc_detach": (i, [ctypes.POINTER(_TcHook), ctypes.POINTER(_TcOpts)]),
            "bpf_tc_query": (i, [ctypes.POINTER(_TcHook), ctypes.POINTER(_TcOpts)]),
            "bpf_xdp_attach": (i, [i, i, u32, vp]),
            "bpf_xdp_detach": (i, [i, u32, vp]),
            "bpf_xdp_query_id": (i, [i, i, ctypes.POINTER(u32)]),
            "bpf_prog_get_fd_by_id": (i, [u32]),
            "bpf_obj_get_info_by_fd": (i, [i, vp, ctypes.POINTER(u32)]),
            "btf__parse": (vp, [ctypes.c_char_p, vp]),
            "btf__free": (None, [vp]),
            "btf__find_by_name_kind": (i, [vp, ctypes.c_char_p, u32]),
            "btf__type_by_id": (vp, [vp, u32]),
            "btf__name_by_offset": (ctypes.c_char_p, [vp, u32]),
            "btf__resolve_size": (ctypes.c_longlong, [vp, u32]),
            "bpf_prog_test_run_opts": (i, [i, ctypes.POINTER(_TestRunOpts)]),
        }
        for fn, (restype, argtypes) in sigs.items():
            f = getattr(lib, fn)
            f.restype = restype
            f.argtypes = argtypes
        del sz
        lib.libbpf_set_print(self._print)

    @classmethod
    def get(cls) -> Libbpf:
        with cls._lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    def _on_print(self, level: int, fmt: bytes | None, args: int | None) -> int:
        buf = ctypes.create_string_buffer(1 << 16)
        if fmt is not None:
            self._libc.vsnprintf(buf, len(buf), fmt, args)
            for line in buf.value.decode(errors="replace").splitlines():
                if line.strip():
                    self.log.append(line.strip())
        return 0

    def error(self, what: str, rc: int = -1) -> OffloadError:
        """An error for a failed call: libbpf returns -errno, or NULL with errno set."""
        code = -rc if rc < -1 else ctypes.get_errno()
        reason = f"{what}: {os.strerror(code)} ({errno_mod.errorcode.get(code, code)})"
        if code in (errno_mod.EPERM, errno_mod.EACCES):
            reason += " (needs CAP_BPF and CAP_NET_ADMIN)"
        detail = [line for line in self.log if not line.startswith("libbpf: prog")][-3:]
        self.log.clear()
        if detail:
            reason += ": " + " | ".join(detail)
        return OffloadError(reason)


class BpfObject:
    """One loaded object file: its program and map fds live as long as this object."""

    def __init__(self, path: str) -> None:
        self.bpf = Libbpf.get()
        if not os.path.exists(path):
            raise OffloadError(f"offload object {path} is missing (run `make setup` with clang)")
        self.bpf.log.clear()
        obj = self.bpf.lib.bpf_object__open_file(path.encode(), None)
        if not obj:
            raise self.bpf.error(f"cannot open {path}")
        rc = self.bpf.lib.bpf_object__load(obj)
        if rc:
            err = self.bpf.error("cannot load the offload program", rc)
            self.bpf.lib.bpf_object__close(obj)
            raise err
        self._obj: int | None = obj

    def prog_fd(self, name: str) -> int:
        prog = self.bpf.lib.bpf_object__find_program_by_name(self._obj, name.encode())
        if not prog:
            raise OffloadError(f"program {name} not in the offload object")
        return int(self.bpf.lib.bpf_program__fd(prog))

    def map_fd(self, name: str) -> int:
        m = self.bpf.lib.bpf_object__find_map_by_name(self._obj, name.encode())
        if not m:
            raise OffloadError(f"map {name} not in the offload object")
        return int(self.bpf.lib.bpf_map__fd(m))

    def close(self) -> None:
        if self._obj is not None:
            self.bpf.lib.bpf_object__close(self._obj)
            self._obj = None


class BpfMap:
    """A hash map with ctypes structures as keys and values."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.lib = Libbpf.get().lib

    def update(self, key: ctypes.Structure, value: ctypes.Structure) -> None:
        rc = self.lib.bpf_map_update_elem(self.fd, ctypes.byref(key), ctypes.byref(value), BPF_ANY)
        if rc:
            raise Libbpf.get().error("map update", rc)

    def delete(self, key: ctypes.Structure) -> bool:
        return int(self.lib.bpf_map_delete_elem(self.fd, ctypes.byref(key))) == 0

    def pop(self, key: ctypes.Structure, value: ctypes.Structure) -> bool:
        """Delete the entry and read its last value in one step (no count lost between)."""
        rc = self.lib.bpf_map_lookup_and_delete_elem(
            self.fd, ctypes.byref(key), ctypes.byref(value)
        )
        return int(rc) == 0

    def lookup(self, key: ctypes.Structure, value: ctypes.Structure) -> bool:
        return (
            int(self.lib.bpf_map_lookup_elem(self.fd, ctypes.byref(key), ctypes.byref(value))) == 0
        )

    def keys(self, key_type: type[ctypes.Structure]) -> list[ctypes.Structure]:
        out: list[ctypes.Structure] = []
        prev: ctypes.Structure | None = None
        while True:
            nxt = key_type()
            rc = self.lib.bpf_map_get_next_key(
                self.fd, None if prev is None else ctypes.byref(prev), ctypes.byref(nxt)
            )
            if rc:
                return out
            out.append(nxt)
            prev = nxt


@dataclass(frozen=True, slots=True)
class ProgramRun:
    verdict: int  # the program's return value (TC_ACT_*, XDP_*)
    ns_per_run: int  # the kernel's clock around its loop, per run
    packet: bytes  # the packet as the last run left it


def run_program(prog_fd: int, packet: bytes, repeat: int = 1) -> ProgramRun:
    """Run a loaded program on `packet` in the kernel (BPF_PROG_TEST_RUN), `repeat` times on
    the same buffer; nothing is sent, whatever the verdict. For tests and benchmarks."""
    bpf = Libbpf.get()
    data_in = ctypes.create_string_buffer(packet, len(packet))
    data_out = ctypes.create_string_buffer(len(packet) + 256)
    opts = _TestRunOpts(
        data_in=ctypes.cast(data_in, ctypes.c_void_p),
        data_out=ctypes.cast(data_out, ctypes.c_void_p),
        data_size_in=len(packet),
        data_size_out=len(data_out),
        repeat=repeat,
    )
    rc = bpf.lib.bpf_prog_test_run_opts(prog_fd, ctypes.byref(opts))
    if rc:
        raise bpf.error("BPF_PROG_TEST_RUN", rc)
    return ProgramRun(opts.retval, opts.duration, data_out.raw[: opts.data_size_out])


def prog_name(prog_id: int) -> str | None:
    """The name of a loaded program, or None if it is gone."""
    bpf = Libbpf.get()
    fd = bpf.lib.bpf_prog_get_fd_by_id(prog_id)
    if fd < 0:
        return None
    try:
        info = ctypes.create_string_buffer(_PROG_INFO_BYTES)
        size = ctypes.c_uint32(_PROG_INFO_BYTES)
        if bpf.lib.bpf_obj_get_info_by_fd(fd, info, ctypes.byref(size)):
            return None
        raw = info.raw[_PROG_INFO_NAME_OFFSET : _PROG_INFO_NAME_OFFSET + 16]
        return raw.split(b"\0", 1)[0].decode(errors="replace")
    finally:
        os.close(fd)


def btf_struct(path: str, name: str) -> tuple[int, list[tuple[str, int, int]]]:
    """A structure's size and members (name, byte offset, byte size) in an object's BTF."""
    bpf = Libbpf.get()
    btf = bpf.lib.btf__parse(path.encode(), None)
    if not btf:
        raise bpf.error(f"cannot read the BTF of {path}")
    try:
        type_id = bpf.lib.btf__find_by_name_kind(btf, name.encode(), BTF_KIND_STRUCT)
        if type_id < 0:
            raise OffloadError(f"struct {name} is not in the BTF of {path}")
        # struct btf_type {name_off, info, size}, then vlen struct btf_member {name_off,
        # type, offset}; the offset is in bits (its low 24 bits when info's kind_flag is set)
        words = ctypes.cast(bpf.lib.btf__type_by_id(btf, type_id), ctypes.POINTER(_U32))
        info, members = words[1], []
        for i in range(3, 3 + 3 * (info & 0xFFFF), 3):
            name_off, member_type, bits = words[i], words[i + 1], words[i + 2]
            bits &= 0xFFFFFF if info >> 31 else 0xFFFFFFFF
            member = bpf.lib.btf__name_by_offset(btf, name_off).decode()
            members.append((member, bits // 8, int(bpf.lib.btf__resolve_size(btf, member_type))))
        return int(words[2]), members
    finally:
        bpf.lib.btf__free(btf)


def _tc(ifindex: int, prog_fd: int = 0, handle: int = 0, priority: int = 0) -> tuple[Any, Any]:
    hook = _TcHook(ifindex=ifindex, attach_point=BPF_TC_INGRESS)
    opts = _TcOpts(prog_fd=prog_fd, handle=handle, priority=priority)
    return hook, opts


def tc_query(ifindex: int, handle: int, priority: int) -> int:
    """The id of the program on clsact ingress at (handle, priority), or 0."""
    bpf = Libbpf.get()
    hook, opts = _tc(ifindex, handle=handle, priority=priority)
    if bpf.lib.bpf_tc_query(ctypes.byref(hook), ctypes.byref(opts)):
        return 0
    return int(opts.prog_id)


def tc_attach(ifindex: int, prog_fd: int, handle: int, priority: int) -> None:
    bpf = Libbpf.get()
    hook, opts = _tc(ifindex, prog_fd, handle, priority)
    rc = bpf.lib.bpf_tc_hook_create(ctypes.byref(hook))
    if rc and rc != -errno_mod.EEXIST:
        raise bpf.error(f"cannot add a clsact qdisc on ifindex {ifindex}", rc)
    opts.flags = BPF_TC_F_REPLACE
    rc = bpf.lib.bpf_tc_attach(ctypes.byref(hook), ctypes.byref(opts))
    if rc:
        raise bpf.error(f"cannot attach to TC ingress of ifindex {ifindex}", rc)


def tc_detach(ifindex: int, handle: int, priority: int) -> bool:
    bpf = Libbpf.get()
    hook, opts = _tc(ifindex, handle=handle, priority=priority)
    return int(bpf.lib.bpf_tc_detach(ctypes.byref(hook), ctypes.byref(opts))) == 0


def xdp_query(ifindex: int) -> int:
    """The id of the XDP program attached to the interface (any mode), or 0."""
    bpf = Libbpf.get()
    prog_id = ctypes.c_uint32(0)
    if bpf.lib.bpf_xdp_query_id(ifindex, 0, ctypes.byref(prog_id)):
        return 0
    return int(prog_id.value)


def xdp_attach(ifindex: int, prog_fd: int, *, replace: bool) -> None:
    """Attach in native (driver) mode; `replace=False` refuses to displace another program."""
    bpf = Libbpf.get()
    flags = XDP_FLAGS_DRV_MODE | (0 if replace else XDP_FLAGS_UPDATE_IF_NOEXIST)
    rc = bpf.lib.bpf_xdp_attach(ifindex, prog_fd, flags, None)
    if rc:
        raise bpf.error(f"cannot attach native XDP to ifindex {ifindex}", rc)


def xdp_detach(ifindex: int) -> bool:
    bpf = Libbpf.get()
    return int(bpf.lib.bpf_xdp_detach(ifindex, XDP_FLAGS_DRV_MODE, None)) == 0
