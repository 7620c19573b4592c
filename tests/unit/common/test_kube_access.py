"""Where the one Kubernetes client finds its API server and credentials: a kubeconfig, else the
pod's service account (``stunner_common.io.kube.config``, ``.api.load_access``)."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from stunner_common.config.tls import self_signed_pair
from stunner_common.io.kube.api import KubeApiError, load_access
from stunner_common.io.kube.config import KubeDiscoveryError, in_cluster_access

IN_CLUSTER_ENV = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}


def _service_account(tmp_path: Path, token: str = "token-1") -> Path:
    account = tmp_path / "serviceaccount"
    account.mkdir()
    cert, _key = self_signed_pair("kubernetes.default.svc")  # base64 of PEM
    (account / "ca.crt").write_bytes(base64.b64decode(cert))
    (account / "token").write_text(token + "\n")
    (account / "namespace").write_text("stunner-system")
    return account


def test_in_cluster_access_is_the_service_host_with_the_pods_token_and_namespace(
    tmp_path: Path,
) -> None:
    access = in_cluster_access(IN_CLUSTER_ENV, _service_account(tmp_path))
    assert access.server == "https://10.96.0.1:443"
    assert access.namespace == "stunner-system"
    assert access.context == "in-cluster"
    assert access.headers == {"Authorization": "Bearer token-1"}


def test_an_ipv6_service_host_is_bracketed(tmp_path: Path) -> None:
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"}
    assert in_cluster_access(env, _service_account(tmp_path)).server == "https://[fd00::1]:6443"


def test_a_rotated_token_is_sent_at_the_next_request_and_the_last_one_kept_when_unreadable(
    tmp_path: Path,
) -> None:
    account = _service_account(tmp_path)
    access = in_cluster_access(IN_CLUSTER_ENV, account)
    (account / "token").write_text("token-2")
    assert access.headers == {"Authorization": "Bearer token-2"}
    (account / "token").unlink()
    assert access.headers == {"Authorization": "Bearer token-2"}


@pytest.mark.parametrize(
    ("env", "missing", "message"),
    [
        ({}, None, "KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set"),
        (IN_CLUSTER_ENV, "token", "cannot read the service-account token"),
        (IN_CLUSTER_ENV, "ca.crt", "cannot load the cluster's CA"),
    ],
)
def test_outside_a_pod_in_cluster_access_says_what_is_missing(
    tmp_path: Path, env: dict[str, str], missing: str | None, message: str
) -> None:
    account = _service_account(tmp_path)
    if missing:
        (account / missing).unlink()
    with pytest.raises(KubeDiscoveryError, match=message) as info:
        in_cluster_access(env, account)
    assert info.value.reason == "kubeconfig"


def test_load_access_prefers_the_kubeconfig(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: dev\n"
        "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:6443/'}}]\n"
        "users: [{name: u, user: {token: from-kubeconfig}}]\n"
        "contexts: [{name: dev, context: {cluster: c, user: u, namespace: ns}}]\n"
    )
    access = load_access(kubeconfig, {**IN_CLUSTER_ENV, "HOME": str(tmp_path)})
    assert access.server == "http://127.0.0.1:6443"
    assert access.headers == {"Authorization": "Bearer from-kubeconfig"}
    access = load_access(None, {"KUBECONFIG": str(kubeconfig), "HOME": str(tmp_path)})
    assert access.context == "dev"


def test_load_access_names_a_kubeconfig_given_but_unusable(tmp_path: Path) -> None:
    with pytest.raises(KubeApiError, match=r"cannot load kubeconfig .*/absent"):
        load_access(tmp_path / "absent", {"HOME": str(tmp_path)})


def test_load_access_without_kubeconfig_outside_a_pod_says_both(tmp_path: Path) -> None:
    with pytest.raises(KubeApiError, match="no kubeconfig and not running in a cluster"):
        load_access(None, {"HOME": str(tmp_path)})
