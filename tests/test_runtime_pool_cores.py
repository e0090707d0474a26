"""A unit granted every core keeps them (``engines.runtime.pool`` Rule 5): while it runs, a
free worker leaves another utterance's later unit that is not due soon, and still takes a
sentence's first unit, or a unit whose deadline is near, at once."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator

import numpy as np

from engines.runtime.playback import PlaybackMeter
from engines.runtime.pool import CORE_WAIT_MARGIN_S, Job, Step, SynthesisPool
from engines.runtime.synth import CancelToken, FloatArray, unit_grant

#: how long the wide unit gives the other job's unit to start before it ends (what the
#: tests look for is the order of the two, never how fast either ran)
START_WITHIN_S = 1.0
#: a bound on every wait for an event that must come (a hang, not a speed target)
HANG_S = 30.0


class _Trace:
    """Jobs whose units record their order in ``order``."""

    def __init__(self, pool: SynthesisPool) -> None:
        self.pool = pool
        self.order: list[str] = []
        self.lock = threading.Lock()
        self.started: dict[str, threading.Event] = {}
        self.grants: dict[str, int] = {}

    def note(self, what: str) -> None:
        with self.lock:
            self.order.append(what)
        self.started.setdefault(what, threading.Event()).set()

    def event(self, what: str) -> threading.Event:
        return self.started.setdefault(what, threading.Event())

    def job(self, name: str, units: list[Iterator[None] | None], loop: list[Step]) -> Job:
        """A job of ``len(units)`` units; each records ``name-k`` when it starts and runs
        its entry of ``units`` (None: nothing) before it yields; its steps go to ``loop``
        (a stand-in for the event loop, which the test requeues by hand)."""

        def gen() -> Iterator[FloatArray]:
            for k, body in enumerate(units):
                self.grants[f"{name}-{k}"] = unit_grant().cores
                self.note(f"{name}-{k}")
                if body is not None:
                    for _ in body:
                        pass
                yield np.zeros(240, np.float32)

        def deliver(step: Step) -> None:
            loop.append(step)
            self.note(f"{name}-delivered-{len(loop)}")

        return Job(start=gen, token=CancelToken(), deliver=deliver, meter=PlaybackMeter())


def _wide_unit(trace: _Trace, until: str, within: float = HANG_S) -> Iterator[None]:
    """The wide job's unit: runs until ``until`` has started (at most ``within`` s: where
    it must not start first, ``START_WITHIN_S``), then records its end."""
    trace.event(until).wait(within)
    trace.note("wide-end")
    yield None


def _helper_left_running(holds: list[Callable[[int], None]]) -> Iterator[None]:
    """A gang's unit whose helper thread still decodes when the unit yields: it holds a
    core (``UnitGrant.hold``) until the test gives it back through ``holds``."""
    hold = unit_grant().hold
    assert hold is not None
    hold(1)
    holds.append(hold)
    yield None


def _wait(trace: _Trace, what: str) -> None:
    assert trace.event(what).wait(HANG_S), f"{what} never came: {trace.order}"


def _later_unit_while_wide(due_in: float, within: float) -> list[str]:
    """Two workers on two cores. Job ``other`` has run its first unit and is with the loop;
    job ``wide`` then starts alone (granted both cores); while it runs, ``other``'s next
    unit is queued, due ``due_in`` s from now; the wide unit gives its start ``within`` s
    (``_wide_unit``). The order of what happened."""
    pool = SynthesisPool(2, cpus=2, return_wait_s=0.0)
    trace = _Trace(pool)
    other_loop: list[Step] = []
    wide_loop: list[Step] = []
    other = trace.job("other", [None, None], other_loop)
    wide = trace.job("wide", [_wide_unit(trace, "other-1", within)], wide_loop)
    try:
        pool.submit(other, pool.clock())
        _wait(trace, "other-delivered-1")
        pool.submit(wide, pool.clock())
        _wait(trace, "wide-0")
        assert trace.grants["wide-0"] == 2  # alone: every core
        pool.requeue(other, pool.clock() + due_in)
        _wait(trace, "other-1")
        _wait(trace, "wide-end")
        return list(trace.order)
    finally:
        pool.stop()


def test_a_later_unit_not_due_soon_waits_for_the_unit_that_holds_every_core() -> None:
    order = _later_unit_while_wide(due_in=60.0, within=START_WITHIN_S)
    assert order.index("wide-end") < order.index("other-1"), order


def test_a_later_unit_due_within_the_margin_runs_beside_the_wide_unit() -> None:
    order = _later_unit_while_wide(due_in=CORE_WAIT_MARGIN_S / 2, within=HANG_S)
    assert order.index("other-1") < order.index("wide-end"), order


def test_a_first_unit_runs_at_once_beside_the_unit_that_holds_every_core() -> None:
    pool = SynthesisPool(2, cpus=2, return_wait_s=0.0)
    trace = _Trace(pool)
    wide = trace.job("wide", [_wide_unit(trace, "start-0")], [])
    start = trace.job("start", [None], [])
    try:
        pool.submit(wide, pool.clock())
        _wait(trace, "wide-0")
        assert trace.grants["wide-0"] == 2
        pool.submit(start, pool.clock() + 60.0)  # a first unit, however far its deadline
        _wait(trace, "wide-end")
        assert trace.order.index("start-0") < trace.order.index("wide-end"), trace.order
    finally:
        pool.stop()


def test_a_unit_granted_one_core_of_two_holds_back_nothing() -> None:
    """A unit that began beside another (granted one core) leaves the other core free once
    that one has ended: the later unit runs beside it."""
    pool = SynthesisPool(2, cpus=2, return_wait_s=0.0)
    trace = _Trace(pool)
    other_loop: list[Step] = []
    other = trace.job("other", [None, None], other_loop)
    go = threading.Event()

    def first_unit() -> Iterator[None]:
        go.wait(HANG_S)
        yield None

    first = trace.job("first", [first_unit()], [])
    narrow = trace.job("wide", [_wide_unit(trace, "other-1")], [])
    try:
        pool.submit(other, pool.clock())
        _wait(trace, "other-delivered-1")
        pool.submit(first, pool.clock())
        _wait(trace, "first-0")
        assert trace.grants["first-0"] == 2
        pool.submit(narrow, pool.clock())  # a first unit: taken beside it, one core
        _wait(trace, "wide-0")
        assert trace.grants["wide-0"] == 1
        go.set()
        _wait(trace, "first-delivered-1")
        pool.requeue(other, pool.clock() + 60.0)
        _wait(trace, "wide-end")
        _wait(trace, "other-1")
        assert trace.order.index("other-1") < trace.order.index("wide-end"), trace.order
    finally:
        pool.stop()


def test_a_unit_taken_while_a_helper_holds_a_core_is_granted_the_rest() -> None:
    """A gang's helper thread decodes on after its unit has yielded (``UnitGrant.hold``):
    the next unit is granted only the core it leaves, and every core once it is done."""
    pool = SynthesisPool(2, cpus=2, return_wait_s=0.0)
    trace = _Trace(pool)
    holds: list[Callable[[int], None]] = []

    gang = trace.job("gang", [_helper_left_running(holds)], [])
    during = trace.job("during", [None], [])
    after = trace.job("after", [None], [])
    try:
        pool.submit(gang, pool.clock())
        _wait(trace, "gang-delivered-1")
        pool.submit(during, pool.clock())
        _wait(trace, "during-delivered-1")
        holds[0](-1)  # the helper is done
        pool.submit(after, pool.clock())
        _wait(trace, "after-delivered-1")
        assert trace.grants == {"gang-0": 2, "during-0": 1, "after-0": 2}
    finally:
        pool.stop()


def test_a_jobs_own_helper_leaves_its_next_unit_every_core() -> None:
    """The cores a job's helper threads hold are its own work (its next unit waits for
    them, or runs beside them on purpose): its next unit is granted every core."""
    pool = SynthesisPool(2, cpus=2, return_wait_s=0.0)
    trace = _Trace(pool)
    holds: list[Callable[[int], None]] = []

    def next_unit() -> Iterator[None]:
        holds[0](-1)  # the helper ends during the job's next unit
        yield None

    loop: list[Step] = []
    gang = trace.job("gang", [_helper_left_running(holds), next_unit()], loop)
    try:
        pool.submit(gang, pool.clock())
        _wait(trace, "gang-delivered-1")
        pool.requeue(gang, pool.clock())
        _wait(trace, "gang-delivered-2")
        assert trace.grants == {"gang-0": 2, "gang-1": 2}
    finally:
        pool.stop()


def test_a_later_unit_waits_for_a_helper_that_holds_the_last_core() -> None:
    """A gang's helper holds one core after its unit has yielded, and a one-core unit runs
    on the other: a later unit not due soon waits until the helper gives its core back,
    then runs at once (not at its deadline)."""
    pool = SynthesisPool(2, cpus=2, return_wait_s=0.0)
    trace = _Trace(pool)
    other = trace.job("other", [None, None], [])
    holds: list[Callable[[int], None]] = []
    go = threading.Event()

    def busy_unit() -> Iterator[None]:
        go.wait(HANG_S)
        yield None

    gang = trace.job("gang", [_helper_left_running(holds)], [])
    busy = trace.job("busy", [busy_unit()], [])
    try:
        pool.submit(other, pool.clock())
        _wait(trace, "other-delivered-1")
        pool.submit(gang, pool.clock())
        _wait(trace, "gang-delivered-1")
        pool.submit(busy, pool.clock())
        _wait(trace, "busy-0")
        assert trace.grants["busy-0"] == 1  # the helper holds the other core
        pool.requeue(other, pool.clock() + 60.0)
        # the order is what counts: the other's unit must not start before the release
        assert not trace.event("other-1").wait(START_WITHIN_S), trace.order
        trace.note("released")
        holds[0](-1)
        _wait(trace, "other-1")
        assert trace.order.index("released") < trace.order.index("other-1"), trace.order
    finally:
        go.set()
        pool.stop()


# -- Rule 6: a start claims the core another utterance's unit gives back ----------------


def _start_beside(
    claim: int, due_in: float, unit_s: float = 0.5
) -> tuple[_Trace, list[float], list[bool]]:
    """Two workers on two cores. Job ``other`` has run its first unit; its second runs
    (one core) until the start has begun; the start's first unit (granted the other core)
    claims ``claim`` cores and answers when they are expected free (``waits``); then
    ``other``'s second unit ends and its third is queued, due ``due_in`` s from now; if
    that starts within ``START_WITHIN_S`` the trace notes ``ran-while-claimed``; then the
    start's helper takes a core (``took``: whether one was free) and its unit ends."""
    pool = SynthesisPool(2, cpus=2, return_wait_s=0.0)
    pool.unit_s = lambda job: unit_s
    trace = _Trace(pool)
    waits: list[float] = []
    took: list[bool] = []
    other_loop: list[Step] = []
    may_end = threading.Event()

    def other_unit() -> Iterator[None]:
        trace.event("start-0").wait(HANG_S)
        yield None

    def start_unit() -> Iterator[None]:
        grant = unit_grant()
        assert grant.claim is not None and grant.take is not None and grant.hold is not None
        waits.append(grant.claim(claim))
        may_end.wait(HANG_S)
        took.append(grant.take(HANG_S if claim else START_WITHIN_S))
        grant.hold(-1)
        trace.note("took")
        yield None

    other = trace.job("other", [None, other_unit(), None], other_loop)
    start = trace.job("start", [start_unit()], [])
    try:
        pool.submit(other, pool.clock())
        _wait(trace, "other-delivered-1")
        pool.requeue(other, pool.clock())
        _wait(trace, "other-1")
        pool.submit(start, pool.clock())
        _wait(trace, "other-delivered-2")
        assert trace.grants["start-0"] == 1
        pool.requeue(other, pool.clock() + due_in)
        # the order is what counts: whether the other's unit starts while the claim waits
        if trace.event("other-2").wait(START_WITHIN_S):
            trace.note("ran-while-claimed")
        may_end.set()
        _wait(trace, "took")
        _wait(trace, "start-delivered-1")
        _wait(trace, "other-2")
        return trace, waits, took
    finally:
        may_end.set()
        pool.stop()


def test_a_start_takes_the_core_it_claimed_before_a_later_unit_not_due_soon() -> None:
    trace, waits, took = _start_beside(claim=1, due_in=60.0)
    assert waits and 0 < waits[0] <= 0.5  # the other's unit, expected to take 0.5 s
    assert took == [True]
    assert "ran-while-claimed" not in trace.order
    assert trace.order.index("took") < trace.order.index("other-2"), trace.order


def test_a_later_unit_due_within_the_margin_runs_while_a_claim_waits() -> None:
    trace, _, _ = _start_beside(claim=1, due_in=CORE_WAIT_MARGIN_S / 2)
    assert "ran-while-claimed" in trace.order


def test_without_a_claim_a_later_unit_takes_the_free_core_at_once() -> None:
    trace, waits, _ = _start_beside(claim=0, due_in=60.0)
    assert waits == [0.0]
    assert "ran-while-claimed" in trace.order


def test_a_claim_answers_when_the_cores_are_expected_free() -> None:
    """Every core granted: none to claim (``math.inf``); held by a unit whose compute is
    not yet estimated: unknown (``math.inf``); a later unit may not claim; once the unit
    that held it has ended: 0."""
    pool = SynthesisPool(2, cpus=2, return_wait_s=0.0)
    trace = _Trace(pool)
    answers: dict[str, list[float]] = {}
    go = threading.Event()

    def ask(name: str, until: str | None = None) -> Iterator[None]:
        claim = unit_grant().claim
        assert claim is not None
        answers[name] = [claim(1)]
        if until is not None:
            _wait(trace, until)
            answers[name].append(claim(1))
        yield None

    def busy_unit() -> Iterator[None]:
        go.wait(HANG_S)
        yield None

    alone = trace.job("alone", [ask("alone")], [])
    busy = trace.job("busy", [busy_unit()], [])
    loop: list[Step] = []
    later = trace.job("later", [None, ask("later")], loop)
    beside = trace.job("beside", [ask("beside", until="busy-delivered-1")], [])
    try:
        pool.submit(alone, pool.clock())
        _wait(trace, "alone-delivered-1")
        pool.submit(busy, pool.clock())
        _wait(trace, "busy-0")
        pool.submit(later, pool.clock())
        _wait(trace, "later-delivered-1")
        pool.requeue(later, pool.clock())
        _wait(trace, "later-delivered-2")
        pool.submit(beside, pool.clock())
        _wait(trace, "beside-0")
        go.set()
        _wait(trace, "beside-delivered-1")
        assert trace.grants["alone-0"] == 2 and trace.grants["beside-0"] == 1
        assert answers == {"alone": [math.inf], "later": [math.inf], "beside": [math.inf, 0.0]}
    finally:
        go.set()
        pool.stop()
