"""The stunnerctl command: arguments, the CDS lookup shared by every subcommand, output, exits.

    stunnerctl [flags] config  [GATEWAY | NAMESPACE/GATEWAY]
    stunnerctl [flags] status  [GATEWAY | NAMESPACE/GATEWAY]
    stunnerctl [flags] icetest [GATEWAY | NAMESPACE/GATEWAY] [--peer udp://host:port]

Without a Gateway every Gateway the CDS serves is shown (or those of `-n NAMESPACE`). The CDS
is `--cds` (or `CDS_SERVER_ADDR`, as for turncat and the auth service; `STUNNER_CDS_ADDR` still
works, with a deprecation warning); without one, the kubeconfig (`--kubeconfig`, `KUBECONFIG`,
`~/.kube/config`; `--context`, `--cds-server-namespace`) finds the CDS pod and a port-forward
through the API server reaches it, as for turncat; else 127.0.0.1:13478, where `make run` and
compose put it. The bearer token comes from `--cds-token-file`, the chart's Secret (through the
kubeconfig, when readable), `CDS_TOKEN_FILE` or `CDS_TOKEN`; a token file that cannot be read
is an error. `status` reads each stunnerd's `/status`: through a port-forward to every ready
pod of the Gateway when the CDS was found through the kubeconfig, else at its health address
(see `turncat.ctl.status`). It also asks the operator's `/gateways` (`--operator`,
`STUNNER_OPERATOR_ADDR`, else 127.0.0.1:8081 when the CDS is on loopback) and shows a Gateway
the operator reports degraded (a rejected listener) with the reason.
Each failure ends with one line on stderr and turncat's exit codes.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from stunner_common import logs
from stunner_common.cli import (
    CDS_ADDR_ENV,
    add_version_argument,
)
from stunner_common.config import ConfigError, StunnerConfig, parse_config
from stunner_common.io.cds import CdsClient, CdsHttpError, CdsUnreachableError
from stunner_common.io.cds.client import CdsAddressError
from stunner_common.io.kube import KubeApi
from stunner_common.loglevel import apply_log_spec, parse_log_spec
from stunner_common.runtime import run as run_loop
from turncat.cds import cds_endpoint, cds_failure, diagnose_cds, kube_options
from turncat.ctl.icetest import check_icetest_args, cmd_icetest
from turncat.ctl.status import (
    GatewayStatus,
    fetch_operator_report,
    gather_pod_status,
    gather_status,
)
from turncat.ctl.summary import (
    config_summary,
    degraded_summary,
    dump,
    status_summary,
    unreachable_summary,
)
from turncat.errors import (
    EXIT_FAILURE,
    EXIT_OK,
    BadInputError,
    LookupFailedError,
    exit_status,
)
from turncat.settings import (
    OPERATOR_ADDR_ENV,
    TurncatSettings,
    load_settings,
)

log = logging.getLogger(__name__)

DEFAULT_CDS = "127.0.0.1:13478"
DEFAULT_OPERATOR_PORT = 8081
DEFAULT_PEER = "udp://127.0.0.1:9001"  # make run's and compose's UDP echo backend

EPILOG = """\
examples:
  stunnerctl config                              every Gateway's running config
  stunnerctl -n stunner config udp-gateway -o yaml
  stunnerctl status                              every stunnerd's /status
  stunnerctl icetest --peer udp://127.0.0.1:9001 RTT and loss through every listener
exit codes: 0 ok, 1 failure (a stunnerd unreachable or a Gateway degraded, an icetest listener
            failed), 2 bad input or unknown Gateway, 3 the CDS refused the token, 5 the CDS is
            unreachable
"""


@dataclass(frozen=True, slots=True)
class Gateway:
    config: StunnerConfig
    raw: dict[str, Any]


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--cds",
        "--cds-server-address",
        dest="cds",
        default=argparse.SUPPRESS,
        help=f"CDS address, host[:port] or http(s)://… [env {CDS_ADDR_ENV}; {DEFAULT_CDS}]",
    )
    common.add_argument(
        "--cds-token-file",
        default=argparse.SUPPRESS,
        help="file holding the CDS bearer token [env CDS_TOKEN_FILE, else CDS_TOKEN]",
    )
    common.add_argument(
        "-n", "--namespace", default=argparse.SUPPRESS, help="the Gateways' namespace"
    )
    common.add_argument(
        "--kubeconfig",
        default=argparse.SUPPRESS,
        help="kubeconfig to find the CDS with when no CDS address is given "
        "[env KUBECONFIG; ~/.kube/config]",
    )
    common.add_argument(
        "--context", default=argparse.SUPPRESS, help="the kubeconfig context to use"
    )
    common.add_argument(
        "--cds-server-namespace",
        default=argparse.SUPPRESS,
        help="namespace of the CDS pod [env CDS_SERVER_NAMESPACE; default: any namespace]",
    )
    common.add_argument(
        "-o",
        "--output",
        choices=("summary", "json", "yaml"),
        default=argparse.SUPPRESS,
        help="summary (default), json (one object per line) or yaml",
    )
    common.add_argument("-l", "--log", default=argparse.SUPPRESS, help="log spec (all:WARN)")
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS)
    common.add_argument(
        "--timeout",
        type=float,
        default=argparse.SUPPRESS,
        help="seconds for each CDS or /status request (5)",
    )

    p = argparse.ArgumentParser(
        prog="stunnerctl",
        description="Inspect a running STUNner through its config discovery service.",
        parents=[common],
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_version_argument(p, "turncat")
    sub = p.add_subparsers(dest="command", required=True, metavar="{config,status,icetest}")
    gw_help = "GATEWAY or NAMESPACE/GATEWAY (default: all Gateways)"
    config = sub.add_parser("config", parents=[common], help="the Gateways' running configs")
    config.add_argument("gateway", nargs="?", help=gw_help)
    status = sub.add_parser("status", parents=[common], help="each stunnerd's /status")
    status.add_argument("gateway", nargs="?", help=gw_help)
    status.add_argument(
        "--status-url",
        action="append",
        default=[],
        metavar="URL",
        help="a stunnerd health URL to ask (repeatable); replaces the discovery",
    )
    status.add_argument(
        "--operator",
        metavar="ADDR",
        help=f"the operator's health address, for its /gateways report [env {OPERATOR_ADDR_ENV}; "
        f"127.0.0.1:{DEFAULT_OPERATOR_PORT} when the CDS is on loopback; '' turns it off]",
    )
    status.add_argument(
        "--health-port",
        "--pod-port",
        dest="health_port",
        type=int,
        metavar="PORT",
        help="the stunnerd health port (of each pod, or the first one), instead of the "
        "config's (8086)",
    )
    ice = sub.add_parser(
        "icetest", parents=[common], help="allocate through every listener, time echo probes"
    )
    ice.add_argument("gateway", nargs="?", help=gw_help)
    ice.add_argument("--peer", default=DEFAULT_PEER, help=f"the UDP echo backend ({DEFAULT_PEER})")
    ice.add_argument("-c", "--count", type=int, default=20, help="probes per listener (20)")
    ice.add_argument("--interval-ms", type=float, default=20.0, help="between probes, ms (20)")
    ice.add_argument(
        "--wait-ms", type=float, default=1000.0, help="for echoes after the last probe (1000)"
    )
    ice.add_argument(
        "--max-loss", type=float, default=0.1, help="loss above which a listener fails (0.1)"
    )
    ice.add_argument(
        "-i", "--insecure", action="store_true", help="do not verify TLS/DTLS certificates"
    )
    ice.add_argument("--ca", metavar="FILE", help="CA bundle for TLS/DTLS listeners")
    return p


def _option(args: argparse.Namespace, name: str, default: Any) -> Any:
    return getattr(args, name, default)


def selector(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """(namespace, name) to ask the CDS for; None, None means every config."""
    ns = _option(args, "namespace", None)
    gw = args.gateway
    if gw:
        if gw.count("/") > 1 or gw.startswith("/") or gw.endswith("/"):
            raise BadInputError(f"invalid Gateway {gw!r}: expected NAME or NAMESPACE/NAME")
        if "/" in gw:
            ns, gw = gw.split("/")
        return ns or "default", gw
    return ns, None


async def load_configs(
    client: CdsClient,
    ns: str | None,
    name: str | None,
    *,
    has_token: bool,
    env: Mapping[str, str],
) -> list[Gateway]:
    """The configs the CDS serves for the selection, sorted by Gateway, each parsed (validated,
    defaults applied) and as it was sent (for `-o json|yaml`)."""
    base = client.base_url
    what = f"gateway {ns}/{name}" if name else (f"namespace {ns}" if ns else "all Gateways")
    try:
        body = await client.get(ns, name)
    except (CdsUnreachableError, CdsHttpError) as exc:
        failure = cds_failure(exc, base, what, has_token=has_token)
        if isinstance(exc, CdsHttpError) and exc.status == 404:
            hint = await diagnose_cds(client, ns, name)
            if hint and name is None:
                failure = LookupFailedError(hint)  # a 404 for a list: not a CDS
            elif hint:
                failure = LookupFailedError(f"{failure}; {hint}")
        raise failure from None
    try:
        doc = json.loads(body)
        items = [doc] if name else list(doc.get("items") or [])
        gateways = [Gateway(parse_config(json.dumps(item), env=env), dict(item)) for item in items]
    except (ValueError, AttributeError, TypeError, ConfigError) as exc:
        hint = await diagnose_cds(client, None, None)
        why = hint or f"the CDS at {base} sent an invalid config: {exc}"
        raise LookupFailedError(why) from None
    return sorted(gateways, key=lambda g: g.config.admin.name)


async def cmd_config(gateways: list[Gateway], output: str) -> int:
    if output == "summary":
        print("\n".join(config_summary(g.config) for g in gateways))
    else:
        print(dump([g.raw for g in gateways], output))
    return EXIT_OK


async def _gather(
    args: argparse.Namespace, configs: list[StunnerConfig], client: CdsClient, cds: Lookup
) -> list[GatewayStatus]:
    timeout_s = _option(args, "timeout", 5.0)
    if cds.kube is not None and not args.status_url:
        return await gather_pod_status(
            configs, cds.kube, pod_port=args.health_port, timeout_s=timeout_s
        )
    served = configs
    if args.gateway or _option(args, "namespace", None):
        # make run and compose number the health ports over every Gateway, not just these.
        served = [
            g.config
            for g in await load_configs(
                client, None, None, has_token=True, env=cds.settings.environ
            )
        ]
    return await gather_status(
        configs,
        cds_host=urlsplit(client.base_url).hostname or "127.0.0.1",
        gateways_served=len(served),
        status_urls=args.status_url,
        health_port=args.health_port,
        timeout_s=timeout_s,
    )


async def cmd_status(
    args: argparse.Namespace, configs: list[StunnerConfig], client: CdsClient, cds: Lookup
) -> int:
    output = _option(args, "output", "summary")
    results = await _gather(args, configs, client, cds)
    operator = operator_address(args, client, cds)
    report = (
        await fetch_operator_report(operator, _option(args, "timeout", 5.0)) if operator else {}
    )
    degraded = {
        str(g.get("name")): [str(r) for r in g.get("reasons") or []]
        for g in report.get("gateways") or []
        if isinstance(g, dict) and g.get("state") == "degraded"
    }
    if output == "summary":
        for r in results:
            if r.status is not None and r.url is not None:
                print(status_summary(r.gateway, r.url, r.status, degraded.get(r.gateway)))
            else:
                print(unreachable_summary(r.gateway, r.tried, r.reason))
                if r.gateway in degraded:
                    print(degraded_summary(degraded[r.gateway]))
    else:
        docs: list[dict[str, Any]] = []
        for r in results:
            doc: dict[str, Any] = (
                dict(r.status)
                if r.status is not None
                else {"gateway": r.gateway, "unreachable": r.reason, "tried": r.tried}
            )
            if r.gateway in degraded:
                doc["operator"] = {"state": "degraded", "reasons": degraded[r.gateway]}
            docs.append(doc)
        print(dump(docs, output))
    missing = [r.gateway for r in results if r.status is None]
    if missing:
        print(
            f"stunnerctl: no stunnerd answered for {', '.join(dict.fromkeys(missing))} "
            "(give its health URL with --status-url)",
            file=sys.stderr,
        )
        return EXIT_FAILURE
    shown = [r.gateway for r in results if r.gateway in degraded]
    if shown:
        print(f"stunnerctl: degraded: {', '.join(shown)} (see the reasons above)", file=sys.stderr)
        return EXIT_FAILURE
    return EXIT_OK


def operator_address(args: argparse.Namespace, client: CdsClient, cds: Lookup) -> str | None:
    """Where to ask for the operator's /gateways report, or None (not asked)."""
    given = args.operator if args.operator is not None else cds.settings.operator_addr
    if given is not None:
        return given.strip() or None
    host = urlsplit(client.base_url).hostname or ""
    if cds.kube is not None:
        return None  # a port-forward's loopback end says nothing about where the operator is
    if host in ("127.0.0.1", "localhost", "::1"):
        return f"127.0.0.1:{DEFAULT_OPERATOR_PORT}"
    return None


@dataclass(frozen=True, slots=True)
class Lookup:
    """How this run reached the CDS: the settings, the token and, when the CDS was found
    through the kubeconfig, the API server (stunnerd pods are reached through it too)."""

    settings: TurncatSettings
    has_token: bool
    kube: KubeApi | None


async def run(args: argparse.Namespace, settings: TurncatSettings) -> int:
    if args.command == "icetest":
        check_icetest_args(args)
    async with cds_endpoint(
        "stunnerctl",
        settings.environ,
        address_flag=_option(args, "cds", None),
        token_file=_option(args, "cds_token_file", None),
        kube=kube_options(args),
        timeout_s=_option(args, "timeout", 5.0),
    ) as cds:
        try:
            client = CdsClient(
                cds.address, token=cds.token, timeout_s=_option(args, "timeout", 5.0)
            )
        except CdsAddressError as exc:
            raise BadInputError(str(exc)) from None
        return await run_with(args, client, Lookup(settings, cds.token is not None, cds.kube))


async def run_with(args: argparse.Namespace, client: CdsClient, cds: Lookup) -> int:
    ns, name = selector(args)
    has_token = cds.has_token
    gateways = await load_configs(client, ns, name, has_token=has_token, env=cds.settings.environ)
    configs = [g.config for g in gateways]
    output = _option(args, "output", "summary")
    if not configs:
        where = f"in namespace {ns}" if ns else "at all"
        hint = await diagnose_cds(client, ns, None) if ns else ""
        print(
            f"stunnerctl: the CDS at {client.base_url} serves no Gateway {where}"
            + (f"; {hint}" if hint else ""),
            file=sys.stderr,
        )
        return EXIT_OK if args.command == "config" else EXIT_FAILURE
    if args.command == "config":
        return await cmd_config(gateways, output)
    if args.command == "status":
        return await cmd_status(args, configs, client, cds)
    return await cmd_icetest(args, configs, cds.settings)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def body() -> int:
        spec = "all:DEBUG" if _option(args, "verbose", False) else _option(args, "log", "all:WARN")
        if not parse_log_spec(spec):
            raise BadInputError(f"invalid log spec {spec!r}: expected scope:LEVEL[,...]")
        logs.configure_logging("text", logging.WARNING)
        apply_log_spec(spec)
        if _option(args, "timeout", 5.0) <= 0:
            raise BadInputError("--timeout must be positive")
        ca = _option(args, "ca", None)
        if ca and not os.path.isfile(ca):
            raise BadInputError(f"CA file {ca!r} does not exist")
        return int(run_loop(run(args, load_settings())))

    return exit_status("stunnerctl", body, interrupted=EXIT_FAILURE)


if __name__ == "__main__":
    sys.exit(main())
