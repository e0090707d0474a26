"""Which unit of synthesis work runs next: the deadline queue and the deadline rule.

Rule 1: the ordering of work lives here: every queued item has a *deadline* (when
its next unit must start so that its call's playback does not run dry) and a
*ready* time (before it, the item is parked: its call has plenty of audio queued);
``pop`` returns the ready item with the earliest deadline, first come first served
among equal deadlines.
Rule 2: this file knows no threads, clocks or synthesisers: times are plain floats
(seconds of one monotonic clock) passed in by the caller (``pool.SynthesisPool``).

Rule 3: a unit cannot be cut short, but it can be recalled (``recall_victim``): when a
new utterance's first unit is due and every worker is busy, the running unit of an
utterance whose listener has audio to spare gives its worker back (an engine that can,
ends it with no audio and does the work again in its next unit), so a caller's first
audio does not wait up to a whole window of another call's.

Bounds: the queue holds at most one item per utterance in progress, and utterances
in progress are bounded by ``--max-concurrent``; ``pop`` scans the items once
(linear in that bound, a handful), which is simpler than a heap with lazy deletion
and as fast at this size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Generic, TypeVar

from engines.runtime.cpus import available_cpus

T = TypeVar("T")

#: Default size of the inference pool (``--synth-workers``): one worker per core this
#: process can use (``cpus.available_cpus``: affinity within a cgroup CPU quota; at most
#: 8). Measured on 2 vCPUs with benchmarks/kokoro_capacity.py (README): two workers with
#: one intra-op thread each serve 2 calls with no gaps and make the most audio per second.
SYNTH_WORKERS = max(1, min(available_cpus(), 8))
#: A parked item becomes ready when its queued-ahead audio has dropped to this (s).
MAX_AHEAD_S = 3.0
#: EMA weight of the newest measurement in ``StepEstimate``.
EMA_ALPHA = 0.3


@dataclass(slots=True)
class _Entry:
    deadline: float
    ready_at: float
    seq: int
    queued_at: float


class DeadlineQueue(Generic[T]):
    """Items (compared by identity) ordered by deadline; parked until their ready time."""

    def __init__(self) -> None:
        self._items: dict[int, tuple[T, _Entry]] = {}
        self._seq = 0

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, item: object) -> bool:
        return id(item) in self._items

    def push(self, item: T, deadline: float, now: float, ready_at: float = -math.inf) -> None:
        """Queue ``item`` (or re-time it if queued): due at ``deadline``, parked until
        ``ready_at``."""
        self._seq += 1
        self._items[id(item)] = (item, _Entry(deadline, ready_at, self._seq, now))

    def expedite(self, item: T, now: float) -> bool:
        """Make a queued ``item`` the most urgent and ready at once (its work was
        cancelled: only closing it is left); ``False`` if it is not queued."""
        if id(item) not in self._items:
            return False
        self.push(item, -math.inf, now)
        return True

    def remove(self, item: T) -> bool:
        return self._items.pop(id(item), None) is not None

    def _best(self, now: float, parked_too: bool) -> tuple[T, _Entry] | None:
        best: tuple[T, _Entry] | None = None
        for pair in self._items.values():
            e = pair[1]
            if e.ready_at > now and not parked_too:
                continue
            if best is None or (e.deadline, e.seq) < (best[1].deadline, best[1].seq):
                best = pair
        return best

    def pop(self, now: float, *, parked_too: bool = False) -> tuple[T, float] | None:
        """The ready item (any item with ``parked_too``) with the earliest deadline and how
        long it waited since it was queued or became ready (s); ``None`` when none is."""
        best = self._best(now, parked_too)
        if best is None:
            return None
        item, e = best
        del self._items[id(item)]
        return item, max(0.0, now - max(e.queued_at, e.ready_at))

    def peek(self, now: float) -> tuple[T, float] | None:
        """The item ``pop`` would return now and its deadline, left queued; ``None`` when
        none is ready."""
        best = self._best(now, False)
        return None if best is None else (best[0], best[1].deadline)

    def first_deadline(self, now: float) -> float | None:
        """The deadline of the item ``pop`` would return now; ``None`` when none is ready."""
        got = self.peek(now)
        return None if got is None else got[1]

    def next_ready_at(self, now: float) -> float | None:
        """The earliest time an item becomes ready (``now`` if one is ready already)."""
        times = [e.ready_at for _, e in self._items.values()]
        if not times:
            return None
        return max(now, min(times))

    def ready_items(self, now: float) -> list[tuple[T, float]]:
        """The items ready to run at ``now``, with their deadlines."""
        return [(item, e.deadline) for item, e in self._items.values() if e.ready_at <= now]

    def ready(self, now: float) -> int:
        """Items ready to run at ``now``."""
        return sum(1 for _, e in self._items.values() if e.ready_at <= now)

    def parked(self, now: float) -> int:
        return sum(1 for _, e in self._items.values() if e.ready_at > now)


def deadline_for(dry_at: float, next_step_s: float, max_ahead_s: float) -> tuple[float, float]:
    """(deadline, ready_at) of an utterance whose listener runs dry at ``dry_at`` and
    whose next unit is expected to take ``next_step_s``: due when the unit would just
    finish in time; parked while more than ``max_ahead_s`` of audio is queued."""
    return dry_at - next_step_s, dry_at - max_ahead_s


#: A new utterance is due this long after its text arrived: units of utterances in
#: progress whose listener runs dry sooner go first, so that under overload new
#: sentences start later instead of cutting gaps into sentences already playing.
START_SLACK_S = 0.25


def start_deadline(t_text: float, play_until: float, first_unit_s: float) -> float:
    """Deadline of an utterance's first unit: ``START_SLACK_S`` after its text arrived, or,
    while its call still plays the previous sentence, when that one would run dry minus
    the expected first unit (whichever is later)."""
    return max(t_text + START_SLACK_S, play_until - first_unit_s)


#: Rule 3: a new utterance's first unit that is due with every worker busy recalls a
#: running unit (``recall_victim``) unless one is expected to end within this long ...
RECALL_WAIT_S = 0.1
#: ... and only a unit whose listener has this much audio to spare beyond the first unit
#: and twice its own unit (it waits for a worker, then decodes again; s)
RECALL_MARGIN_S = 0.3


@dataclass(frozen=True, slots=True)
class RunningUnit:
    """What ``recall_victim`` knows of a unit a worker is running (times in seconds of
    the caller's clock)."""

    started: float
    expected_s: float  # its expected compute (the job's estimate, else the engine's)
    dry_at: float  # when its listener runs out of the audio produced so far
    first: bool  # an utterance's first unit: never recalled
    recalled: bool = False  # recalled already (it is ending)


def recall_victim(running: list[RunningUnit], now: float, first_unit_s: float) -> int | None:
    """Rule 3: which running unit (its index) gives its worker to a new utterance's first
    unit that is due now with every worker busy; None while one is being recalled or
    one is expected to end within ``RECALL_WAIT_S`` (a unit past its expected end may
    run on for long: it does not count). Else, of the units after an utterance's first
    that are at most half done by their estimate (the work lost is less than the wait
    saved) and whose listener has audio queued for the first unit (``first_unit_s``),
    twice the unit's expected compute and ``RECALL_MARGIN_S``, the one that started
    last (the least work lost); None if there is none."""
    best: int | None = None
    for k, r in enumerate(running):
        left = r.started + r.expected_s - now
        if r.recalled or 0.0 <= left <= RECALL_WAIT_S:
            return None
        if r.first or left < now - r.started:
            continue
        if r.dry_at - now < first_unit_s + 2 * r.expected_s + RECALL_MARGIN_S:
            continue
        if best is None or r.started > running[best].started:
            best = k
    return best


class StepEstimate:
    """Exponential moving average of one kind of step's compute time (s)."""

    __slots__ = ("n", "value")

    def __init__(self, prior: float = 0.0) -> None:
        self.value = prior
        self.n = 0

    def add(self, seconds: float) -> None:
        if not math.isfinite(seconds) or seconds < 0:
            return
        self.value = seconds if self.n == 0 else (1 - EMA_ALPHA) * self.value + EMA_ALPHA * seconds
        self.n += 1
