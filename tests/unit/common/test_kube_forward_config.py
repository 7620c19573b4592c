"""Which tools look the CDS up through a kubeconfig, and how a kubeconfig is read.

The discovery itself runs against a real API server in tests/integration/kube/test_kube_laptop.py.
"""

from __future__ import annotations

import base64
import json
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

import pytest
import yaml

from stunner_common.io.kube import (
    KubeDiscoveryError,
    KubeOptions,
    kubeconfig_paths,
    load_kubeconfig,
    wants_kube_discovery,
)
from support.kube_pki import make_pki


def _kubeconfig(path: Path, *, ca_data: bytes, token: str = "t0k") -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "c",
                        "cluster": {
                            "server": "https://127.0.0.1:6443/",
                            "certificate-authority-data": base64.b64encode(ca_data).decode(),
                        },
                    }
                ],
                "users": [{"name": "u", "user": {"token": token}}],
                "contexts": [
                    {"name": "one", "context": {"cluster": "c", "user": "u", "namespace": "ns1"}},
                    {"name": "two", "context": {"cluster": "c", "user": "u"}},
                ],
                "current-context": "one",
            }
        )
    )
    return path


def test_an_address_wins_over_any_kubeconfig(tmp_path: Path) -> None:
    env = {"KUBECONFIG": str(tmp_path / "k"), "HOME": str(tmp_path)}
    assert not wants_kube_discovery(env, "10.0.0.1:13478", KubeOptions())
    assert not wants_kube_discovery({**env, "CDS_SERVER_ADDR": "a:1"}, None, KubeOptions())
    assert not wants_kube_discovery({**env, "STUNNER_CDS_ADDR": "a:1"}, None, KubeOptions())
    assert wants_kube_discovery(env, None, KubeOptions())


def test_without_any_kubeconfig_the_loopback_default_stays(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path)}
    assert not wants_kube_discovery(env, None, KubeOptions())
    assert wants_kube_discovery(env, None, KubeOptions(kubeconfig="/x"))
    (tmp_path / ".kube").mkdir()
    (tmp_path / ".kube" / "config").write_text("{}")
    assert kubeconfig_paths(env) == [tmp_path / ".kube" / "config"]
    assert wants_kube_discovery(env, None, KubeOptions())


def test_contexts_namespaces_token_and_inline_ca(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    path = _kubeconfig(tmp_path / "k", ca_data=pki.ca_cert.read_bytes())
    env = {"KUBECONFIG": str(path), "HOME": str(tmp_path)}
    access = load_kubeconfig(KubeOptions(), env)
    assert access.server == "https://127.0.0.1:6443"
    assert access.namespace == "ns1"
    assert access.headers == {"Authorization": "Bearer t0k"}
    other = load_kubeconfig(KubeOptions(context="two"), env)
    assert other.namespace == "default"


@pytest.mark.parametrize(
    ("options", "env_kubeconfig", "says"),
    [
        (KubeOptions(kubeconfig="/nonexistent/k"), None, "no kubeconfig"),
        (KubeOptions(), "/nonexistent/k", "no kubeconfig"),
        (KubeOptions(context="three"), "GOOD", "no context 'three'"),
    ],
)
def test_kubeconfig_problems_are_one_line(
    tmp_path: Path, options: KubeOptions, env_kubeconfig: str | None, says: str
) -> None:
    pki = make_pki(tmp_path / "pki")
    good = _kubeconfig(tmp_path / "k", ca_data=pki.ca_cert.read_bytes())
    env = {"HOME": str(tmp_path)}
    if env_kubeconfig:
        env["KUBECONFIG"] = str(good) if env_kubeconfig == "GOOD" else env_kubeconfig
    with pytest.raises(KubeDiscoveryError) as err:
        load_kubeconfig(options, env)
    assert says in str(err.value)
    assert "\n" not in str(err.value)
    assert err.value.reason == "kubeconfig"


def _exec_kubeconfig(path: Path, ca_data: bytes, exec_spec: Mapping[str, object]) -> Path:
    doc = yaml.safe_load(_kubeconfig(path, ca_data=ca_data).read_text())
    doc["users"] = [{"name": "u", "user": {"exec": dict(exec_spec)}}]
    path.write_text(yaml.safe_dump(doc))
    return path


def _plugin(path: Path, body: str) -> Path:
    path.write_text(f"#!{sys.executable}\nimport json, os, sys\n{body}\n")
    path.chmod(0o755)
    return path


def test_an_exec_credential_plugin_gives_the_token(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    seen = tmp_path / "seen.json"
    plugin = _plugin(
        tmp_path / "plugin",
        f"open({str(seen)!r}, 'w').write(json.dumps({{'info': os.environ['KUBERNETES_EXEC_INFO'],"
        " 'extra': os.environ.get('EXTRA'), 'args': sys.argv[1:]}))\n"
        "print(json.dumps({'apiVersion': 'client.authentication.k8s.io/v1',"
        " 'kind': 'ExecCredential', 'status': {'token': 'from-the-plugin'}}))",
    )
    spec = {
        "apiVersion": "client.authentication.k8s.io/v1",
        "command": str(plugin),
        "args": ["get-token", "--cluster", "c"],
        "env": [{"name": "EXTRA", "value": "given"}],
        "provideClusterInfo": True,
        "interactiveMode": "Never",
    }
    kubeconfig = _exec_kubeconfig(tmp_path / "k", pki.ca_cert.read_bytes(), spec)
    access = load_kubeconfig(KubeOptions(kubeconfig=str(kubeconfig)), {"HOME": str(tmp_path)})
    assert access.token == "from-the-plugin"
    assert access.headers == {"Authorization": "Bearer from-the-plugin"}
    called = json.loads(seen.read_text())
    assert called["args"] == ["get-token", "--cluster", "c"]
    assert called["extra"] == "given"
    info = json.loads(called["info"])
    assert info["kind"] == "ExecCredential"
    assert info["apiVersion"] == "client.authentication.k8s.io/v1"
    assert info["spec"]["interactive"] is False
    assert info["spec"]["cluster"]["server"] == "https://127.0.0.1:6443/"


def test_an_exec_plugin_may_give_a_client_certificate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    private = tmp_path / "tmp"
    private.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    pki = make_pki(tmp_path / "pki")
    cert, key = pki.admin_cert.read_text(), pki.admin_key.read_text()
    plugin = _plugin(
        tmp_path / "plugin",
        "print(json.dumps({'apiVersion': 'client.authentication.k8s.io/v1beta1',"
        f" 'kind': 'ExecCredential', 'status': {{'clientCertificateData': {cert!r},"
        f" 'clientKeyData': {key!r}}}}}))",
    )
    spec = {"apiVersion": "client.authentication.k8s.io/v1beta1", "command": str(plugin)}
    kubeconfig = _exec_kubeconfig(tmp_path / "k", pki.ca_cert.read_bytes(), spec)
    access = load_kubeconfig(KubeOptions(kubeconfig=str(kubeconfig)), {"HOME": str(tmp_path)})
    assert access.token is None
    assert access.ssl_context.cert_store_stats()["x509_ca"] == 1
    assert list(private.iterdir()) == []  # the PEM files it was given are removed


@pytest.mark.parametrize(
    ("body", "extra", "says"),
    [
        (None, {"installHint": "install it with: gcloud components install"}, "was not found: "),
        ("print('denied', file=sys.stderr); sys.exit(3)", {}, "exited with status 3: denied"),
        ("print('not json')", {}, "did not print an ExecCredential"),
        ("print(json.dumps({'status': {}}))", {}, "neither a token nor a client certificate"),
        ("print('{}')", {"apiVersion": "client.authentication.k8s.io/v1alpha1"}, "apiVersion"),
    ],
)
def test_exec_plugin_failures_are_one_line(
    tmp_path: Path, body: str | None, extra: dict[str, str], says: str
) -> None:
    pki = make_pki(tmp_path / "pki")
    command = str(tmp_path / "absent-plugin")
    if body is not None:
        command = str(_plugin(tmp_path / "plugin", body))
    spec = {"apiVersion": "client.authentication.k8s.io/v1", "command": command, **extra}
    kubeconfig = _exec_kubeconfig(tmp_path / "k", pki.ca_cert.read_bytes(), spec)
    with pytest.raises(KubeDiscoveryError) as err:
        load_kubeconfig(KubeOptions(kubeconfig=str(kubeconfig)), {"HOME": str(tmp_path)})
    assert says in str(err.value)
    assert "context 'one'" in str(err.value)
    assert "\n" not in str(err.value)
    assert err.value.reason == "kubeconfig"


def test_an_auth_provider_is_refused_with_what_to_use(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    kubeconfig = _kubeconfig(tmp_path / "k", ca_data=pki.ca_cert.read_bytes())
    doc = yaml.safe_load(kubeconfig.read_text())
    doc["users"] = [{"name": "u", "user": {"auth-provider": {"name": "gcp"}}}]
    kubeconfig.write_text(yaml.safe_dump(doc))
    with pytest.raises(KubeDiscoveryError) as err:
        load_kubeconfig(KubeOptions(kubeconfig=str(kubeconfig)), {"HOME": str(tmp_path)})
    assert "gcp auth-provider was removed" in str(err.value)
    assert "exec credential plugin" in str(err.value)
