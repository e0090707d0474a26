"""How loaded the engine is and how many more calls it can take: utilisation and headroom.

Rule 1: sans-I/O arithmetic over the units of work the pool ran in the last
``WINDOW_S`` seconds; every method takes ``now``; no clock, no threads of its own
(the loop feeds it, ``cmdport`` reads ``snapshot``).
Rule 2: one definition of each figure, in the list below; the README's
"Reading the load figures" repeats it for operators.

- utilisation: core-seconds of inference in the window / (cores x window).
- capacity: audio seconds the engine can make per wall second on all cores: cores x
  the audio made per core-second, measured over the window once it holds
  ``MIN_CORE_S`` of work, else the synthesiser's own estimate (``ExecutionPlan``);
  never above that estimate: units measured while a core ran alone say nothing of
  cores that share execution units (SMT), which the estimate has measured.
- demand: audio seconds made per wall second over the window.
- per-call demand: demand / calls that got audio in the window (at least
  ``MIN_CALL_DEMAND``); ``CALL_DEMAND_PRIOR`` before any (a conversation: the
  caller talks about half the time).
- headroom: (capacity x ``TARGET_UTILISATION`` - demand) / per-call demand, in
  calls, never below 0.

``TARGET_UTILISATION`` keeps the margin that the deadline scheduler needs to start
new sentences on time: past it, turns start later (measured with
``benchmarks/kokoro_capacity.py``: capacity is about 70 % of the physical limit).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

WINDOW_S = 30.0
MIN_CORE_S = 2.0
CALL_DEMAND_PRIOR = 0.75
TARGET_UTILISATION = 0.7
#: a call that has only just started speaking is not counted as asking for less
MIN_CALL_DEMAND = 0.25


@dataclass(frozen=True, slots=True)
class LoadSnapshot:
    utilisation: float
    capacity: float  # audio s per wall s on all cores (0: unknown)
    demand: float  # audio s per wall s now
    call_demand: float  # audio s per wall s one call asks for
    calls: int  # calls that got audio in the window
    headroom_calls: float | None  # None: capacity unknown


class LoadMeter:
    """Units of work over a sliding window (see the module table)."""

    def __init__(self, cpus: int, window_s: float = WINDOW_S) -> None:
        if cpus < 1 or not window_s > 0:
            raise ValueError("need cpus >= 1 and window_s > 0")
        self.cpus = cpus
        self.window_s = window_s
        self._units: deque[tuple[float, float, float, int]] = deque()  # t, core_s, audio_s, call
        self._core_s = 0.0
        self._audio_s = 0.0
        self._t0: float | None = None  # first unit ever (the window is shorter before)

    def unit(self, now: float, core_s: float, audio_s: float, call_id: int) -> None:
        """A unit of work ended at ``now``: ``core_s`` core-seconds made ``audio_s``."""
        if self._t0 is None:
            self._t0 = now
        core_s, audio_s = max(0.0, core_s), max(0.0, audio_s)
        self._units.append((now, core_s, audio_s, call_id))
        self._core_s += core_s
        self._audio_s += audio_s
        self._expire(now)

    def _expire(self, now: float) -> None:
        limit = now - self.window_s
        while self._units and self._units[0][0] < limit:
            _, c, a, _ = self._units.popleft()
            self._core_s -= c
            self._audio_s -= a
        if not self._units:
            self._core_s = self._audio_s = 0.0

    def snapshot(self, now: float, estimate: float | None = None) -> LoadSnapshot:
        """The figures at ``now``; ``estimate``: the synthesiser's own capacity estimate
        (audio s per wall s on all cores), used until the window holds enough work."""
        self._expire(now)
        span = self.window_s if self._t0 is None else min(self.window_s, max(now - self._t0, 1.0))
        core_s = max(0.0, self._core_s)
        audio_s = max(0.0, self._audio_s)
        calls = len({u[3] for u in self._units if u[2] > 0})
        known = estimate if estimate is not None and estimate > 0 else 0.0
        if core_s >= MIN_CORE_S and audio_s > 0:
            capacity = self.cpus * audio_s / core_s
            capacity = min(capacity, known) if known else capacity
        else:
            capacity = known
        demand = audio_s / span
        call_demand = max(demand / calls, MIN_CALL_DEMAND) if calls else CALL_DEMAND_PRIOR
        headroom: float | None = None
        if capacity > 0:
            headroom = max(0.0, (capacity * TARGET_UTILISATION - demand) / call_demand)
        return LoadSnapshot(
            utilisation=min(1.0, core_s / (self.cpus * span)),
            capacity=capacity,
            demand=demand,
            call_demand=call_demand,
            calls=calls,
            headroom_calls=headroom,
        )
