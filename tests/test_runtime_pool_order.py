"""Which unit a free worker of the inference pool takes next while the loop still holds
another utterance's job (``engines.runtime.pool`` Rule 3): the job coming back may be due
sooner than the one that is ready."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import numpy as np

from engines.runtime.playback import PlaybackMeter
from engines.runtime.pool import Job, JobState, Step, SynthesisPool
from engines.runtime.synth import CancelToken, FloatArray

#: a worker's wait for a held job, in the tests where it must not end before the job is
#: back (far longer than any step here takes, so no test depends on the machine's speed)
LONG_WAIT_S = 60.0
#: how long a stand-in for the loop gives the other job to start before it hands its job
#: back, where that start is what the test looks for
START_WITHIN_S = 10.0


class _Units:
    """Jobs whose units record their order; a job's next unit is queued by a stand-in for
    the loop, due at ``due`` (pool clock) after its step was delivered, once ``hand_back``
    is set and job ``b`` has started a unit (or ``b_within`` s have passed)."""

    def __init__(self, pool: SynthesisPool, b_within: float = 0.0) -> None:
        self.pool = pool
        self.order: list[str] = []
        self.lock = threading.Lock()
        self.done: dict[str, threading.Event] = {}
        self.hand_back = threading.Event()  # cleared: the loop holds every step it gets
        self.hand_back.set()
        self.b_ran = threading.Event()
        self.b_within = b_within

    def job(self, name: str, units: int, due: float) -> Job:
        holder: list[Job] = []
        done = self.done[name] = threading.Event()

        def gen() -> Iterator[FloatArray]:
            for _ in range(units):
                with self.lock:
                    self.order.append(name)
                if name == "b":
                    self.b_ran.set()
                yield np.zeros(240, np.float32)

        def loop_side(step: Step) -> None:
            self.hand_back.wait(10)
            self.b_ran.wait(self.b_within)
            self.pool.requeue(holder[0], self.pool.clock() + due)

        def deliver(step: Step) -> None:
            if step.finished:
                done.set()
            else:
                threading.Thread(target=loop_side, args=(step,), daemon=True).start()

        holder.append(Job(start=gen, token=CancelToken(), deliver=deliver, meter=PlaybackMeter()))
        return holder[0]

    def wait_for(self, count: int) -> None:
        end = time.monotonic() + 10
        while len(self.order) < count and time.monotonic() < end:
            time.sleep(0.001)


def _run(return_wait_s: float, *, ready_due: float, b_within: float) -> list[str]:
    """One worker: ``a`` runs its first unit, ``b`` (due ``ready_due`` s from now) is
    queued meanwhile, then ``a``'s next unit comes back from the loop once ``b`` has
    started (or after ``b_within`` s), overdue: due before ``b`` whichever ``ready_due``."""
    pool = SynthesisPool(1, cpus=1, return_wait_s=return_wait_s)
    units = _Units(pool, b_within)
    units.hand_back.clear()
    pool.submit(units.job("a", 2, due=-5.0), pool.clock())
    units.wait_for(1)
    pool.submit(units.job("b", 1, due=0.0), pool.clock() + ready_due)
    units.hand_back.set()
    assert units.done["a"].wait(10) and units.done["b"].wait(10)
    pool.stop()
    return units.order


def test_a_free_worker_waits_for_the_held_job_before_a_unit_not_due_soon() -> None:
    assert _run(LONG_WAIT_S, ready_due=10 * LONG_WAIT_S, b_within=0.3) == ["a", "a", "b"]
    # without the wait the worker takes the ready unit while the loop holds ``a``
    assert _run(0.0, ready_due=10 * LONG_WAIT_S, b_within=START_WITHIN_S) == ["a", "b", "a"]


def test_a_ready_unit_due_within_the_wait_is_not_held_back() -> None:
    assert _run(LONG_WAIT_S, ready_due=-1.0, b_within=START_WITHIN_S) == ["a", "b", "a"]


def test_the_wait_for_a_held_job_is_bounded() -> None:
    pool = SynthesisPool(1, cpus=1, return_wait_s=0.05)
    units = _Units(pool)
    units.hand_back.clear()  # the loop keeps ``a`` until ``b`` is done
    pool.submit(units.job("a", 2, due=0.0), pool.clock())
    units.wait_for(1)
    pool.submit(units.job("b", 1, due=0.0), pool.clock() + 10 * LONG_WAIT_S)
    units.wait_for(2)
    assert units.order == ["a", "b"]  # ``b`` ran while the loop still held ``a``
    units.hand_back.set()
    assert units.done["a"].wait(10) and units.done["b"].wait(10)
    pool.stop()
    assert units.order == ["a", "b", "a"]


def test_a_worker_that_takes_the_returned_job_wakes_another_for_the_unit_left_ready() -> None:
    """Two workers: one waits for ``a`` (held by the loop) before ``b``, which is not due
    soon; when ``a`` comes back and a worker takes it, ``b`` is still ready, and another
    worker takes it at once, not when its wait for ``a`` ends."""
    pool = SynthesisPool(2, cpus=2, return_wait_s=LONG_WAIT_S)
    b_ran = threading.Event()
    seen: list[bool] = []
    units = _Units(pool)

    def b_gen() -> Iterator[FloatArray]:
        b_ran.set()
        yield np.zeros(240, np.float32)

    def a_second() -> Iterator[FloatArray]:
        yield np.zeros(240, np.float32)
        seen.append(b_ran.wait(START_WITHIN_S))  # ``b`` runs beside this unit
        yield np.zeros(240, np.float32)

    a = units.job("a", 0, due=-5.0)
    a.start = a_second
    units.hand_back.clear()
    pool.submit(a, pool.clock())
    end = time.monotonic() + 10
    while a.state is not JobState.OUT and time.monotonic() < end:  # the loop holds ``a``
        time.sleep(0.001)
    b_done = threading.Event()
    b = Job(
        start=b_gen,
        token=CancelToken(),
        deliver=lambda step: b_done.set() if step.finished else None,
        meter=PlaybackMeter(),
    )
    pool.submit(b, pool.clock() + 10 * LONG_WAIT_S)
    units.hand_back.set()
    assert units.done["a"].wait(10)
    pool.stop()
    assert seen == [True]
