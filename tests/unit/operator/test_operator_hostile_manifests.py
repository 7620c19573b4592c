"""Hostile files in the manifest folder: refused with the file named, in bounded memory, while
the last good config stays in force."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest

from stunner_operator.manifests.loader import MAX_DEPTH, MAX_NODES, ManifestSet, parse_manifests
from stunner_operator.manifests.local import LocalOperator
from support.operator import HIERARCHY, UDP_GATEWAY

PEAK_BYTES = 32 * 1024 * 1024


def alias_bomb(levels: int = 9) -> str:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels + 1):
        refs = ",".join([f"*a{i - 1}"] * 10)
        lines.append(f"a{i}: &a{i} [{refs}]")
    return "apiVersion: v1\nkind: Secret\nmetadata: {name: bomb}\nstringData:\n" + "".join(
        f"  {line}\n" for line in lines
    )


def deep_nesting(depth: int = 10_000) -> str:
    return (
        "apiVersion: v1\nkind: Secret\nmetadata: {name: deep}\ndata: "
        + "[" * depth
        + ("]" * depth + "\n")
    )


def write_alias_bomb(path: Path) -> None:
    path.write_text(alias_bomb())


def write_deep_nesting(path: Path) -> None:
    path.write_text(deep_nesting())


def write_invalid_utf8(path: Path) -> None:
    path.write_bytes(UDP_GATEWAY.encode() + b"\n# \xff\xfe broken\n")


def write_50_mb(path: Path) -> None:
    with path.open("wb") as fh:
        fh.write(b"apiVersion: v1\nkind: Secret\nmetadata: {name: huge}\nstringData: {a: '")
        chunk = b"x" * (1024 * 1024)
        for _ in range(50):
            fh.write(chunk)
        fh.write(b"'}\n")


HOSTILE: dict[str, tuple[Callable[[Path], None], str]] = {
    "alias-bomb": (write_alias_bomb, f"expands to more than {MAX_NODES} nodes"),
    "deep-nesting": (write_deep_nesting, f"nested deeper than {MAX_DEPTH} levels"),
    "invalid-utf8": (write_invalid_utf8, "not UTF-8 text (byte 0xff at offset"),
    "50-mb": (write_50_mb, "file too large (52428"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_file_is_refused_by_name_in_bounded_memory(tmp_path: Path, case: str) -> None:
    write, needle = HOSTILE[case]
    path = tmp_path / "gw.yaml"
    write(path)
    ms = ManifestSet(tmp_path)
    tracemalloc.start()
    try:
        result = ms.reload()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    (err,) = result.new_errors
    assert err.path == str(path)
    assert needle in str(err), str(err)
    assert str(err).startswith(str(path))
    assert peak < PEAK_BYTES, f"{case}: peak {peak} bytes"


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_file_keeps_the_last_good_config(
    tmp_path: Path, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "hierarchy.yaml").write_text(HIERARCHY)
    path = tmp_path / "gw.yaml"
    path.write_text(UDP_GATEWAY)
    op = LocalOperator(tmp_path, None)
    op.sync()
    before = {cid: c.canonical_json() for cid, c in op.renderer.configs().items()}
    assert list(before) == ["stunner/gw"]
    write, needle = HOSTILE[case]
    write(path)
    caplog.set_level("INFO", logger="stunner_operator")
    delta = op.sync()
    assert not delta.configs_changed
    assert {cid: c.canonical_json() for cid, c in op.renderer.configs().items()} == before
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1
    assert errors[0].startswith(str(path))
    assert needle in errors[0]
    # Fixing the file takes effect again.
    path.write_text(UDP_GATEWAY.replace("3478", "3479"))
    assert op.sync().configs_changed
    assert op.renderer.configs()["stunner/gw"].listeners[0].port == 3479


def test_a_bomb_in_one_document_leaves_the_others_alone() -> None:
    result = parse_manifests(HIERARCHY + "\n---\n" + alias_bomb(), "x.yaml")
    (err,) = result.errors
    assert err.index == 3
    assert len(result.objects) == 3


def test_anchors_and_merge_keys_of_ordinary_size_still_work() -> None:
    text = """
apiVersion: v1
kind: Secret
metadata: {name: s, namespace: stunner, labels: &l {a: b}, annotations: *l}
stringData:
  <<: {type: static, username: user-1}
  password: pass-1
"""
    result = parse_manifests(text)
    assert result.errors == ()
    (secret,) = result.objects
    assert secret.metadata.labels == secret.metadata.annotations == {"a": "b"}


def test_nesting_just_within_the_limit_is_accepted() -> None:
    # stringData values must be strings, so this is refused by the schema, not by the depth.
    text = deep_nesting(MAX_DEPTH - 2)
    (err,) = parse_manifests(text, "x.yaml").errors
    assert "nested deeper" not in err.message
