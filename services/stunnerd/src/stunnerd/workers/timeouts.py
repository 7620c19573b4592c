"""How long a supervisor waits on its worker processes: a settings group of its own, so that
reading the settings loads none of the worker machinery (`workers.worker`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from stunnerd.bounds import Ge, Gt


@dataclass(frozen=True, slots=True)
class WorkerTimeouts:
    """How long the supervisor waits on a worker (from `StunnerdSettings`)."""

    request_s: Annotated[float, Gt(0)] = 30.0
    """An `apply` or `drain` request, from writing it to the worker's reply."""
    stats_s: Annotated[float, Gt(0)] = 2.0
    """A `stats` request (a worker slower than this keeps reporting its previous counts)."""
    stop_s: Annotated[float, Gt(0)] = 10.0
    """A worker's own exit after `close`, before it is killed."""
    restart_delay_s: Annotated[float, Ge(0)] = 0.5
    """The pause before a dead worker is started again."""
