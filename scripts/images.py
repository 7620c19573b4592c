"""Build the container images, with podman or docker, whichever is installed: `make images`.

    localhost/stunner-<name>:<version>   for stunnerd, cds, operator, turncat, auth (and redis,
                                         the compose stack's Redis)

No registry is needed. The build stages run on $BASE_IMAGE, else localhost/debian-py:bookworm when
it exists, else the Dockerfiles' default (a public Python slim image); the images are made of
$RUNTIME_IMAGE, else localhost/debian-py-slim:bookworm when it and the local build base exist,
else the build base (`make base-image` builds both local ones with mmdebstrap). At the end it
prints each image's size; one over SIZE_BUDGET_MB (as `podman images` counts: 10^6 bytes) is
marked. pip inside the build uses the host's package index: the host's `pip config`
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
        "RUNTIME_PACKAGES": "libbpf1 libelf1",
        "BUILD_PACKAGES": "gcc libc6-dev python3-dev",
    },
    "cds": {"SERVICE": "cds", "COMMAND": "stunner-cds"},
    "operator": {"SERVICE": "operator", "COMMAND": "stunner-operator"},
    "turncat": {"SERVICE": "turncat", "COMMAND": "turncat"},
    "auth": {"SERVICE": "auth", "COMMAND": "stunner-auth"},
}
"""What services/Dockerfile builds for each Python service: its folder, its command (the
entrypoint), and for stunnerd the offload object, libbpf (with libelf, which the runtime image
lacks) and the compiler and headers its C relay is built with (in the build stage only)."""
LOCAL_BASE = "localhost/debian-py:bookworm"
LOCAL_RUNTIME = "localhost/debian-py-slim:bookworm"
SIZE_BUDGET_MB = 150
"""The most an image may weigh: upstream ships one static Go binary per image, and every node
pulls each of them."""
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


def image_exists(eng: str, ref: str) -> bool:
    found = subprocess.run(
        [eng, "image", "inspect", ref], capture_output=True, env=engine_env(eng), check=False
    )
    return found.returncode == 0


def base_image(eng: str) -> str | None:
    if os.environ.get("BASE_IMAGE"):
        return os.environ["BASE_IMAGE"]
    return LOCAL_BASE if image_exists(eng, LOCAL_BASE) else None


def runtime_image(eng: str, base: str | None) -> str | None:
    """What the final stages start from; None: the build base (the Dockerfiles' default)."""
    if os.environ.get("RUNTIME_IMAGE"):
        return os.environ["RUNTIME_IMAGE"]
    if base == LOCAL_BASE and image_exists(eng, LOCAL_RUNTIME):
        return LOCAL_RUNTIME
    if base == LOCAL_BASE:
        print(f"note: no {LOCAL_RUNTIME} (make base-image): the images are made of {base}")
    return None


def image_size(eng: str, env: dict[str, str], ref: str) -> int | None:
    """The image's size in bytes, as `podman images` shows it (None where the engine says none)."""
    out = subprocess.run(
        [eng, "image", "inspect", "--format", "{{.Size}}", ref],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    try:
        return int(out.stdout.strip()) if out.returncode == 0 else None
    except ValueError:
        return None


def size_table(sizes: dict[str, int | None], budget_mb: int = SIZE_BUDGET_MB) -> str:
    """One line per image: its name and size in MB (10^6 bytes), marked when over the budget."""
    width = max(len("image"), *(len(ref) for ref in sizes))
    lines = [f"{'image':<{width}}  {'size':>8}"]
    for ref, size in sizes.items():
        if size is None:
            lines.append(f"{ref:<{width}}  {'?':>8}")
            continue
        megabytes = size / 1e6
        over = f"  over the {budget_mb} MB budget" if megabytes > budget_mb else ""
        lines.append(f"{ref:<{width}}  {megabytes:>5.1f} MB{over}")
    return "\n".join(lines)


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
    runtime = runtime_image(eng, base)
    built = []
    for name in names:
        argv = [eng, "build", "--network", "host", "-f", IMAGES[name], "-t", image_name(name, tag)]
        if base:
            argv += ["--build-arg", f"BASE_IMAGE={base}"]
        if runtime:
            argv += ["--build-arg", f"RUNTIME_IMAGE={runtime}"]
        argv += ["--build-arg", f"PIP_CONF={pip_conf(settings)}"]
        for key, value in BUILD_ARGS.get(name, {}).items():
            argv += ["--build-arg", f"{key}={value}"]
        if Path(eng).name == "podman":
            argv += [arg for path in mounts for arg in ("-v", f"{path}:{path}:ro")]
        elif mounts:
            print(f"note: docker cannot mount {', '.join(mounts)} into builds", file=sys.stderr)
        argv.append(str(ROOT))
        print(
            f"building {image_name(name, tag)} ({IMAGES[name]}, base {base or 'default'}, "
            f"runtime {runtime or base or 'default'})"
        )
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
    built = build(args.names or list(IMAGES), args.tag)
    for image in built:
        print(f"built {image}")
    eng = engine()
    env = engine_env(eng)
    print(size_table({image: image_size(eng, env, image) for image in built}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
