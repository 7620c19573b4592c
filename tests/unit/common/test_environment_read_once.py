"""The operator, the CDS, the auth service and turncat read the environment in one place each.

Each builds its settings (`stunner_common.process_settings.ProcessSettings`) once where the
process starts; what is looked up by name further down (a kubeconfig, the CDS address, a
credential plugin's environment) comes from the settings' ``environ``. import-linter cannot
forbid an attribute of ``os``, so this test reads the source tree: below the settings modules
nothing reads ``os.environ`` or calls ``os.getenv``. stunnerd reads its settings into frozen
dataclasses instead (no pydantic in the dataplane), with the same ``environ`` and ``read_from``;
its own test (tests/unit/stunnerd/test_stunnerd_settings.py) reads its sources.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SOURCES = (
    "libs/common/src",
    "services/operator/src",
    "services/cds/src",
    "services/auth/src",
    "services/turncat/src",
)

READS = re.compile(
    r"\bos\.(environb?|getenv|getenvb|putenv|unsetenv)\b|\bfrom\s+os\s+import\b.*\b(environ|getenv)\b"
)

ALLOWED = {
    "libs/common/src/stunner_common/process_settings.py": (
        "ProcessSettings keeps the environment it was read in"
    ),
    "libs/common/src/stunner_common/config/parse.py": "parse_config's documented default env",
    "services/operator/src/stunner_operator/settings.py": "the operator's settings",
    "services/cds/src/stunner_cds/settings.py": "the CDS's settings",
    "services/auth/src/stunner_auth/settings.py": "the auth service's settings",
    "services/turncat/src/turncat/settings.py": "turncat's and stunnerctl's settings",
}


def reads(files: dict[str, str]) -> list[str]:
    """Each line of ``files`` (path -> text) outside `ALLOWED` that reads the environment."""
    return [
        f"{name}:{number}: {line.strip()}"
        for name, text in files.items()
        if name not in ALLOWED
        for number, line in enumerate(text.splitlines(), 1)
        if READS.search(line)
    ]


def sources() -> dict[str, str]:
    return {
        str(path.relative_to(ROOT)): path.read_text(encoding="utf-8")
        for top in SOURCES
        for path in sorted((ROOT / top).rglob("*.py"))
    }


def test_only_the_settings_modules_read_the_environment() -> None:
    found = reads(sources())
    assert not found, (
        "read the environment into the service's settings (environ or a field) and pass it"
        " down:\n" + "\n".join(found)
    )


def test_every_allowed_module_exists() -> None:
    assert [name for name in ALLOWED if not (ROOT / name).is_file()] == []


def test_the_check_finds_a_read() -> None:
    files = {
        "a.py": "import os\nHOME = os.environ['HOME']\n",
        "b.py": "import os\nx = os.getenv('X')\n",
        "c.py": "from os import environ\n",
        "d.py": "env = settings.environ\n",
    }
    assert [line.split(":")[0] for line in reads(files)] == ["a.py", "b.py", "c.py"]


def test_every_process_shares_one_settings_style() -> None:
    from stunner_auth.settings import AuthSettings
    from stunner_cds.settings import CdsSettings
    from stunner_common.process_settings import ProcessSettings
    from stunner_operator.settings import OperatorSettings
    from stunnerd.settings import StunnerdSettings
    from turncat.settings import TurncatSettings

    classes = (OperatorSettings, CdsSettings, AuthSettings, TurncatSettings)
    assert [c.__name__ for c in classes if not issubclass(c, ProcessSettings)] == []
    assert [c.__name__ for c in classes if not c.model_config.get("frozen")] == []
    assert StunnerdSettings.__dataclass_params__.frozen  # type: ignore[attr-defined]
    for name in ("environ", "read_from"):
        assert hasattr(StunnerdSettings, name)


def test_settings_read_from_another_mapping_keep_it_as_their_environment() -> None:
    from stunnerd.settings import load_settings

    env = {"STUNNERD_BIND_HOST": "127.0.0.1", "ONLY_HERE": "1"}
    settings = load_settings(env, config="ws://h:1", watch=True, turn_uri=None, ident="ns/gw")
    assert settings.bind_host == "127.0.0.1"
    assert dict(settings.environ) == env
    copy = settings.read_from({"OTHER": "2"})
    assert dict(copy.environ) == {"OTHER": "2"}
    assert dict(settings.environ) == env
