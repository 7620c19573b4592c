"""Go programs the tests run as peers and infrastructure, built once per machine.

The real kube-apiserver, controller manager, scheduler, kubelet and kube-proxy (tests/kube, our
wrapper module around k8s.io/kubernetes, stamped with its release version), CoreDNS and upstream
STUNner's stunnerd, turncat, stunnerctl and operator are built from pinned module versions into a
cache outside the work tree (``STUNNER_TEST_GO_CACHE``, default ``~/.cache/stunner-test-go``), one
folder per build key (what was built, at which version, with which Go). A file lock makes
concurrent test processes wait for one build instead of racing it. Only Go programs for tests live
here: the product itself is Python.

Where Go is absent, ``require_go()`` skips the test with the reason, except under ``CI=true``,
where a missing toolchain fails it: CI must run these tests, not skip them.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
KUBE_MODULE = REPO / "tests" / "kube"

# Upstream STUNner, pinned: v1.2.x installs with `go install` (no replace directives).
UPSTREAM_STUNNER = "github.com/l7mp/stunner"
UPSTREAM_STUNNER_VERSION = "v1.2.1"
UPSTREAM_OPERATOR = "github.com/l7mp/stunner-gateway-operator"
UPSTREAM_OPERATOR_VERSION = "v1.2.1"

BUILD_TIMEOUT_S = 1800.0


class GoBuildError(RuntimeError):
    """A Go build failed; the message carries the tail of the go command's output."""


class UnobtainableSourceError(GoBuildError):
    """The module's source cannot be had on this machine at all: the module proxy refuses it
    and no local clone is known. Not a build failure: tests skip saying so, under CI too."""


def cache_root() -> Path:
    return Path(os.environ.get("STUNNER_TEST_GO_CACHE", Path.home() / ".cache" / "stunner-test-go"))


def go_binary() -> str | None:
    return shutil.which("go")


def require_go() -> str:
    """The go command, or skip (fail under CI=true) with the reason."""
    go = go_binary()
    if go:
        return go
    reason = "the Go toolchain is not installed: the Go test peers cannot be built"
    if os.environ.get("CI") == "true":
        pytest.fail(reason + " (CI must run these tests)")
    pytest.skip(reason)


def _go_version(go: str) -> str:
    return subprocess.run(
        [go, "env", "GOVERSION"], capture_output=True, text=True, check=True
    ).stdout.strip()


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _run_go(go: str, args: Sequence[str], *, cwd: Path, env: dict[str, str]) -> None:
    started = time.monotonic()
    done = subprocess.run(
        [go, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        tail = (done.stdout + done.stderr)[-4000:]
        raise GoBuildError(f"go {' '.join(args)} failed (exit {done.returncode}):\n{tail}")
    _record_build_time(args, time.monotonic() - started)


def _record_build_time(args: Sequence[str], seconds: float) -> None:
    log = cache_root() / "build-times.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as handle:
        handle.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {seconds:.0f}s go {' '.join(args)}\n")


def _ready(folder: Path, names: Sequence[str]) -> bool:
    return (folder / ".complete").exists() and all((folder / n).exists() for n in names)


def _build_env(go: str, extra: dict[str, str] | None) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("GOFLAGS", "-mod=mod")
    env.setdefault("CGO_ENABLED", "0")
    if extra:
        env.update(extra)
    return env


def install(module: str, version: str, packages: Sequence[str]) -> Path:
    """Build ``<module>/<pkg>`` at ``version`` for each package; returns the folder of binaries.

    ``packages`` are paths inside the module ("" for the module root, "cmd/stunnerd", ...).

    Not ``go install pkg@version``: that reads the module's version list (``@v/list``) to check
    for a deprecation notice, and a proxy that serves only pinned versions answers it 403. A
    throwaway wrapper module instead pins the version with ``go get -tool`` (the module's own
    go.mod decides every dependency, as ``go install`` would) and ``go install tool`` builds.
    """
    go = require_go()
    key = f"{module.replace('/', '_')}@{version}-{_go_version(go)}"
    folder = cache_root() / key
    names = [Path(p).name if p else Path(module).name for p in packages]
    if _ready(folder, names):
        return folder
    with _locked(cache_root() / f"{key}.lock"):
        if _ready(folder, names):
            return folder
        wrapper = folder / "wrapper"
        shutil.rmtree(wrapper, ignore_errors=True)
        wrapper.mkdir(parents=True)
        (wrapper / "go.mod").write_text("module gobin.local/wrapper\n")
        env = _build_env(go, {"GOBIN": str(folder)})
        targets = [f"{module}/{p}@{version}" if p else f"{module}@{version}" for p in packages]
        _run_go(go, ["get", "-tool", *targets], cwd=wrapper, env=env)
        _run_go(go, ["install", "tool"], cwd=wrapper, env=env)
        (folder / ".complete").write_text(" ".join(targets) + "\n")
    return folder


def build_local(
    module_dir: Path,
    packages: Sequence[str],
    *,
    ldflags: str = "",
    tools: Sequence[str] = (),
) -> Path:
    """`go build` packages of one of our own test modules (e.g. tests/kube) into the cache.

    The key hashes the module's go.mod, go.sum and sources, the ``ldflags`` and the ``tools``, so
    an edit rebuilds. ``tools`` (``pkg@version``) are packages the module does not list: they are
    added with ``go get -tool`` to a copy of the module in the cache, which is built instead, so
    the checked-in go.mod stays as it is (the versions come from the module graph it pins; only
    the go.sum lines of modules those packages need more are fetched, checked against the
    checksum database).
    """
    go = require_go()
    digest = hashlib.sha256()
    for path in _module_files(module_dir):
        digest.update(str(path.relative_to(module_dir)).encode())
        digest.update(path.read_bytes())
    digest.update(ldflags.encode())
    digest.update("\n".join(tools).encode())
    key = f"{module_dir.name}-{digest.hexdigest()[:16]}-{_go_version(go)}"
    folder = cache_root() / key
    names = [Path(p).name for p in packages]
    if _ready(folder, names):
        return folder
    with _locked(cache_root() / f"{key}.lock"):
        if _ready(folder, names):
            return folder
        folder.mkdir(parents=True, exist_ok=True)
        env = _build_env(go, None)
        source = module_dir
        if tools:
            source = folder / "src"
            shutil.rmtree(source, ignore_errors=True)
            for path in _module_files(module_dir):
                target = source / path.relative_to(module_dir)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, target)
            _run_go(go, ["get", "-tool", *tools], cwd=source, env=env)
        flags = ["-ldflags", ldflags] if ldflags else []
        _run_go(go, ["build", *flags, "-o", str(folder) + os.sep, *packages], cwd=source, env=env)
        (folder / ".complete").write_text(" ".join([*packages, *tools]) + "\n")
    return folder


def _module_files(module_dir: Path) -> list[Path]:
    return sorted(
        p
        for p in module_dir.rglob("*")
        if p.is_file() and (p.suffix == ".go" or p.name in {"go.mod", "go.sum"})
    )


def upstream_stunner() -> Path:
    """Upstream stunnerd, turncat and stunnerctl at the pinned version."""
    return install(
        UPSTREAM_STUNNER,
        UPSTREAM_STUNNER_VERSION,
        ["cmd/stunnerd", "cmd/turncat", "cmd/stunnerctl"],
    )


# The operator's module is not on every proxy (one that serves only allowed modules answers its
# versions 403): then it is built from a git clone of its repository at the tag's commit, pinned
# here so that a moved tag is noticed. STUNNER_UPSTREAM_OPERATOR_GIT names the clone (a git
# directory, bare or not); there is no default location.
UPSTREAM_OPERATOR_COMMIT = "a7f6a3efcde2e9c8feca250f6cff6515333838cd"


def upstream_operator() -> Path:
    """Upstream stunner-gateway-operator at the pinned version (binary: stunner-gateway-operator).

    From the module proxy where it serves the module, else from a git clone (see
    ``upstream_operator_source``); either way the module's own go.mod and go.sum pin every
    dependency.
    """
    try:
        return install(UPSTREAM_OPERATOR, UPSTREAM_OPERATOR_VERSION, [""])
    except GoBuildError as exc:
        if "403" not in str(exc) and "not available" not in str(exc):
            raise
    source = upstream_operator_source()
    go = require_go()
    key = f"{UPSTREAM_OPERATOR.replace('/', '_')}@{UPSTREAM_OPERATOR_VERSION}-git-{_go_version(go)}"
    folder = cache_root() / key
    name = Path(UPSTREAM_OPERATOR).name
    if _ready(folder, [name]):
        return folder
    with _locked(cache_root() / f"{key}.lock"):
        if not _ready(folder, [name]):
            folder.mkdir(parents=True, exist_ok=True)
            _run_go(
                go, ["build", "-o", str(folder) + os.sep, "."], cwd=source, env=_build_env(go, None)
            )
            (folder / ".complete").write_text(f"{UPSTREAM_OPERATOR}@{UPSTREAM_OPERATOR_COMMIT}\n")
    return folder


def upstream_operator_source() -> Path:
    """The operator's source tree at the pinned version (its CRDs are in config/crd/bases).

    The module cache's copy where the proxy serves the module; otherwise ``git archive`` of the
    pinned commit from ``STUNNER_UPSTREAM_OPERATOR_GIT`` (or a known clone), extracted once into
    the cache. Raises ``GoBuildError`` saying where it looked when there is none.
    """
    with contextlib.suppress(GoBuildError):
        return module_dir(UPSTREAM_OPERATOR, UPSTREAM_OPERATOR_VERSION)
    target = cache_root() / f"src-stunner-gateway-operator@{UPSTREAM_OPERATOR_COMMIT[:12]}"
    if (target / ".complete").exists():
        return target
    env_git = os.environ.get("STUNNER_UPSTREAM_OPERATOR_GIT")
    candidates = [env_git] if env_git else []
    for git_dir in candidates:
        if not git_dir or not Path(git_dir).exists():
            continue
        rev = subprocess.run(
            ["git", "--git-dir", git_dir, "rev-parse", f"{UPSTREAM_OPERATOR_VERSION}^{{commit}}"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        if rev != UPSTREAM_OPERATOR_COMMIT:
            raise GoBuildError(
                f"{git_dir}: tag {UPSTREAM_OPERATOR_VERSION} is {rev or 'missing'}, "
                f"pinned {UPSTREAM_OPERATOR_COMMIT}"
            )
        with _locked(cache_root() / "src-stunner-gateway-operator.lock"):
            if not (target / ".complete").exists():
                shutil.rmtree(target, ignore_errors=True)
                target.mkdir(parents=True)
                archive = subprocess.run(
                    ["git", "--git-dir", git_dir, "archive", UPSTREAM_OPERATOR_COMMIT],
                    capture_output=True,
                    check=True,
                ).stdout
                subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
                (target / ".complete").write_text(UPSTREAM_OPERATOR_COMMIT + "\n")
        return target
    raise UnobtainableSourceError(
        f"{UPSTREAM_OPERATOR}@{UPSTREAM_OPERATOR_VERSION} is not on the module proxy and no git "
        "clone was given: set STUNNER_UPSTREAM_OPERATOR_GIT to a clone of "
        f"https://{UPSTREAM_OPERATOR} holding the tag {UPSTREAM_OPERATOR_VERSION}"
        + (f" ({env_git} does not exist)" if env_git else "")
    )


KUBE_PACKAGES = (
    "k8s.io/kubernetes/cmd/kube-apiserver",
    "k8s.io/kubernetes/cmd/kube-controller-manager",
    "./etcd",
)
NODE_PACKAGES = (
    "k8s.io/kubernetes/cmd/kubelet",
    "k8s.io/kubernetes/cmd/kube-proxy",
    "k8s.io/kubernetes/cmd/kube-scheduler",
)
# The two packages that carry a Kubernetes binary's version, stamped as upstream's
# hack/lib/version.sh does; unstamped, /version says v0.0.0-master+$Format:%H$, which a chart's
# kubeVersion constraint (and `helm install`) refuses.
VERSION_PACKAGES = ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")
BUILD_DATE = "2026-01-01T00:00:00Z"  # fixed: the same sources link to the same binary


def kube_version() -> str:
    """The k8s.io/kubernetes version tests/kube pins (e.g. ``v1.36.3``)."""
    found = re.search(r"^\s*k8s\.io/kubernetes (v\S+)", (KUBE_MODULE / "go.mod").read_text(), re.M)
    if found is None:
        raise GoBuildError(f"{KUBE_MODULE / 'go.mod'} requires no k8s.io/kubernetes")
    return found.group(1)


def kube_ldflags(version: str) -> str:
    """``-X`` flags that stamp ``version`` (``vMAJOR.MINOR.PATCH``) into a Kubernetes binary."""
    major, minor = version.removeprefix("v").split(".")[:2]
    values = {
        "gitVersion": version,
        "gitMajor": major,
        "gitMinor": minor,
        "gitTreeState": "clean",
        "buildDate": BUILD_DATE,
    }
    return " ".join(f"-X {pkg}.{k}={v}" for pkg in VERSION_PACKAGES for k, v in values.items())


def kube_binaries() -> Path:
    """kube-apiserver, kube-controller-manager and etcd from tests/kube, version-stamped."""
    return build_local(KUBE_MODULE, KUBE_PACKAGES, ldflags=kube_ldflags(kube_version()))


def node_binaries() -> Path:
    """kubelet, kube-proxy and kube-scheduler from tests/kube's k8s.io/kubernetes, stamped.

    tests/kube's go.mod lists the control plane's packages only; the node's need a few more
    go.sum lines (github.com/moby/ipvs, sigs.k8s.io/knftables, ...), added in a copy.
    """
    version = kube_version()
    return build_local(
        KUBE_MODULE,
        NODE_PACKAGES,
        ldflags=kube_ldflags(version),
        tools=[f"{p}@{version}" for p in NODE_PACKAGES],
    )


# kwok plays a kubelet for the pods of its simulated nodes, port-forward included (its
# PortForward resources name where a pod port really goes); go 1.26, no replace directives.
KWOK = "sigs.k8s.io/kwok"
KWOK_VERSION = "v0.8.0"


def kwok() -> Path:
    """kwok at the pinned version (binary: kwok)."""
    return install(KWOK, KWOK_VERSION, ["cmd/kwok"])


GATEWAY_API = "sigs.k8s.io/gateway-api"
GATEWAY_API_VERSION = "v1.6.3"


def module_dir(module: str, version: str) -> Path:
    """The source of a module version in the Go module cache (downloaded on first use)."""
    go = require_go()
    done = subprocess.run(
        [go, "mod", "download", "-json", f"{module}@{version}"],
        cwd=cache_root() if cache_root().is_dir() else Path.home(),
        env=_build_env(go, None),
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        raise GoBuildError(
            f"go mod download {module}@{version} failed:\n{done.stdout}{done.stderr}"
        )
    import json

    return Path(json.loads(done.stdout)["Dir"])


def gateway_api_release() -> list[Path]:
    """The official Gateway API release files at the pinned version: the standard channel (its
    CRDs and its safe-upgrades admission policy), with the experimental channel's UDPRoute
    (which serves v1alpha2 beside v1) in place of the standard one."""
    crd = module_dir(GATEWAY_API, GATEWAY_API_VERSION) / "config" / "crd"
    standard = sorted(
        p
        for p in (crd / "standard").glob("gateway.networking.k8s.io_*.yaml")
        if not p.name.endswith("_udproutes.yaml")
    )
    return [*standard, crd / "experimental" / "gateway.networking.k8s.io_udproutes.yaml"]


GATEWAY_API_CONFORMANCE = "sigs.k8s.io/gateway-api/conformance"


def gateway_api_conformance() -> Path:
    """The official Gateway API conformance suite at GATEWAY_API_VERSION, as a test binary
    (``conformance.test``: ``go test -c`` of the conformance module's root package).

    Since v1.6 the suite is its own module; a wrapper module requires it and the API module at
    the same version (the suite's go.mod replaces the API module with ``../``, which a
    dependency's go.mod cannot do), and ``go test -c`` builds the package's tests.
    """
    go = require_go()
    key = f"gateway-api-conformance@{GATEWAY_API_VERSION}-{_go_version(go)}"
    folder = cache_root() / key
    if _ready(folder, ["conformance.test"]):
        return folder
    with _locked(cache_root() / f"{key}.lock"):
        if _ready(folder, ["conformance.test"]):
            return folder
        wrapper = folder / "wrapper"
        shutil.rmtree(wrapper, ignore_errors=True)
        wrapper.mkdir(parents=True)
        (wrapper / "go.mod").write_text("module gobin.local/wrapper\n")
        env = _build_env(go, None)
        pins = [f"{GATEWAY_API_CONFORMANCE}@{GATEWAY_API_VERSION}"]
        pins.append(f"{GATEWAY_API}@{GATEWAY_API_VERSION}")
        _run_go(go, ["get", *pins], cwd=wrapper, env=env)
        target = str(folder / "conformance.test")
        _run_go(go, ["test", "-c", "-o", target, GATEWAY_API_CONFORMANCE], cwd=wrapper, env=env)
        (folder / ".complete").write_text(" ".join(pins) + "\n")
    return folder


HELM = "helm.sh/helm/v4"
HELM_VERSION = "v4.3.1"


def helm() -> Path:
    """The ``helm`` CLI (``helm.sh/helm/v4/cmd/helm``) at HELM_VERSION: the real node's client."""
    return install(HELM, HELM_VERSION, ["cmd/helm"])
