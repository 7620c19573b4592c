"""`make images` (scripts/images.py) leaves no untagged images behind (issue 27, item 6).

A fake engine on $CONTAINER_ENGINE records the calls: the untagged images that appear during the
run (builder stages, a rebuilt tag's old image) are removed, those from before are left alone,
even when a build fails.
"""

from __future__ import annotations

import importlib.util
import json
import stat
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
if args[:2] == ["image", "inspect"]:
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
        "RUNTIME_PACKAGES": "libbpf1",
    }
    assert args_of(cds) == {"SERVICE": "cds", "COMMAND": "stunner-cds"}
    assert args_of(redis) == {}
    root = Path(__file__).resolve().parents[2]
    for name, args in images.BUILD_ARGS.items():
        assert (root / "services" / args["SERVICE"] / "pyproject.toml").is_file(), name
