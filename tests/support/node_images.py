"""Images for the one-node cluster's containerd, none from a registry.

The machine reaches no registry, so the sandbox ("pause") image is made here: a static Go
program that waits for SIGTERM, built with support.gobin and packed as a one-layer docker-archive
tarball. Our own images (``make images``: localhost/stunner-*) go from podman's store to
containerd's ``k8s.io`` namespace with ``podman save`` and ``ctr images import``.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import tomllib
from pathlib import Path

from support import gobin

PAUSE_IMAGE = "localhost/stunner-node-pause:1"

PAUSE_GO = """\
// The sandbox of a pod: holds its namespaces until the runtime stops it.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	<-stop
}
"""


class ImageError(RuntimeError):
    """An image could not be had or imported; the message says which and why."""


UDP_ECHO_IMAGE = "localhost/stunner-node-udp-echo:1"
UDP_ECHO_PORT = 9001

UDP_ECHO_GO = """\
// A UDP echo server: every datagram goes back to its sender as it came.
package main

import (
	"net"
	"os"
)

func main() {
	addr := ":9001"
	if len(os.Args) > 1 {
		addr = os.Args[1]
	}
	conn, err := net.ListenPacket("udp", addr)
	if err != nil {
		panic(err)
	}
	buf := make([]byte, 65536)
	for {
		n, from, err := conn.ReadFrom(buf)
		if err == nil {
			conn.WriteTo(buf[:n], from)
		}
	}
}
"""


def _go_program(name: str, source_text: str) -> Path:
    source = gobin.cache_root() / f"src-node-{name}"
    (source / name).mkdir(parents=True, exist_ok=True)
    if not (source / "go.mod").exists():
        (source / "go.mod").write_text(f"module stunner.test/{name}\n\ngo 1.22\n")
    (source / name / "main.go").write_text(source_text)
    return gobin.build_local(source, [f"./{name}"]) / name


def pause_binary() -> Path:
    return _go_program("pause", PAUSE_GO)


def _tar_member(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    tar.addfile(info, io.BytesIO(data))


def pause_archive(target: Path, tag: str = PAUSE_IMAGE) -> Path:
    """A docker-archive tarball of the pause image (entrypoint /pause, uid 65535)."""
    return _one_binary_archive(target, tag, "pause", pause_binary())


def udp_echo_archive(target: Path, tag: str = UDP_ECHO_IMAGE) -> Path:
    """The media server of upstream's udp-echo walkthrough (its ``l7mp/net-debug`` image needs
    a registry): a static Go UDP echo on port 9001, entrypoint /udp-echo, uid 65535."""
    return _one_binary_archive(target, tag, "udp-echo", _go_program("udp-echo", UDP_ECHO_GO))


def _one_binary_archive(target: Path, tag: str, name: str, binary: Path) -> Path:
    layer_buf = io.BytesIO()
    with tarfile.open(fileobj=layer_buf, mode="w") as layer:
        _tar_member(layer, name, binary.read_bytes(), 0o755)
    layer_bytes = layer_buf.getvalue()
    diff_id = hashlib.sha256(layer_bytes).hexdigest()
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": [f"/{name}"], "User": "65535:65535"},
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{diff_id}"]},
        }
    ).encode()
    config_id = hashlib.sha256(config).hexdigest()
    manifest = json.dumps(
        [{"Config": f"{config_id}.json", "RepoTags": [tag], "Layers": [f"{diff_id}/layer.tar"]}]
    ).encode()
    with tarfile.open(target, mode="w") as out:
        _tar_member(out, f"{diff_id}/layer.tar", layer_bytes)
        _tar_member(out, f"{config_id}.json", config)
        _tar_member(out, "manifest.json", manifest)
    return target


def ctr_import(socket: Path, archive: Path) -> str:
    done = subprocess.run(
        ["ctr", "-a", str(socket), "-n", "k8s.io", "images", "import", str(archive)],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    if done.returncode != 0:
        raise ImageError(f"ctr images import {archive}: {done.stderr.strip()}")
    return done.stdout


def podman_image_exists(ref: str) -> bool:
    if shutil.which("podman") is None:
        return False
    return subprocess.run(["podman", "image", "exists", ref], check=False).returncode == 0


def import_podman_image(socket: Path, ref: str, workdir: Path) -> None:
    """``podman save`` an image (e.g. localhost/stunner-stunnerd:VERSION) into containerd."""
    if not podman_image_exists(ref):
        raise ImageError(f"podman has no image {ref} (make base-image && make images)")
    archive = workdir / (ref.replace("/", "_").replace(":", "_") + ".tar")
    done = subprocess.run(
        ["podman", "save", "--format", "docker-archive", "-o", str(archive), ref],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    if done.returncode != 0:
        raise ImageError(f"podman save {ref}: {done.stderr.strip()}")
    try:
        ctr_import(socket, archive)
    finally:
        archive.unlink(missing_ok=True)


def stunnerd_image() -> str:
    """The image ``make images`` tags for stunnerd (``STUNNER_NODE_STUNNERD_IMAGE`` overrides)."""
    override = os.environ.get("STUNNER_NODE_STUNNERD_IMAGE")
    if override:
        return override
    project = tomllib.loads((gobin.REPO / "libs" / "common" / "pyproject.toml").read_text())
    return f"localhost/stunner-stunnerd:{project['project']['version']}"


HELM_IMAGES = ("stunnerd", "cds", "operator", "auth", "turncat", "redis")
"""What `helm install` of charts/stunner runs with its default values, plus `helm test`'s
turncat: ``scripts/images.py stunnerd cds operator auth turncat redis`` builds them."""

REDIS_SERVER_CONTAINERFILE = """\
# The chart's Redis container passes redis-server's own flags (--aclfile from its Secret, --dir,
# --appendonly) as args, as redis:7-alpine's entrypoint takes them; stunner-redis's entrypoint
# writes an ACL of its own into /secrets first, which the chart's read-only root and uid 999
# refuse. Same image, redis-server as the entrypoint.
FROM {base}
ENTRYPOINT ["redis-server"]
"""


def stunner_version() -> str:
    project = tomllib.loads((gobin.REPO / "libs" / "common" / "pyproject.toml").read_text())
    return str(project["project"]["version"])


def stunner_image(name: str) -> str:
    """``localhost/stunner-<name>:<version>``, as scripts/images.py tags it."""
    if name == "stunnerd":
        return stunnerd_image()
    return f"localhost/stunner-{name}:{stunner_version()}"


def missing_images(names: tuple[str, ...] = HELM_IMAGES) -> list[str]:
    return [stunner_image(n) for n in names if not podman_image_exists(stunner_image(n))]


def redis_server_image() -> str:
    """``localhost/stunner-redis-server:<version>``: stunner-redis with redis-server as its
    entrypoint (see REDIS_SERVER_CONTAINERFILE), built from it with podman when missing or when
    stunner-redis was rebuilt since (the image carries its base's ID as a label)."""
    ref = f"localhost/stunner-redis-server:{stunner_version()}"
    base = stunner_image("redis")
    if not podman_image_exists(base):
        raise ImageError(f"podman has no image {base} (scripts/images.py redis)")
    base_id = _podman_inspect(base, "{{.Id}}")
    built_from = _podman_inspect(ref, '{{index .Labels "' + BASE_LABEL + '"}}')
    if podman_image_exists(ref) and built_from == base_id:
        return ref
    done = subprocess.run(
        [
            "podman",
            "build",
            "--pull=never",
            "--label",
            f"{BASE_LABEL}={base_id}",
            "-t",
            ref,
            "-f",
            "-",
            str(gobin.REPO / "deploy"),
        ],
        input=REDIS_SERVER_CONTAINERFILE.format(base=base),
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        env=_podman_env(),
    )
    if done.returncode != 0:
        raise ImageError(f"podman build {ref}: {(done.stdout + done.stderr).strip()[-2000:]}")
    return ref


BASE_LABEL = "io.l7mp.stunner.base-id"


def _podman_inspect(ref: str, template: str) -> str:
    done = subprocess.run(
        ["podman", "image", "inspect", "--format", template, ref],
        capture_output=True,
        text=True,
        check=False,
        env=_podman_env(),
    )
    return done.stdout.strip() if done.returncode == 0 else ""


def _podman_env() -> dict[str, str]:
    """As the Makefile runs podman: deploy/containers.conf where the system's runc is used."""
    env = dict(os.environ)
    if Path("/usr/sbin/runc").exists():
        env.setdefault("CONTAINERS_CONF", str(gobin.REPO / "deploy" / "containers.conf"))
    return env
