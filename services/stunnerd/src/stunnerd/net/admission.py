"""The pace a connection without an allocation is held to, for the stream and DTLS listeners.

Until it allocates, a TCP or TLS connection (or a DTLS session) must bring a first complete
message within `first_message_timeout_s`, then keep sending at least `preauth_min_bytes_per_s`
on average over each `preauth_window_s` (`stunnerd.net.guard.ConnectionLimits`): a trickle that
would hold a file descriptor without ever authenticating is closed. The listeners arm the
timers; this says whether a connection passes, and which limit closes it if not.
"""

from __future__ import annotations

from stunnerd.net.guard import ConnectionLimits


def preauth_refusal(
    limits: ConnectionLimits, messages: int, window_bytes: int, what: str = "message"
) -> tuple[str, str] | None:
    """Why a connection that received `messages` so far and `window_bytes` in the last window
    is to be closed now: the limit (`first_message_timeout` or `preauth_trickle`, as the
    listener's refusals count it) and the reason for the log; None when it keeps its place for
    another `preauth_window_s`."""
    if messages == 0:
        return "first_message_timeout", f"no {what} within {limits.first_message_timeout_s:g} s"
    if window_bytes < limits.preauth_min_bytes_per_s * limits.preauth_window_s:
        slow = f"slower than {limits.preauth_min_bytes_per_s:g} B/s before allocating"
        return "preauth_trickle", slow
    return None
