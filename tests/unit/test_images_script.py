"""`make images` (scripts/images.py) leaves no untagged images behind, prints
each image's size, and builds small images: the Dockerfiles' rules for that are checked here.

A fake engine on $CONTAINER_ENGINE records the calls: the untagged images that appear during the
run (builder stages, a rebuilt tag's old image) are removed, those from before are left alone,
even when a build fails.
"""

from __future__ import annotations

import importlib.util
import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]

FAKE_ENGINE = """#!{python}
import json, sys
from pathlib import Path
state = Path({state!r})
data = json.loads(state.read_text())
args = sys.argv[1:]
data["calls"].append(args)
code = 0
if args[:2] == ["image", "inspect"] and "--format" in args:
    print(data.get("size", 123_456_789))
elif args[:2] == ["image", "inspect"]:
    code = 1
elif args[0] == "build":
    data["dangling"].append("new-" + str(len(data["calls"])))
    code = 1 if data.get("fail") else 0
elif args[0] == "images":
    print("\\n".join(data["dangling"]))
elif args[0] == "rmi":
    data["dangling"].remove(args[1])
state.write_text(json.dumps(data))
sys.exit(code)
"""


def _images() -> ModuleType:
    spec = importlib.util.spec_from_file_location("images_script", ROOT / "scripts" / "images.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"calls": [], "dangling": ["old-1"]}))
    fake = tmp_path / "fake-engine"
    fake.write_text(FAKE_ENGINE.format(python=sys.executable, state=str(state)))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("CONTAINER_ENGINE", str(fake))
    return state


def test_the_untagged_images_a_build_leaves_are_removed(engine: Path) -> None:
    images = _images()
    built = images.build(["stunnerd", "cds"], "test")
    assert built == ["localhost/stunner-stunnerd:test", "localhost/stunner-cds:test"]
    data = json.loads(engine.read_text())
    assert data["dangling"] == ["old-1"], "what was there before stays; the run's own go"
    removed = [c[1] for c in data["calls"] if c[0] == "rmi"]
    assert len(removed) == 2
    assert all(r.startswith("new-") for r in removed)


def test_a_failed_build_still_cleans_up(engine: Path) -> None:
    data = json.loads(engine.read_text())
    engine.write_text(json.dumps({**data, "fail": True}))
    images = _images()
    with pytest.raises(SystemExit, match="building stunnerd failed"):
        images.build(["stunnerd"], "test")
    assert json.loads(engine.read_text())["dangling"] == ["old-1"]


def test_each_python_service_is_built_from_the_one_dockerfile_with_its_own_arguments(
    engine: Path,
) -> None:
    images = _images()
    images.build(["stunnerd", "cds", "redis"], "test")
    builds = [c for c in json.loads(engine.read_text())["calls"] if c[0] == "build"]

    def args_of(call: list[str]) -> dict[str, str]:
        pairs = [call[i + 1] for i, a in enumerate(call) if a == "--build-arg"]
        own = (p.split("=", 1) for p in pairs)
        return {k: v for k, v in own if k not in ("PIP_CONF", "BASE_IMAGE")}

    stunnerd, cds, redis = builds
    assert stunnerd[stunnerd.index("-f") + 1] == "services/Dockerfile"
    assert cds[cds.index("-f") + 1] == "services/Dockerfile"
    assert redis[redis.index("-f") + 1] == "deploy/redis/Dockerfile"
    assert args_of(stunnerd) == {
        "SERVICE": "stunnerd",
        "COMMAND": "stunnerd",
        "OFFLOAD": "yes",
        "RUNTIME_PACKAGES": "libbpf1 libelf1",
        # the C relay (an optional extension: without a compiler the image relays in Python)
        "BUILD_PACKAGES": "gcc libc6-dev python3-dev",
    }
    assert args_of(cds) == {"SERVICE": "cds", "COMMAND": "stunner-cds"}
    assert args_of(redis) == {}
    root = Path(__file__).resolve().parents[2]
    for name, args in images.BUILD_ARGS.items():
        assert (root / "services" / args["SERVICE"] / "pyproject.toml").is_file(), name


def test_make_images_ends_with_each_image_and_its_size(
    engine: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    images = _images()
    assert images.main(["cds", "redis", "--tag", "test"]) == 0
    out = capsys.readouterr().out.splitlines()
    table = out[out.index(next(line for line in out if line.startswith("image"))) :]
    assert table[1:] == [
        "localhost/stunner-cds:test    123.5 MB",
        "localhost/stunner-redis:test  123.5 MB",
    ]


def test_the_size_table_marks_an_image_over_the_budget() -> None:
    images = _images()
    table = images.size_table({"a": 150_000_000, "bb": 150_000_001, "c": None}, budget_mb=150)
    assert table.splitlines() == [
        "image      size",
        "a      150.0 MB",
        "bb     150.0 MB  over the 150 MB budget",
        "c             ?",
    ]


def _stages(dockerfile: str) -> list[str]:
    """The Dockerfile's stages, each from its FROM line on (continuation lines joined)."""
    text = (ROOT / dockerfile).read_text().replace("\\\n", " ")
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    stages: list[list[str]] = []
    for line in lines:
        if line.startswith("FROM "):
            stages.append([])
        if stages:
            stages[-1].append(line)
    return ["\n".join(stage) for stage in stages]


@pytest.mark.parametrize("dockerfile", ["services/Dockerfile", "deploy/redis/Dockerfile"])
def test_the_image_is_the_runtime_base_plus_a_pruned_environment(dockerfile: str) -> None:
    *builders, final = _stages(dockerfile)
    assert final.startswith("FROM ${RUNTIME_IMAGE}\n")
    assert "\nRUN " not in final, "the runtime base has no package manager and no coreutils"
    assert "COPY --from=build /opt/stunner /opt/stunner" in final
    assert "USER 10001:10001" in final
    build = next(stage for stage in builders if " AS build" in stage.splitlines()[0])
    for rule in (
        "pip uninstall --yes --quiet setuptools",
        "pip uninstall --yes --quiet pip",
        "-name '*.pyi' -delete",
        "-type d -name tests -exec rm -rf",
        "strip --strip-unneeded",
        "compileall -q -j 0 --invalidation-mode unchecked-hash",
    ):
        assert rule in build, rule
    # The bytecode is compiled after everything is removed (no stale __pycache__ of a removed
    # module), and the sources stay for the tracebacks.
    assert build.index("compileall") > build.index("strip --strip-unneeded")
    assert "*.py'" not in build.replace("*.pyi'", "")


def test_the_runtime_base_keeps_no_package_tool_and_the_wrappers_commands() -> None:
    hook = (ROOT / "scripts" / "slim_rootfs.sh").read_text()
    keep = hook.split('KEEP="', 1)[1].split('"', 1)[0].split()
    for tool in ("dpkg", "apt", "perl-base", "coreutils", "bash", "python3-pip-whl", "binutils"):
        assert tool not in keep, tool
    assert {"python3.11-minimal", "libpython3.11-stdlib", "ca-certificates", "dash"} <= set(keep)
    tools = hook.split('BUSYBOX_TOOLS="', 1)[1].split('"', 1)[0].split()
    compose = (ROOT / "docker-compose.yml").read_text()
    helm_test = (ROOT / "charts/stunner/templates/tests/turncat-test.yaml").read_text()
    # What the compose stack's Redis-password wrapper and the chart's helm test call.
    assert "sleep 0.1" in compose
    assert "cat " in compose
    assert "timeout 30 turncat" in helm_test
    assert {"cat", "sleep", "timeout"} <= set(tools)
    # What the operator runs in the stunnerd image: the handoff DaemonSet's init container needs
    # only the interpreter (its busybox has no `install`, and there are no coreutils).
    from stunner_operator.render.handoff import handoff_dir_command

    assert handoff_dir_command(10001, 10001)[0] == "python3"
    assert "python3-minimal" in keep


def test_the_handoff_init_container_makes_its_folder_owned_and_private(tmp_path: Path) -> None:
    from stunner_operator.render.handoff import handoff_dir_command

    folder = tmp_path / "run" / "stunner"
    command = handoff_dir_command(os.getuid(), os.getgid(), str(folder))
    subprocess.run([sys.executable, *command[1:]], check=True)
    info = folder.stat()
    assert stat.S_IMODE(info.st_mode) == 0o700
    assert (info.st_uid, info.st_gid) == (os.getuid(), os.getgid())
    subprocess.run([sys.executable, *command[1:]], check=True)  # again: the folder is there
