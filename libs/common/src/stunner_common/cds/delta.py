"""The sans-IO half of the CDS client: the client's errors and the ``stunner.cds.v2`` delta state.

``DeltaState`` takes envelopes and keeps the configs, the revision and the store epoch a watcher
holds, returning one ``ConfigChange`` per real change. It does no I/O, so it is tested (and
fuzzed) without a server; ``client.py`` holds the HTTP and WebSocket half and re-exports these
names.

A revision is only ever compared within its epoch: a resume names both (``resume_params``), a
handshake that resumes in another epoch than the one held, or an envelope of another epoch while
anything is held, is a ``CdsProtocolError`` (the caller then starts over from a full snapshot), and
a full snapshot forgets the old epoch's revision before it adopts the new one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stunner_common.cds.wire import EPOCH_PARAM, DeleteEnvelope, PatchEnvelope, SnapshotEnvelope


class CdsClientError(Exception):
    """Base of the client's errors."""


class CdsProtocolError(CdsClientError):
    """The server sent something that does not fit the state we hold (resync needed)."""


class CdsAddressError(CdsClientError, ValueError):
    """The CDS address is not ``host[:port]`` or an http(s)/ws(s) URL."""


class CdsUnreachableError(CdsClientError):
    """The CDS could not be reached, or the exchange broke off (the cause is chained)."""


class CdsHttpError(CdsClientError):
    """The CDS answered with a status other than 200 (or refused a watch)."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP error (status: {status}): {body}")
        self.status = status
        self.body = body


@dataclass(frozen=True, slots=True)
class ConfigChange:
    """``config`` is the new config of ``id`` at ``rev``, or None when ``id`` was deleted.

    ``resync`` marks the deletes a full resync reports for everything held before it (the
    server's snapshot follows and re-creates what still exists).
    """

    id: str
    rev: int
    config: dict[str, Any] | None
    resync: bool = False


@dataclass(frozen=True, slots=True)
class ConfigFrame:
    """One text frame of a server without the v2 subprotocol: a whole config (upstream v1)."""

    text: str


class DeltaState:
    """The configs a v2 watcher holds, updated envelope by envelope.

    ``rev`` is the highest revision seen in ``epoch`` (None: a server that sends no epochs).
    """

    def __init__(self) -> None:
        self.configs: dict[str, dict[str, Any]] = {}
        self.rev = 0
        self.epoch: str | None = None
        self._initial: tuple[int, int] | None = None  # (frames left, server revision)

    def resume_params(self) -> dict[str, str] | None:
        """The query that resumes this state (``since``, ``epoch``); None: ask for a snapshot."""
        if not self.configs:
            return None
        params = {"since": str(self.rev)}
        if self.epoch is not None:
            params[EPOCH_PARAM] = self.epoch
        return params

    def begin(
        self,
        *,
        delta: bool,
        epoch: str | None,
        rev: int | None = None,
        frames: int | None = None,
    ) -> list[ConfigChange]:
        """A watch is open: the server resumes our state (``delta``) or sends a full snapshot.

        ``rev`` and ``frames`` (when the server tells them) are its revision and the number of
        frames of the snapshot or resync: once all are applied this state is the server's at
        ``rev``, which may be above every revision the frames carry (a delete a snapshot leaves
        out); until then only the revisions seen count, so a client cut off half-way resumes
        from there. Returns the resync deletes of a full snapshot; raises ``CdsProtocolError``
        when the server resumes in another epoch than the one held.
        """
        if delta and epoch != self.epoch:
            raise CdsProtocolError(
                f"the CDS resumed in store epoch {epoch!r}, this client holds {self.epoch!r}"
            )
        gone = [] if delta else self.reset(epoch)
        self._initial = (frames, rev) if rev is not None and frames is not None else None
        self._caught_up()
        return gone

    def _caught_up(self) -> None:
        if self._initial is not None and self._initial[0] <= 0:
            self.rev = max(self.rev, self._initial[1])
            self._initial = None

    def reset(self, epoch: str | None = None) -> list[ConfigChange]:
        """Forget everything (the server is about to send a full snapshot of ``epoch``)."""
        gone = [ConfigChange(i, self.rev, None, resync=True) for i in sorted(self.configs)]
        self.configs.clear()
        self.rev = 0
        self.epoch = epoch
        return gone

    def apply(
        self, envelope: SnapshotEnvelope | PatchEnvelope | DeleteEnvelope
    ) -> ConfigChange | None:
        """Apply one envelope; return the change, or None when it changed nothing."""
        try:
            return self._apply(envelope)
        finally:
            if self._initial is not None:
                self._initial = (self._initial[0] - 1, self._initial[1])
                self._caught_up()

    def _apply(
        self, envelope: SnapshotEnvelope | PatchEnvelope | DeleteEnvelope
    ) -> ConfigChange | None:
        if envelope.epoch != self.epoch:
            if self.configs or self.rev:
                raise CdsProtocolError(
                    f"{envelope.type} for {envelope.id!r} in store epoch {envelope.epoch!r}, "
                    f"this client holds {self.epoch!r}"
                )
            self.epoch = envelope.epoch  # nothing held yet: no revision to confuse
        self.rev = max(self.rev, envelope.rev)
        if isinstance(envelope, SnapshotEnvelope):
            if self.configs.get(envelope.id) == envelope.config:
                return None
            self.configs[envelope.id] = envelope.config
            return ConfigChange(envelope.id, envelope.rev, envelope.config)
        if isinstance(envelope, PatchEnvelope):
            old = self.configs.get(envelope.id)
            if old is None:
                raise CdsProtocolError(
                    f"patch for {envelope.id!r}, which this client does not hold"
                )
            # Here, not at the top: a stunnerd whose config never changes never needs it.
            import jsonpatch

            try:
                new = jsonpatch.apply_patch(old, envelope.patch, in_place=False)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
                raise CdsProtocolError(f"patch for {envelope.id!r} does not apply: {exc}") from exc
            if not isinstance(new, dict):
                raise CdsProtocolError(f"patch for {envelope.id!r} did not yield an object")
            self.configs[envelope.id] = new
            return ConfigChange(envelope.id, envelope.rev, new)
        if self.configs.pop(envelope.id, None) is None:
            return None
        return ConfigChange(envelope.id, envelope.rev, None)
