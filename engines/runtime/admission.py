"""Admission of protocol requests (HTTP, Wyoming): phone calls come first.

Rule 1: one decision lives here: may a new protocol request start now? It may not
when ``--protocol-max-requests`` are already running (429), or when the engine's
predicted headroom is below one call (503): the request would take compute the
docked phone calls need and make them stutter. Every refusal is counted by reason,
and carries a ``Retry-After``.
Rule 2: the prediction is not made here. ``Headroom`` is the seam: the engine-wide
load meter (``CallManager.headroom_calls``, ``load.py``: capacity x target
utilisation minus demand, in calls) plugs in there; where it does not know
(``None``: no plan and too little measured work yet, or a self-scheduled engine
such as Qwen3, whose units the meter does not see), ``SchedulerHeadroom`` answers,
from the inference scheduler's snapshot and ``--max-concurrent`` (``FirstKnown``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from engines.runtime.calls import CallManager

RETRY_AFTER_S = 1  # seconds a refused client is asked to wait
MIN_HEADROOM_CALLS = 1.0  # a new request needs one call's worth (--protocol-min-headroom)


class Headroom(Protocol):
    """How many more calls the engine can carry in real time, as predicted now."""

    def headroom_calls(self) -> float | None:
        """Predicted spare capacity in calls; ``None`` when unknown (the request is admitted)."""


class SchedulerHeadroom:
    """Fallback ``Headroom``: ``--max-concurrent`` minus the utterances in synthesis (the
    scheduler's open jobs, or the running ones for a self-scheduled engine) and those
    waiting for synthesis capacity. It knows nothing of compute per unit: a coarse
    stand-in for the load meter."""

    def __init__(self, calls: CallManager) -> None:
        self.calls = calls

    def headroom_calls(self) -> float | None:
        c = self.calls
        in_use = c.running
        if c.pool is not None:
            _queued, _parked, _busy, open_jobs = c.pool.snapshot()
            in_use = max(in_use, open_jobs)
        return float(c.max_concurrent - in_use - c.waiting)


class FirstKnown:
    """The first of several ``Headroom`` predictions that is not ``None``."""

    def __init__(self, *sources: Headroom) -> None:
        self.sources = sources

    def headroom_calls(self) -> float | None:
        for source in self.sources:
            room = source.headroom_calls()
            if room is not None:
                return room
        return None


@dataclass(frozen=True, slots=True)
class Refusal:
    status: int  # HTTP status: 503 (no headroom) or 429 (too many protocol requests)
    reason: str  # counter label
    message: str
    retry_after_s: int = RETRY_AFTER_S


class Admission:
    """Counts running protocol requests; ``admit`` says yes (``None``) or why not."""

    def __init__(
        self, headroom: Headroom, max_requests: int, min_headroom: float = MIN_HEADROOM_CALLS
    ) -> None:
        if max_requests < 1:
            raise ValueError(f"max_requests must be >= 1, got {max_requests}")
        if not min_headroom >= 0:
            raise ValueError(f"min_headroom must be >= 0, got {min_headroom}")
        self.headroom = headroom
        self.max_requests = max_requests
        self.min_headroom = min_headroom  # 0: never refuse for headroom
        self.active = 0
        self.refused: Counter[str] = Counter()

    def admit(self) -> Refusal | None:
        """Take one of the ``max_requests`` places, or return why not (counted). Pair with
        ``release``."""
        refusal: Refusal | None = None
        if self.active >= self.max_requests:
            refusal = Refusal(
                429,
                "max_requests",
                f"{self.active} protocol requests are running (--protocol-max-requests "
                f"{self.max_requests}); retry later",
            )
        elif self.min_headroom > 0:
            try:
                room = self.headroom.headroom_calls()
            except Exception:  # a broken meter must not refuse everything: unknown
                room = None
            if room is not None and room < self.min_headroom:
                refusal = Refusal(
                    503,
                    "no_headroom",
                    f"the engine has no spare capacity (predicted headroom {room:.2f} calls); "
                    "phone calls come first, retry later",
                )
        if refusal is not None:
            self.refused[refusal.reason] += 1
            return refusal
        self.active += 1
        return None

    def release(self) -> None:
        self.active = max(0, self.active - 1)
