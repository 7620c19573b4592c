"""Which tools look the CDS up through a kubeconfig, and how a kubeconfig is read.

The discovery itself runs against a real API server in tests/integration/kube/test_kube_laptop.py.
"""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import yaml

from stunner_common.kube_forward import (
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
