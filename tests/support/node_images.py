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


def pause_binary() -> Path:
    source = gobin.cache_root() / "src-node-pause"
    (source / "pause").mkdir(parents=True, exist_ok=True)
    if not (source / "go.mod").exists():
        (source / "go.mod").write_text("module stunner.test/pause\n\ngo 1.22\n")
    (source / "pause" / "main.go").write_text(PAUSE_GO)
    return gobin.build_local(source, ["./pause"]) / "pause"


def _tar_member(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    tar.addfile(info, io.BytesIO(data))


def pause_archive(target: Path, tag: str = PAUSE_IMAGE) -> Path:
    """A docker-archive tarball of the pause image (entrypoint /pause, uid 65535)."""
    layer_buf = io.BytesIO()
    with tarfile.open(fileobj=layer_buf, mode="w") as layer:
        _tar_member(layer, "pause", pause_binary().read_bytes(), 0o755)
    layer_bytes = layer_buf.getvalue()
    diff_id = hashlib.sha256(layer_bytes).hexdigest()
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": ["/pause"], "User": "65535:65535"},
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
