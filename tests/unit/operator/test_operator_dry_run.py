"""``stunner-operator --manifests PATH --dry-run``: goldens for every seed example and edge case.

Each case is a folder holding ``base.yaml`` (the objects the examples refer to) and the case's
YAML; the golden output is the exact stdout (``tests/fixtures/operator/dry-run/NAME.yaml``) and
stderr (``NAME.stderr``). Set UPDATE_GOLDENS=1 to rewrite them after a deliberate change.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from stunner_common.config import StunnerConfig
from stunner_operator.__main__ import main
from stunner_operator.manifests.loader import split_documents
from support.operator import FIXTURES

SEEDS = FIXTURES / "seeds"
EDGE = FIXTURES / "edge"
GOLDEN = FIXTURES / "dry-run"
CASES = sorted(SEEDS.glob("GATEWAY*.yaml")) + sorted(EDGE.glob("*.yaml"))


def _documents(text: str) -> list[Any]:
    """The documents of ``text`` that parse (an edge case may hold broken ones)."""
    out = []
    for _, chunk in split_documents(text):
        try:
            out.append(yaml.safe_load(chunk))
        except yaml.YAMLError:
            continue
    return out


def _ident(doc: dict[str, Any]) -> tuple[str, str, str]:
    meta = doc.get("metadata") or {}
    return (doc.get("kind", ""), meta.get("namespace", ""), meta.get("name", ""))


def run_dry(
    tmp_path: Path, case: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> tuple[int, str, str]:
    folder = tmp_path / "manifests"
    folder.mkdir()
    # The case replaces the base objects it redefines (as kubectl apply would).
    text = case.read_text()
    redefined = {_ident(d) for d in _documents(text) if isinstance(d, dict)}
    base = [d for d in yaml.safe_load_all((SEEDS / "base.yaml").read_text()) if d]
    kept = [d for d in base if _ident(d) not in redefined]
    (folder / "base.yaml").write_text(yaml.safe_dump_all(kept, sort_keys=False))
    (folder / f"{case.stem}.yaml").write_text(text)
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    code = main(["--manifests", "manifests", "--dry-run"])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_dry_run_output_matches_its_golden(
    tmp_path: Path,
    case: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    code, out, err = run_dry(tmp_path, case, capsys, monkeypatch)
    assert code == 0
    stdout_golden = GOLDEN / f"{case.stem}.yaml"
    stderr_golden = GOLDEN / f"{case.stem}.stderr"
    if os.environ.get("UPDATE_GOLDENS"):
        GOLDEN.mkdir(exist_ok=True)
        stdout_golden.write_text(out)
        stderr_golden.write_text(err)
    assert out == stdout_golden.read_text()
    assert err == stderr_golden.read_text()


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_dry_run_output_is_a_stream_of_whole_objects(
    tmp_path: Path,
    case: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, out, _ = run_dry(tmp_path, case, capsys, monkeypatch)
    docs = list(yaml.safe_load_all(out))
    gateways = {
        (d["metadata"]["namespace"], d["metadata"]["name"]) for d in docs if d["kind"] == "Gateway"
    }
    for doc in docs:
        assert doc["apiVersion"]
        assert doc["metadata"]["name"]
        if doc["kind"] in ("GatewayClass", "Gateway", "UDPRoute"):
            assert "status" in doc
        else:
            key = (doc["metadata"]["namespace"], doc["metadata"]["name"])
            assert key in gateways, f"{doc['kind']} {key} belongs to no Gateway"
        if doc["kind"] == "ConfigMap":
            config = StunnerConfig.model_validate(json.loads(doc["data"]["stunnerd.conf"]))
            assert config.admin.name == "{namespace}/{name}".format(**doc["metadata"])


def test_the_edge_cases_show_what_the_user_must_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, out, err = run_dry(tmp_path, EDGE / "bad-document.yaml", capsys, monkeypatch)
    lines = err.splitlines()
    assert any(
        line.startswith("manifests/bad-document.yaml document 1: invalid YAML") for line in lines
    )
    assert any(
        line.startswith("manifests/bad-document.yaml document 3:") and "port" in line
        for line in lines
    )
    names = [d["metadata"]["name"] for d in yaml.safe_load_all(out) if d["kind"] == "Gateway"]
    assert {"first", "third"} <= set(names)
    assert "broken" not in names


def test_cli_exit_codes(tmp_path: Path) -> None:
    cli = [sys.executable, "-m", "stunner_operator"]
    missing = subprocess.run(
        [*cli, "--manifests", str(tmp_path / "nope"), "--dry-run"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert missing.returncode == 2
    assert missing.stdout == ""
    assert missing.stderr == f"stunner-operator: {tmp_path / 'nope'}: no such file or folder\n"
    no_path = subprocess.run(
        [*cli, "--dry-run"], capture_output=True, text=True, timeout=60, check=False
    )
    assert (no_path.returncode, no_path.stderr) == (
        2,
        "stunner-operator: --dry-run needs --manifests PATH\n",
    )
    (tmp_path / "bad.yaml").write_text("kind: [\n")
    broken = subprocess.run(
        [*cli, "--manifests", str(tmp_path), "--dry-run"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert broken.returncode == 0  # rendering ran; the problem is reported
    assert broken.stdout == ""
    assert broken.stderr.startswith(f"{tmp_path / 'bad.yaml'} document 0: invalid YAML at line")
    assert len(broken.stderr.splitlines()) == 1


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_an_unreadable_folder_exits_2(tmp_path: Path) -> None:
    folder = tmp_path / "locked"
    folder.mkdir()
    folder.chmod(0)
    try:
        code = main(["--manifests", str(folder), "--dry-run"])
    finally:
        folder.chmod(0o755)
    assert code == 2


def test_dry_run_warns_about_a_key_that_does_not_match_its_certificate(tmp_path: Path) -> None:
    from stunner_common.config import self_signed_pair
    from stunner_operator.dryrun import dry_run
    from support.operator import HIERARCHY

    cert, _ = self_signed_pair("one.example")
    _, other_key = self_signed_pair("two.example")
    (tmp_path / "all.yaml").write_text(
        HIERARCHY
        + f"""---
apiVersion: v1
kind: Secret
metadata: {{name: tls, namespace: stunner}}
type: kubernetes.io/tls
data: {{tls.crt: {cert}, tls.key: {other_key}}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: gw, namespace: stunner}}
spec:
  gatewayClassName: stunner
  listeners:
  - {{name: udp, port: 3478, protocol: TURN-UDP}}
  - {{name: tls, port: 443, protocol: TURN-TLS, tls: {{certificateRefs: [{{name: tls}}]}}}}
"""
    )
    result = dry_run(tmp_path)
    warnings = [p for p in result.problems if "InvalidCertificateRef" in p]
    assert len(warnings) == 1
    assert "listener tls: ResolvedRefs=False" in warnings[0]
    assert "private key does not match the certificate" in warnings[0]
    (config_map,) = [d for d in result.documents if d["kind"] == "ConfigMap"]
    rendered = json.loads(config_map["data"]["stunnerd.conf"])
    assert [ls["name"] for ls in rendered["listeners"]] == ["stunner/gw/udp"]


def test_the_operator_process_collects_its_youngest_generation_less_often() -> None:
    # The threshold is set when the entry point is imported, in the operator's process only.
    code = (
        "import gc, stunner_operator.__main__ as m; "
        "print(gc.get_threshold()[0] == m.GC_YOUNG_THRESHOLD > 700, gc.isenabled())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.split() == ["True", "True"]
