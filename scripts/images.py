"""Build the container images, with podman or docker, whichever is installed: `make images`.

    localhost/stunner-<name>:<version>   for stunnerd, cds, operator, turncat, auth (and redis,
                                         the compose stack's Redis)

No registry is needed. The base image is $BASE_IMAGE, else localhost/debian-py:bookworm when it
exists (`make base-image` builds it with mmdebstrap), else the Dockerfiles' default (a public
Python slim image). pip inside the build uses the host's package index: the host's `pip config`
(index-url, extra-index-url, find-links, cert) is handed to the build, and local index folders
are mounted read-only into it (podman; docker can only use network indexes).

A multi-stage build leaves its builder stages behind as untagged images, and a rebuild leaves
the image its tag pointed at before: every untagged image that was not there before `make
images` started is removed when it ends (those older than the run are left alone).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVICE_DOCKERFILE = "services/Dockerfile"
IMAGES = {
    "stunnerd": SERVICE_DOCKERFILE,
    "cds": SERVICE_DOCKERFILE,
    "operator": SERVICE_DOCKERFILE,
    "turncat": SERVICE_DOCKERFILE,
    "auth": SERVICE_DOCKERFILE,
    "redis": "deploy/redis/Dockerfile",
}
BUILD_ARGS = {
    "stunnerd": {
        "SERVICE": "stunnerd",
        "COMMAND": "stunnerd",
        "OFFLOAD": "yes",
        "RUNTIME_PACKAGES": "libbpf1",
    },
    "cds": {"SERVICE": "cds", "COMMAND": "stunner-cds"},
    "operator": {"SERVICE": "operator", "COMMAND": "stunner-operator"},
    "turncat": {"SERVICE": "turncat", "COMMAND": "turncat"},
    "auth": {"SERVICE": "auth", "COMMAND": "stunner-auth"},
}
"""What services/Dockerfile builds for each Python service: its folder, its command (the
entrypoint), and for stunnerd the offload object and libbpf."""
LOCAL_BASE = "localhost/debian-py:bookworm"
PIP_KEYS = ("index-url", "extra-index-url", "find-links", "trusted-host", "cert")
CONTAINERS_CONF = ROOT / "deploy" / "containers.conf"


def version() -> str:
    project = tomllib.loads((ROOT / "libs" / "common" / "pyproject.toml").read_text())["project"]
    return str(project["version"])


def image_name(name: str, tag: str | None = None) -> str:
    return f"localhost/stunner-{name}:{tag or version()}"


def engine() -> str:
    """podman or docker ($CONTAINER_ENGINE wins); exits with a message when neither exists."""
    for candidate in filter(None, (os.environ.get("CONTAINER_ENGINE"), "podman", "docker")):
        if shutil.which(candidate):
            return candidate
    raise SystemExit("make images: neither podman nor docker is installed")


def engine_env(eng: str) -> dict[str, str]:
    """podman on hosts where crun cannot run containers: runc and fixed ulimits (see the file)."""
    env = dict(os.environ)
    if (
        Path(eng).name == "podman"
        and "CONTAINERS_CONF" not in env
        and Path("/usr/sbin/runc").exists()
    ):
        env["CONTAINERS_CONF"] = str(CONTAINERS_CONF)
    return env


def host_pip_config() -> dict[str, str]:
    """The host's effective pip settings among PIP_KEYS (later scopes win, as in pip)."""
    out = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    found: dict[str, str] = {}
    for line in out.splitlines():
        match = re.match(r"^[^.]*\.([a-z-]+)='(.*)'$", line.strip())
        if match and match.group(1) in PIP_KEYS:
            found[match.group(1)] = match.group(2)
    return found


def local_paths(settings: dict[str, str]) -> list[str]:
    """Folders and files the pip settings name on this machine (to mount into the build)."""
    paths = []
    for value in settings.values():
        for token in value.split():
            path = Path(token.removeprefix("file://"))
            if path.is_absolute() and path.exists():
                # A file index's pages link to files beside its simple/ folder.
                paths.append(str(path.parent if path.name == "simple" else path))
    return sorted(set(paths))


def pip_conf(settings: dict[str, str]) -> str:
    return "[global]\n" + "".join(f"{key} = {value}\n" for key, value in settings.items())


def base_image(eng: str) -> str | None:
    if os.environ.get("BASE_IMAGE"):
        return os.environ["BASE_IMAGE"]
    found = subprocess.run(
        [eng, "image", "inspect", LOCAL_BASE], capture_output=True, env=engine_env(eng), check=False
    )
    return LOCAL_BASE if found.returncode == 0 else None


def dangling(eng: str, env: dict[str, str]) -> set[str]:
    """The ids of the untagged ("dangling") images now."""
    out = subprocess.run(
        [eng, "images", "-q", "--no-trunc", "--filter", "dangling=true"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    ).stdout
    return {line.strip() for line in out.splitlines() if line.strip()}


def remove_intermediates(eng: str, env: dict[str, str], before: set[str]) -> list[str]:
    """Remove the untagged images this run left (not those that were there before it)."""
    left = sorted(dangling(eng, env) - before)
    removed = []
    for image in left:
        result = subprocess.run([eng, "rmi", image], capture_output=True, env=env, check=False)
        if result.returncode == 0:
            removed.append(image)
    if removed:
        print(f"removed {len(removed)} untagged intermediate image(s)")
    return removed


def build(names: list[str], tag: str | None = None) -> list[str]:
    eng = engine()
    env = engine_env(eng)
    before = dangling(eng, env)
    try:
        return _build(eng, env, names, tag)
    finally:
        remove_intermediates(eng, env, before)


def _build(eng: str, env: dict[str, str], names: list[str], tag: str | None) -> list[str]:
    settings = host_pip_config()
    mounts = local_paths(settings)
    base = base_image(eng)
    built = []
    for name in names:
        argv = [eng, "build", "--network", "host", "-f", IMAGES[name], "-t", image_name(name, tag)]
        if base:
            argv += ["--build-arg", f"BASE_IMAGE={base}"]
        argv += ["--build-arg", f"PIP_CONF={pip_conf(settings)}"]
        for key, value in BUILD_ARGS.get(name, {}).items():
            argv += ["--build-arg", f"{key}={value}"]
        if Path(eng).name == "podman":
            argv += [arg for path in mounts for arg in ("-v", f"{path}:{path}:ro")]
        elif mounts:
            print(f"note: docker cannot mount {', '.join(mounts)} into builds", file=sys.stderr)
        argv.append(str(ROOT))
        print(f"building {image_name(name, tag)} ({IMAGES[name]}, base {base or 'default'})")
        result = subprocess.run(argv, cwd=ROOT, env=env, check=False)
        if result.returncode != 0:
            raise SystemExit(f"make images: building {name} failed (exit {result.returncode})")
        built.append(image_name(name, tag))
    return built


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("names", nargs="*", help=f"any of {', '.join(IMAGES)} (default: all)")
    parser.add_argument("--tag", help="image tag (default: the packages' version)")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(IMAGES))
    if unknown:
        parser.error(f"unknown image(s) {', '.join(unknown)}; known: {', '.join(IMAGES)}")
    for image in build(args.names or list(IMAGES), args.tag):
        print(f"built {image}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
