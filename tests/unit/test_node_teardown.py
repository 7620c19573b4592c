"""The node tier's teardown walks the cgroups the kubelet made while the kubelet and containerd
may still remove some: a directory gone half-way through the walk is left out, not an error."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

import pytest

from support import node_net


class _Listing:
    """What `os.scandir` returns, listed at once."""

    def __init__(self, entries: list[os.DirEntry[str]]) -> None:
        self.entries = iter(entries)

    def __iter__(self) -> Iterator[os.DirEntry[str]]:
        return self.entries

    def __next__(self) -> os.DirEntry[str]:
        return next(self.entries)

    def __enter__(self) -> _Listing:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None


def test_a_cgroup_removed_while_the_teardown_walks_is_left_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    top = tmp_path / "kubepods"
    for sub in ("a/c1", "b/c2", "d"):
        (top / sub).mkdir(parents=True)
    real = os.scandir

    def scandir(path: str | int) -> _Listing:
        listing = _Listing(list(real(path)))
        if isinstance(path, str) and Path(path) == top:
            shutil.rmtree(top / "b")  # the kubelet removes a pod's cgroup meanwhile
        return listing

    monkeypatch.setattr(os, "scandir", scandir)
    found = node_net._subtree(str(top))
    assert sorted(p.relative_to(top).as_posix() for p in found) == [".", "a", "a/c1", "d"]


def test_a_failed_teardown_step_does_not_keep_the_steps_after_it_from_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from support import node_stack

    etcd = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        state = {"pids": {"etcd": etcd.pid}, "socket": str(tmp_path / "containerd.sock")}
        (tmp_path / "node-state.json").write_text(json.dumps(state))

        def broken(socket: Path) -> list[int]:
            raise OSError("containerd's shims could not be listed")

        monkeypatch.setattr(node_stack, "shim_pids", broken)
        monkeypatch.setattr(node_stack, "sandbox_netns", lambda socket: [])
        monkeypatch.setattr(node_stack, "cni_sandboxes", lambda network: {})
        monkeypatch.setattr(node_stack, "remove_cni_state", lambda *args: [])
        with pytest.raises(node_stack.TeardownError, match=r"shim pids: .*could not be listed"):
            node_stack.teardown(tmp_path)
        assert etcd.wait(timeout=10) is not None  # stopped after the failed step
        assert not (tmp_path / "node-state.json").exists()
    finally:
        if etcd.poll() is None:
            etcd.kill()
            etcd.wait()
