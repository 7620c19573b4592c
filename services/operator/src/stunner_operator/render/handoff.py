"""The hot handoff between stunnerd pods on one node (the Dataplane's ``handoff``, our field).

A DaemonSet on the host network with a surge rollout starts the new pod on the node beside the
old one; the two find each other through a Unix socket in a hostPath directory, and the new
stunnerd takes over the old one's sockets and allocations (services/stunnerd/README.md, "Hot
handoff"). The old one then idles until its pod is deleted, so its container is not restarted.

stunnerd accepts a peer only under its own uid, and only in a directory no other user may write:
both pods run as one uid, and a root init container (the same image) makes the host directory
that uid's, mode 0700; a hostPath volume is not subject to ``fsGroup``.
"""

from __future__ import annotations

from typing import Any

from stunner_common.crds import Dataplane

HANDOFF_DIR = "/var/run/stunner"
HANDOFF_VOLUME = "stunner-handoff"
HANDOFF_INIT_CONTAINER = "handoff-dir"
IMAGE_UID = 10001  # services/Dockerfile: the image runs as 10001:10001
HANDOFF_MIN_READY_S = 10
"""How long the new pod must be Ready before the DaemonSet controller deletes the old one.

On the host network the kubelet probes the node's health port, which the old stunnerd serves
until it hands its sockets over: the new pod reads Ready at once, before the handoff. The
handoff takes one to a few seconds (services/stunnerd/README.md); this leaves it the time.
"""


def handoff_enabled(dataplane: Dataplane, kind: str) -> bool:
    """Asked for, and possible: a DaemonSet on the host network."""
    dp = dataplane.spec
    return dp.handoff and kind == "DaemonSet" and dp.host_network


def handoff_problems(dataplane: Dataplane, kind: str) -> list[str]:
    """What a ``handoff`` that cannot be rendered lacks (the workload is rendered without it)."""
    dp = dataplane.spec
    if not dp.handoff or handoff_enabled(dataplane, kind):
        return []
    return [
        f"Dataplane {dataplane.metadata.name}: handoff needs dataplaneResource: DaemonSet and "
        "hostNetwork: true (the new pod must start on the old one's node, in its network); "
        "rendering without handoff"
    ]


def handoff_socket(namespace: str, name: str) -> str:
    """The Gateway's socket on the node: one directory, one socket per Gateway."""
    return f"{HANDOFF_DIR}/{namespace}_{name}.sock"


def handoff_env(namespace: str, name: str) -> list[dict[str, Any]]:
    return [
        {"name": "STUNNERD_HANDOFF_SOCKET", "value": handoff_socket(namespace, name)},
        {"name": "STUNNERD_HANDOFF_IDLE", "value": "true"},
    ]


def handoff_ids(dataplane: Dataplane) -> tuple[int, int]:
    """The uid and gid stunnerd runs as: the Dataplane's security contexts, else the image's."""
    dp = dataplane.spec
    contexts = (dp.container_security_context or {}, dp.security_context or {})
    uid = next((c["runAsUser"] for c in contexts if c.get("runAsUser") is not None), IMAGE_UID)
    gid = next((c["runAsGroup"] for c in contexts if c.get("runAsGroup") is not None), uid)
    return int(uid), int(gid)


def handoff_dir_command(uid: int, gid: int, path: str = HANDOFF_DIR) -> list[str]:
    """The init container's command: the handoff folder on the host, owned by stunnerd's user,
    mode 0700. It runs in the stunnerd image, so it uses the interpreter every stunnerd image
    has: the runtime base has no coreutils (scripts/slim_rootfs.sh), and its busybox has no
    ``install``."""
    code = (
        "import os, sys; d, u, g = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]); "
        "os.makedirs(d, exist_ok=True); os.chown(d, u, g); os.chmod(d, 0o700)"
    )
    return ["python3", "-c", code, path, str(uid), str(gid)]


def add_handoff(pod_spec: dict[str, Any], dataplane: Dataplane) -> None:
    """The hostPath directory, its init container and the stunnerd container's uid.

    The pod declares no container ports: on the host network every declared port becomes a host
    port, and the scheduler keeps a pod off a node where another pod holds one of its host
    ports, so the surge pod would never start beside the old one.
    """
    uid, gid = handoff_ids(dataplane)
    mount = {"name": HANDOFF_VOLUME, "mountPath": HANDOFF_DIR}
    container = pod_spec["containers"][0]
    container.pop("ports", None)
    container["volumeMounts"] = [*container.get("volumeMounts", ()), mount]
    container["securityContext"] = {
        "runAsUser": uid,
        "runAsGroup": gid,
        "runAsNonRoot": True,
        **(container.get("securityContext") or {}),
    }
    pod_spec["initContainers"] = [
        {
            "name": HANDOFF_INIT_CONTAINER,
            "image": container["image"],
            "imagePullPolicy": container["imagePullPolicy"],
            "command": handoff_dir_command(uid, gid),
            "securityContext": {"runAsUser": 0, "runAsGroup": 0, "runAsNonRoot": False},
            "volumeMounts": [dict(mount)],
        }
    ]
    pod_spec["volumes"] = [
        {"name": HANDOFF_VOLUME, "hostPath": {"path": HANDOFF_DIR, "type": "DirectoryOrCreate"}}
    ]
