"""stunnerd reads the environment in one module: `stunnerd.settings`.

The command line and the environment become `StunnerdSettings` once, in `stunnerd.cli` (a worker
process: `settings.worker_environment`, in `stunnerd.worker_main`); every other module gets what
it needs as a setting or an argument. import-linter cannot forbid an attribute of ``os``, so this
test reads the source tree for a read of the environment anywhere else.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SOURCES = ROOT / "services/stunnerd/src"
SETTINGS = "services/stunnerd/src/stunnerd/settings.py"

READS = re.compile(
    r"\bos\.(environb?|getenv|getenvb|putenv|unsetenv)\b|\bfrom\s+os\s+import\b.*\b(environ|getenv)\b"
)


def reads(files: dict[str, str]) -> list[str]:
    """Each line of ``files`` (path -> text) outside the settings module that reads the
    environment."""
    return [
        f"{name}:{number}: {line.strip()}"
        for name, text in files.items()
        if name != SETTINGS
        for number, line in enumerate(text.splitlines(), 1)
        if READS.search(line)
    ]


def sources() -> dict[str, str]:
    return {
        str(path.relative_to(ROOT)): path.read_text(encoding="utf-8")
        for path in sorted(SOURCES.rglob("*.py"))
    }


def test_only_the_settings_module_reads_the_environment() -> None:
    found = reads(sources())
    assert not found, (
        "read the environment in stunnerd.settings (a setting, or `environment()`) and pass"
        " it down:\n" + "\n".join(found)
    )


def test_the_settings_module_exists_and_is_where_the_environment_is_read() -> None:
    text = (ROOT / SETTINGS).read_text(encoding="utf-8")
    assert READS.search(text)


def test_the_check_finds_a_read() -> None:
    files = {
        "a.py": "import os\nHOME = os.environ['HOME']\n",
        "b.py": "import os\nx = os.getenv('X')\n",
        "c.py": "from os import environ\n",
        "d.py": "env = settings.environ\n",
        SETTINGS: "import os\nenv = os.environ\n",
    }
    assert [line.split(":")[0] for line in reads(files)] == ["a.py", "b.py", "c.py"]
