"""Redis users with least privilege for the config store, and Redis URLs safe to log.

Redis always runs with a password and without a usable ``default`` user: the operator logs in as
``stunner-operator``, which may run the publisher's scripts on the ``stunner:*`` keys and stream
and nothing else; the CDS logs in as ``stunner-cds``, which may only read them (snapshot in
MULTI/EXEC, stream tail). The rules are written once here and rendered into a Redis config by
``make run``, by the compose stack and (as the same lines) by the Helm chart, whose test checks
them against these. No channel, no admin or dangerous command, no other key.
"""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Final
from urllib.parse import quote, urlsplit, urlunsplit

from stunner_common.contracts.redis_keys import ALL_KEYS_PATTERN, QUOTA_KEYS_PATTERN

__all__ = [
    "CDS_RULES",
    "CDS_USER",
    "DATAPLANE_RULES",
    "DATAPLANE_USER",
    "OPERATOR_RULES",
    "OPERATOR_USER",
    "acl_config",
    "new_password",
    "redact_url",
    "redis_url",
    "write_secrets",
]

OPERATOR_USER: Final = "stunner-operator"
CDS_USER: Final = "stunner-cds"
DATAPLANE_USER: Final = "stunner-dataplane"

_BASE: Final = f"resetkeys ~{ALL_KEYS_PATTERN} resetchannels -@all +@connection -@admin -@dangerous"
OPERATOR_RULES: Final = (
    f"{_BASE} +ping +evalsha +eval +script|load +script|exists"
    " +get +incr +hget +hgetall +hkeys +hset +hdel +xadd +xrange +xlen +multi +exec +discard"
)
"""The publisher's Lua scripts (HSET/HDEL/INCR/XADD on ``stunner:*``) and reads of the same keys."""
CDS_RULES: Final = (
    f"{_BASE} +ping +get +hget +hgetall +hkeys +xread +xrange +xrevrange +xlen"
    " +multi +exec +discard"
)
"""Reads only: the snapshot (in MULTI/EXEC) and the stream tail."""
DATAPLANE_RULES: Final = (
    f"resetkeys ~{QUOTA_KEYS_PATTERN} resetchannels -@all +@connection -@admin -@dangerous +ping"
    " +evalsha +eval +script|load +script|exists +time +zadd +zrem +zscore +zcard +zrange"
    " +zremrangebyscore +pexpireat"
)
"""The stunnerd pods' cluster-wide user quota (stunnerd.quota): its leases and nothing else."""


def new_password() -> str:
    """A fresh random password (URL-safe, 256 bits)."""
    return secrets.token_urlsafe(32)


def acl_config(passwords: Mapping[str, str]) -> str:
    """``user`` lines for a redis.conf: the default user off, one line per known user given."""
    rules = {OPERATOR_USER: OPERATOR_RULES, CDS_USER: CDS_RULES, DATAPLANE_USER: DATAPLANE_RULES}
    lines = ["user default off"]
    for user, password in passwords.items():
        if user not in rules:
            raise ValueError(f"unknown Redis user {user!r}")
        lines.append(f"user {user} on >{password} {rules[user]}")
    return "\n".join(lines) + "\n"


def redis_url(
    user: str, password: str, host: str = "127.0.0.1", port: int = 6379, *, tls: bool = False
) -> str:
    """``redis[s]://user:password@host:port/0`` with both parts percent-encoded."""
    scheme = "rediss" if tls else "redis"
    hostpart = f"[{host}]" if ":" in host else host
    return f"{scheme}://{quote(user, safe='')}:{quote(password, safe='')}@{hostpart}:{port}/0"


def redact_url(url: str) -> str:
    """The URL with any password replaced by ``***`` (for logs and error messages)."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
    except ValueError:
        return "<unparsable URL>"
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, f"{user}:***@{host}", parts.path, parts.query, ""))


_PASSWORD_CHARS: Final = frozenset(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
)


def _kept_password(path: Path) -> str | None:
    """The password in ``path`` when it is one ``new_password`` could have made, else None."""
    try:
        text = path.read_text()
    except (FileNotFoundError, UnicodeDecodeError):
        return None
    return text if len(text) >= 32 and set(text) <= _PASSWORD_CHARS else None


def write_secrets(directory: Path) -> dict[str, str]:
    """Passwords into ``<user>.password`` files and the ACL into ``users.acl`` (mode 0600).

    A password already in the directory is kept, a missing or malformed one is generated: the
    compose stack runs this at every Redis start on a volume that lives as long as the compose
    project, so a restarted Redis takes the passwords the operator and the CDS already hold, and
    ``compose down -v`` (which removes the volume) gives the next project fresh ones. The ACL
    file is always written again, from the rules of this version. Files are written next to each
    other and renamed into place, so a reader never sees half a file.
    """
    passwords = {
        user: _kept_password(directory / f"{user}.password") or new_password()
        for user in (OPERATOR_USER, CDS_USER)
    }
    files = {f"{user}.password": password for user, password in passwords.items()}
    files["users.acl"] = acl_config(passwords)
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        tmp = directory / f".{name}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(text)
        tmp.replace(directory / name)
    return passwords


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(
            "usage: python -m stunner_common.redis_acl DIRECTORY"
            "  (writes the Redis secrets, keeping passwords already there)"
        )
    write_secrets(Path(sys.argv[1]))
