"""`-c k8s`: find the CDS through the Kubernetes API, as upstream's stunnerd does.

`CDS_SERVER_ADDR` (host[:port], port 13478 by default) wins when set. Otherwise the kubeconfig
(`--kubeconfig`, `KUBECONFIG`, `~/.kube/config`; `--context`; `--cds-server-namespace` or
`CDS_SERVER_NAMESPACE`) finds the CDS pod and a port-forward through the API server reaches it
for as long as stunnerd runs (`stunner_common.io.kube.forward`): the origin becomes
`http://127.0.0.1:<port>`, watched with `-w` as any CDS origin is, and a broken forward is
reopened by the watcher's next connection. The CDS token is the chart's Secret when readable,
else `--cds-token-file`, `CDS_TOKEN_FILE` or `CDS_TOKEN`.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, TypeVar

from stunner_common.cli import CDS_ADDR_ENV
from stunner_common.io.cds import CdsAddressError, cds_base_url
from stunner_common.io.kube import KubeDiscoveryError, KubeOptions, open_cds_forward
from stunnerd.origin.base import K8S_ORIGIN, is_k8s_origin

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = ["CDS_NAMESPACE_ENV", "K8S_ORIGIN", "is_k8s_origin", "run_with_k8s_origin"]
CDS_NAMESPACE_ENV = "CDS_SERVER_NAMESPACE"
EXIT_CONFIG = 1

S = TypeVar("S", bound="DataclassInstance")
"""stunnerd's settings (with ``origin``, ``cds_token_file``, ``cds_token_env_file`` and
``cds_token``), passed through unread."""


async def run_with_k8s_origin(
    settings: S,
    env: Mapping[str, str],
    options: KubeOptions,
    runner: Callable[[S], Awaitable[int]],
) -> int:
    """Run ``runner`` with the `k8s` origin replaced by the CDS's address (`env`: the
    environment the settings were read from)."""
    explicit = env.get(CDS_ADDR_ENV, "").strip()
    if explicit:
        try:
            origin = cds_base_url(explicit)
        except CdsAddressError as exc:
            print(f"stunnerd: {CDS_ADDR_ENV}: {exc}", file=sys.stderr)
            return EXIT_CONFIG
        return await runner(dataclasses.replace(settings, origin=origin))
    if options.namespace is None and env.get(CDS_NAMESPACE_ENV, "").strip():
        options = KubeOptions(options.kubeconfig, options.context, env[CDS_NAMESPACE_ENV].strip())
    try:
        async with open_cds_forward(options, env) as forward:
            update: dict[str, object] = {"origin": f"http://{forward.address}"}
            if forward.token and not getattr(settings, "cds_token_file", None):
                # the Secret's token, over CDS_TOKEN_FILE and CDS_TOKEN (not --cds-token-file)
                update.update(cds_token_env_file=None, cds_token=forward.token)
            return await runner(dataclasses.replace(settings, **update))
    except KubeDiscoveryError as exc:
        print(f"stunnerd: -c k8s: {exc}", file=sys.stderr)
        return EXIT_CONFIG
