"""Room for the file descriptors a bench run holds: each allocation, relay or client socket is
one, and the default soft limit (often 1024) is far below a storm's or a journal run's."""

from __future__ import annotations

import resource


def room_for_fds(count: int) -> None:
    """Raise the soft fd limit (up to the hard one) for a run that holds about 2 per item."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, max(soft, 2 * count + 256))
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
