"""Local mode's folder loader: every document parsed, errors located, last good version kept."""

from __future__ import annotations

from pathlib import Path

import pytest

from stunner_operator.manifests.loader import ManifestSet, parse_manifests
from stunner_operator.manifests.local import LocalOperator
from support.operator import HIERARCHY, UDP_GATEWAY


def test_multi_document_text_parses_every_supported_object() -> None:
    result = parse_manifests(HIERARCHY + "\n---\n" + UDP_GATEWAY, "x.yaml")
    assert [type(o).__name__ for o in result.objects] == [
        "Dataplane",
        "GatewayConfig",
        "GatewayClass",
        "Gateway",
    ]
    assert result.errors == ()


def test_invalid_yaml_is_reported_with_its_document_and_line() -> None:
    text = HIERARCHY + "\n---\nkind: Gateway\n  bad: ["
    result = parse_manifests(text, "x.yaml")
    (err,) = result.errors
    assert err.index == 3
    # The line is that of the whole file, not of the document.
    line = text.splitlines().index("  bad: [") + 1
    assert str(err).startswith(f"x.yaml document 3: invalid YAML at line {line},")
    # The file's other documents still load.
    assert [type(o).__name__ for o in result.objects] == [
        "Dataplane",
        "GatewayConfig",
        "GatewayClass",
    ]


def test_a_bad_document_keeps_its_last_good_version_and_the_others_load(tmp_path: Path) -> None:
    other_gateway = UDP_GATEWAY.replace("name: gw", "name: gw2")
    path = tmp_path / "all.yaml"
    path.write_text(HIERARCHY + "\n---\n" + UDP_GATEWAY)
    ms = ManifestSet(tmp_path)
    first = ms.reload()
    assert ("Gateway", "stunner", "gw") in first.objects
    # Document 3 (the Gateway) breaks while a new document 4 is added.
    path.write_text(
        HIERARCHY + "\n---\n" + UDP_GATEWAY.replace("TURN-UDP", "[") + "\n---\n" + other_gateway
    )
    second = ms.reload()
    (err,) = second.new_errors
    assert (err.path, err.index) == (str(path), 3)
    assert (
        second.objects[("Gateway", "stunner", "gw")] == first.objects[("Gateway", "stunner", "gw")]
    )
    assert ("Gateway", "stunner", "gw2") in second.objects


@pytest.mark.parametrize(
    ("text", "count"),
    [
        ("---\na: 1\n", 1),
        ("a: 1\n---\nb: 2\n", 2),
        ("# c\n---\na: 1\n---\n", 2),
        ("a: 1\n...\n# tail\n", 1),
        ("a: |\n  ---\n  x\n---\nb: 1\n", 2),
        ("--- {a: 1}\n--- {b: 2}\n", 2),
    ],
)
def test_documents_split_as_yaml_does(text: str, count: int) -> None:
    import yaml

    from stunner_operator.manifests.loader import split_documents

    chunks = split_documents(text)
    assert len(chunks) == count == len(list(yaml.safe_load_all(text)))
    assert [yaml.safe_load(c) for _, c in chunks] == list(yaml.safe_load_all(text))


def test_invalid_object_is_reported_with_file_and_document_index() -> None:
    bad_gateway = UDP_GATEWAY.replace("port: 3478", "port: 0")
    result = parse_manifests(HIERARCHY + "\n---\n" + bad_gateway, "gw.yaml")
    (err,) = result.errors
    assert err.index == 3
    assert "gw.yaml document 3" in str(err)
    assert "spec.listeners.0.port" in str(err)


def test_unsupported_kinds_are_skipped_not_errors() -> None:
    text = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\n"
    result = parse_manifests(text, "d.yaml")
    assert result.errors == ()
    assert result.objects == ()
    assert result.skipped


def test_kubernetes_list_documents_are_unpacked() -> None:
    text = (
        "apiVersion: v1\nkind: List\nitems:\n"
        "- {apiVersion: v1, kind: Namespace, metadata: {name: a}}\n"
        "- {apiVersion: v1, kind: Namespace, metadata: {name: b}}\n"
    )
    assert [o.metadata.name for o in parse_manifests(text).objects] == ["a", "b"]


def test_broken_file_keeps_its_last_good_objects(tmp_path: Path) -> None:
    (tmp_path / "h.yaml").write_text(HIERARCHY)
    (tmp_path / "gw.yaml").write_text(UDP_GATEWAY)
    ms = ManifestSet(tmp_path)
    first = ms.reload()
    assert len(first.objects) == 4
    assert first.new_errors == ()
    (tmp_path / "gw.yaml").write_text(UDP_GATEWAY.replace("TURN-UDP", "TURN-UDP}}}"))
    second = ms.reload()
    assert second.objects == first.objects
    assert len(second.new_errors) == 1
    assert "gw.yaml" in str(second.new_errors[0])
    assert ms.errors == list(second.new_errors)
    (tmp_path / "gw.yaml").unlink()
    third = ms.reload()
    assert len(third.objects) == 3
    assert ms.errors == []


def test_unchanged_files_are_not_parsed_again(tmp_path: Path) -> None:
    (tmp_path / "h.yaml").write_text(HIERARCHY)
    ms = ManifestSet(tmp_path)
    assert ms.reload().changed_files == (str(tmp_path / "h.yaml"),)
    assert ms.reload().changed_files == ()


def test_hidden_files_and_other_suffixes_are_ignored(tmp_path: Path) -> None:
    (tmp_path / ".h.yaml").write_text(HIERARCHY)
    (tmp_path / "notes.txt").write_text("not yaml: [")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "gw.yml").write_text(UDP_GATEWAY)
    result = ManifestSet(tmp_path).reload()
    assert [k[0] for k in result.objects] == ["Gateway"]


def test_duplicate_objects_in_two_files_are_reported(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(UDP_GATEWAY)
    (tmp_path / "b.yaml").write_text(UDP_GATEWAY)
    result = ManifestSet(tmp_path).reload()
    assert len(result.objects) == 1
    assert "also defined in" in str(result.new_errors[0])


def test_sync_renders_the_folder_and_logs_one_line_per_status(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "all.yaml").write_text(HIERARCHY + "\n---\n" + UDP_GATEWAY)
    op = LocalOperator(tmp_path, None)
    caplog.set_level("INFO", logger="stunner_operator")
    delta = op.sync()
    assert list(delta.configs) == ["stunner/gw"]
    lines = [r.getMessage() for r in caplog.records]
    assert any(line.startswith("Gateway stunner/gw: Accepted, Programmed") for line in lines)
    assert any(line.startswith("GatewayClass stunner: Accepted") for line in lines)
    caplog.clear()
    (tmp_path / "all.yaml").write_text(HIERARCHY + "\n---\n" + UDP_GATEWAY + "\n---\nnot: [valid")
    delta = op.sync()
    assert not delta.configs_changed
    assert list(op.renderer.configs()) == ["stunner/gw"]
    assert any("all.yaml" in r.getMessage() and r.levelname == "ERROR" for r in caplog.records)


def test_a_deleted_object_is_logged_as_deleted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "h.yaml").write_text(HIERARCHY)
    (tmp_path / "gw.yaml").write_text(UDP_GATEWAY)
    op = LocalOperator(tmp_path, None)
    op.sync()
    caplog.set_level("INFO", logger="stunner_operator")
    (tmp_path / "gw.yaml").unlink()
    op.sync()
    lines = [r.getMessage() for r in caplog.records]
    assert "Gateway stunner/gw: deleted" in lines
    assert not any("not managed" in line for line in lines)


def test_a_malformed_annotation_is_logged_as_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    gw = UDP_GATEWAY.replace(
        "metadata: {name: gw, namespace: stunner}",
        "metadata:\n  name: gw\n  namespace: stunner\n"
        "  annotations: {stunner.l7mp.io/service-type: None}",
    )
    (tmp_path / "all.yaml").write_text(HIERARCHY + "\n---\n" + gw)
    caplog.set_level("INFO", logger="stunner_operator")
    LocalOperator(tmp_path, None).sync()
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [
        "Gateway stunner/gw: annotation stunner.l7mp.io/service-type: 'None' is not one of "
        "ClusterIP, NodePort, ExternalName, LoadBalancer; using LoadBalancer"
    ]
