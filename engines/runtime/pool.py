"""The engine's inference scheduler: a fixed pool of synthesis threads, one deadline queue.

Rule 1: everything that decides *which thread advances which generator when* lives
here. A ``Job`` is one utterance's ``synthesize`` generator. A worker takes the
most urgent ready job (``schedule.DeadlineQueue``), calls ``next()`` on it once,
frames the chunk into packets and hands them to ``Job.deliver`` (the event loop's
side); the loop sends them and re-queues the job with its new deadline
(``requeue``). A job is always in exactly one state (table below), and only a
RUNNING job is touched by a worker, so no generator is ever advanced from two
threads at once.
Rule 2: this file knows no sockets, calls or asyncio; ``deliver`` must be
thread-safe (the loop passes ``call_soon_threadsafe``).
Rule 3: a free worker does not start a unit that is not due soon while the loop holds
a job (``OUT``): that job's next unit comes back within milliseconds and may be due
sooner. The worker waits for it, until ``RETURN_WAIT_S`` after that job went to the
loop (a loop held up longer, by a slow socket say, does not hold the workers up),
unless the ready unit is due within that wait. Without it (three calls on two cores,
``kokoro_capacity.py``), the worker that ended one utterance's unit went on with
another's that had 1-3 s of audio queued, while the first one's listener ran dry
behind it. A worker that takes a unit while another is still ready wakes a further
worker for it (one may be waiting here).

    NEW --submit--> QUEUED --worker pops--> RUNNING --step ends--> OUT | DONE
    OUT --requeue--> QUEUED          (cancelled: queued at the front, only closed)

Rule 4: a new utterance's first unit that is due with every worker busy recalls a
running unit (``schedule`` Rule 3, ``recall_victim``; checked when the first unit is
queued, when a worker takes another unit while it waits, and once more a little later,
``recall_check``): it fires that unit's ``UnitGrant.recall``, and an engine that
honours it ends the unit at once with no audio; the loop requeues the job by its
deadline as after any unit, and the free worker takes the first unit. A recalled
unit's work is lost (its compute), never its audio: it had none yet. ``recalled``
counts the recalls asked for (an engine may ignore one; the unit then runs on, and
no other is recalled meanwhile).

Rule 5: a unit granted several cores holds them (a gang of windows, a wide session), and
so do its helper threads (``UnitGrant.hold``: a gang's other windows still decode after
the unit has yielded its first); a unit taken is granted only the cores nothing holds
but its own job's helpers (their windows are its work: its unit waits for them).
While the running units and helpers hold every core, a free worker leaves a ready unit
that is not an utterance's first until ``CORE_WAIT_MARGIN_S`` before its deadline, or
until a unit ends or a helper gives its core back. Without it (two calls on two cores,
``kokoro_capacity.py``), the other call's unit, parked while its listener had 3 s queued,
became ready during one call's gang of two windows and ran beside it: three decodes on
two cores, the gang took 1.1 s where 0.66 s was planned, and its listener ran dry
(179 ms). A first unit is never left: a sentence's first audio waits for no one (Rule 4
says when it may take a core from a unit instead). The rule counts the cores granted
when the unit began, not those the engine then uses: a unit that narrows itself to one
core still holds back the units of utterances in progress that are not due, until it ends.

Rule 6: a start may claim the cores another utterance's unit holds (``UnitGrant.claim``):
a sentence's first unit taken beside units of other utterances, granted fewer cores than
the machine has, asks for more for its helper threads (the rest of its first window,
decoded beside its first part). From then on, until a helper takes them
(``UnitGrant.take``) or the claim is dropped (``claim(0)``, or its unit ends), those
utterances' later units leave the claimed cores as they leave held ones (Rule 5: until
``CORE_WAIT_MARGIN_S`` before their deadline), so the core a unit gives back goes to the
start. ``claim`` answers when the cores are expected free: the expected end of the units
that hold them (the call table's estimate); ``math.inf`` where one is not known (a
helper's, or no estimate yet). Without it, a call's next sentence beside another call
on two cores decoded its first window on one core, and on a CPU near real time per core
(AMD EPYC Zen 3, AVX2 only) that window had to hold 1-1.5 s of speech: first audio
0.9-1.5 s.

A cancelled job (barge-in, CALL_END, dock lost, shutdown) is moved to the front
of the queue (``cancelled``), where a worker only closes its generator: no more
inference is spent on it. ``stop`` lets the workers close every open job (also
those the loop still holds) and exit.
"""

from __future__ import annotations

import contextvars
import enum
import functools
import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

from engines.runtime.audio import UtteranceFramer
from engines.runtime.cpus import available_cpus
from engines.runtime.playback import PlaybackMeter
from engines.runtime.schedule import (
    START_SLACK_S,
    DeadlineQueue,
    RunningUnit,
    StepEstimate,
    recall_victim,
)
from engines.runtime.synth import (
    CancelToken,
    FloatArray,
    SynthesisCancelled,
    UnitGrant,
    set_unit_grant,
)
from engines.runtime.threads import lower_thread_priority

#: Rule 3: a free worker waits for a job the loop holds until this long after the job went
#: to the loop, before it takes a ready unit that is not due within that time (the loop
#: sends a unit's packets and queues the job's next unit in about a millisecond; a loop
#: held up longer does not hold the workers up with it)
RETURN_WAIT_S = 0.05
#: Rule 5: a free worker leaves a ready unit while the running units hold every core
#: until this long before the unit's deadline (its listener's queue then still covers
#: the unit's expected compute and this margin)
CORE_WAIT_MARGIN_S = 0.3


class JobState(enum.Enum):
    NEW = "new"
    QUEUED = "queued"  # in the deadline queue (maybe parked)
    RUNNING = "running"  # a worker is inside next() or close()
    OUT = "out"  # its packets are with the loop, which will requeue it
    DONE = "done"  # the generator is finished or closed


@dataclass(slots=True)
class Step:
    """What one unit of work produced (handed to the loop)."""

    packets: list[bytes]
    compute_s: float  # time inside next()
    wait_s: float  # time the job waited in the queue while ready
    finished: bool  # the generator is done (or closed); no requeue
    error: BaseException | None = None
    cores: int = 1  # cores the unit was granted (``UnitGrant.cores``)


@dataclass(eq=False)
class Job:
    """One utterance's generator and what the pool needs to advance it."""

    start: Callable[[], Iterator[FloatArray]]  # makes the generator (called by a worker)
    token: CancelToken
    deliver: Callable[[Step], None]  # thread-safe hand-off to the loop
    meter: PlaybackMeter
    ctx: contextvars.Context = field(default_factory=contextvars.copy_context)
    framer: UtteranceFramer = field(default_factory=UtteranceFramer)
    estimate: StepEstimate = field(default_factory=StepEstimate)
    gen: Iterator[FloatArray] | None = None
    state: JobState = JobState.NEW
    steps: int = 0
    compute_s: float = 0.0
    out_at: float = -math.inf  # when its last step went to the loop (``time.monotonic``)


class SynthesisPool:
    """``workers`` threads advancing jobs in deadline order (threads start on first use)."""

    def __init__(
        self,
        workers: int,
        clock: Callable[[], float] = time.monotonic,
        cpus: int | None = None,
        return_wait_s: float = RETURN_WAIT_S,
    ) -> None:
        if workers < 1:
            raise ValueError(f"synthesis workers must be >= 1, got {workers}")
        self.workers = workers
        self.clock = clock
        self.return_wait_s = return_wait_s  # Rule 3
        #: cores the units may use together (``UnitGrant``)
        self.cpus = max(1, cpus if cpus is not None else available_cpus())
        self._cond = threading.Condition()
        self._queue: DeadlineQueue[Job] = DeadlineQueue()
        self._open: set[Job] = set()  # every job not DONE
        self._threads: list[threading.Thread] = []
        self._stopping = False
        self.busy = 0  # workers inside a step
        #: the calls the engine serves now (``UnitGrant.calls``; the call table's count)
        self.live_calls: Callable[[], int] = lambda: 1
        #: Rule 4: the expected compute of a job's next unit, and of a first unit (the
        #: call table's estimates; 0: unknown, and nothing is recalled)
        self.unit_s: Callable[[Job], float] = lambda job: 0.0
        self.first_unit_s: Callable[[], float] = lambda: 0.0
        self._running: dict[Job, _Running] = {}  # Rule 4: the units workers run now
        self.recalled = 0  # recalls asked for (Rule 4)
        self._helpers: dict[Job, int] = {}  # Rule 5: cores each job's helper threads hold
        self._claims: dict[Job, int] = {}  # Rule 6: cores a start waits for, for its helpers

    # -- the loop's side -------------------------------------------------------------------

    def submit(self, job: Job, deadline: float, ready_at: float = -math.inf) -> None:
        with self._cond:
            if self._stopping:
                job.state = JobState.DONE
                job.deliver(Step([], 0.0, 0.0, True))
                return
            self._start_threads()
            job.state = JobState.QUEUED
            self._open.add(job)
            now = self.clock()
            self._queue.push(job, deadline, now, ready_at)
            self._cond.notify()
            self._recall(now)
        job.token.on_cancel(lambda: self.cancelled(job))

    def requeue(self, job: Job, deadline: float, ready_at: float = -math.inf) -> None:
        """The loop has sent the job's last step: queue its next unit."""
        with self._cond:
            if job.state is not JobState.OUT:
                return
            job.state = JobState.QUEUED
            now = self.clock()
            if job.token.cancelled:
                self._queue.push(job, -math.inf, now)
            else:
                self._queue.push(job, deadline, now, ready_at)
            self._cond.notify()

    def cancelled(self, job: Job) -> None:
        """The job's token fired: if it is queued, close it next (no more inference)."""
        with self._cond:
            if job.state is JobState.QUEUED and self._queue.expedite(job, self.clock()):
                self._cond.notify()

    def release(self, job: Job) -> None:
        """The loop gives up on a job it holds (its call task ended): close it soon."""
        job.token.cancel()
        self.requeue(job, -math.inf)

    def stop(self) -> None:
        """Take no new jobs; the workers close every open job, then exit."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()

    def recall_check(self) -> None:
        """Rule 4 once more (the loop calls it twice ``RECALL_WAIT_S`` after queueing a
        first unit: a unit expected to end by then may run on past its estimate)."""
        with self._cond:
            self._recall(self.clock())

    def _recall(self, now: float) -> None:
        """Rule 4 (with the lock held): while a new utterance's first unit is ready and
        due within ``START_SLACK_S`` with every worker busy, recall the running unit
        ``recall_victim`` picks, if any (called when a first unit is queued, and when a
        worker took another unit while one waits)."""
        if self.busy < self.workers or not self._running:
            return
        due = now + START_SLACK_S
        if not any(j.steps == 0 and d <= due for j, d in self._queue.ready_items(now)):
            return
        jobs = list(self._running)
        units = [
            RunningUnit(
                started=r.started,
                expected_s=self.unit_s(job),
                dry_at=job.meter.dry_at(now),
                first=r.first,
                recalled=r.recall.cancelled,
            )
            for job, r in self._running.items()
        ]
        k = recall_victim(units, now, self.first_unit_s())
        if k is not None:
            self.recalled += 1
            self._running[jobs[k]].recall.cancel()

    def live_threads(self) -> int:
        return sum(1 for t in self._threads if t.is_alive())

    def snapshot(self) -> tuple[int, int, int, int]:
        """(queued, parked, busy workers, open jobs)."""
        with self._cond:
            now = self.clock()
            return len(self._queue), self._queue.parked(now), self.busy, len(self._open)

    # -- the workers -----------------------------------------------------------------------

    def _start_threads(self) -> None:
        while len(self._threads) < self.workers:
            th = threading.Thread(
                target=self._work, name=f"synth-worker-{len(self._threads)}", daemon=True
            )
            self._threads.append(th)
            th.start()

    def _grant(self, now: float, job: Job) -> UnitGrant:
        """The cores ``job``'s unit taken now may use (called with the lock held,
        already running): the cores nothing else holds (Rule 5), while no other unit is
        ready and waiting; else one. ``others``: utterances in progress that are not
        parked."""
        waiting = self._queue.ready(now)
        cores = 1 if waiting else max(1, self.cpus - self._cores_held(but=job))
        # utterances parked far ahead of their listener need no inference soon
        others = len(self._open) - self._queue.parked(now) - 1
        calls = max(1, self.live_calls(), others + 1)
        return UnitGrant(cores=cores, cpus=self.cpus, others=max(0, others), calls=calls)

    def _take(self) -> tuple[Job, float, UnitGrant] | None:
        """Block until a job is ready (or, when stopping, any open job); ``None``: exit."""
        with self._cond:
            while True:
                now = self.clock()
                hold = 0.0 if self._stopping else max(self._return_wait(now), self._core_wait(now))
                if hold > 0:  # Rules 3 and 5
                    self._cond.wait(hold)
                    continue
                got = self._queue.pop(now, parked_too=self._stopping)
                if got is None and self._stopping:
                    held = [j for j in self._open if j.state is JobState.OUT]
                    if not held:
                        return None
                    got = (held[0], 0.0)
                if got is not None:
                    job = got[0]
                    job.state = JobState.RUNNING
                    self.busy += 1
                    if self._queue.ready(now):  # the notify this worker waited past
                        self._cond.notify()
                    recall = CancelToken()
                    running = self._running[job] = _Running(now, job.steps == 0, recall)
                    grant = replace(
                        self._grant(now, job),
                        recall=recall,
                        hold=functools.partial(self._hold, job),
                        claim=functools.partial(self._claim, job),
                        take=functools.partial(self._take_core, job),
                    )
                    running.cores = grant.cores
                    self._recall(now)  # a start still waits (Rule 4)
                    return job, got[1], grant
                wake = self._queue.next_ready_at(now)
                self._cond.wait(None if wake is None else max(wake - now, 0.001))

    def _return_wait(self, now: float) -> float:
        """How much longer a free worker waits for a job the loop holds before it takes the
        ready unit (Rule 3; called with the lock held): until ``return_wait_s`` after the
        last job still held was handed to the loop; 0 when none is held (or all for
        longer), none is ready, or the ready unit is due within the wait."""
        held = [j.out_at for j in self._open if j.state is JobState.OUT]
        if self.return_wait_s <= 0 or not held:
            return 0.0
        left = max(held) + self.return_wait_s - time.monotonic()
        if left <= 0:
            return 0.0
        due = self._queue.first_deadline(now)
        return left if due is not None and due - now > left else 0.0

    def _hold(self, job: Job, cores: int) -> None:
        """``job``'s helper threads take (``cores`` > 0) or give back cores
        (``UnitGrant.hold``, Rule 5); a worker that leaves a unit for them is woken."""
        with self._cond:
            held = max(0, self._helpers.get(job, 0) + cores)
            if held:
                self._helpers[job] = held
            else:
                self._helpers.pop(job, None)
            if cores < 0:
                self._cond.notify_all()

    def _claim(self, job: Job, cores: int) -> float:
        """``job``'s start claims ``cores`` more for its helpers (Rule 6; 0: drops its
        claim): seconds until they are expected free (0: free now; ``math.inf``: not
        known, or it may not claim: not its first unit, or no other utterance's unit
        holds a core)."""
        with self._cond:
            running = self._running.get(job)
            if cores <= 0 or running is None or not running.first:
                if self._claims.pop(job, None):
                    self._cond.notify_all()
                return 0.0 if cores <= 0 else math.inf
            self._claims[job] = cores
            return self._free_in(job, cores, self.clock())

    def _free_in(self, job: Job, cores: int, now: float) -> float:
        """Seconds until ``cores`` beyond those ``job`` holds are expected free (Rule 6;
        called with the lock held): by the expected end of the other units that hold
        them; ``math.inf`` where a helper holds one, or a unit's estimate is unknown."""
        short = cores - self._free_for(job)
        if short <= 0:
            return 0.0
        ends: list[float] = []
        for other, r in self._running.items():
            if other is job:
                continue
            expected = self.unit_s(other)
            end = r.started + expected - now if expected > 0 else math.inf
            ends += [max(0.0, end)] * r.cores
        ends += [math.inf] * sum(n for j, n in self._helpers.items() if j is not job)
        ends.sort()
        return ends[short - 1] if len(ends) >= short else math.inf

    def _free_for(self, job: Job) -> int:
        """Cores nothing holds: not ``job``'s unit or helpers, nor anything else's."""
        own = self._running[job].cores if job in self._running else 0
        return self.cpus - self._cores_held(but=job) - own - self._helpers.get(job, 0)

    def _take_core(self, job: Job, timeout: float) -> bool:
        """One of ``job``'s helper threads takes a core it claimed (Rule 6), waiting up to
        ``timeout`` s for one to come free; it holds one either way (``hold``: give it
        back with ``hold(-1)``), the claim one core less. True: a core was free."""
        with self._cond:
            end = self.clock() + max(0.0, timeout)
            while self._free_for(job) < 1:
                left = end - self.clock()
                if left <= 0 or self._stopping:
                    break
                self._cond.wait(left)
            free = self._free_for(job) >= 1
            self._helpers[job] = self._helpers.get(job, 0) + 1
            want = self._claims.pop(job, 0) - 1
            if want > 0:
                self._claims[job] = want
            return free

    def _claimed(self, but: Job) -> int:
        """Cores the starts of every job but ``but`` claim (Rule 6)."""
        return sum(n for j, n in self._claims.items() if j is not but)

    def _cores_held(self, but: Job) -> int:
        """Cores the running units were granted and the helper threads hold, of every
        job but ``but`` (Rule 5: a job's own helpers' windows are its own work, which
        its unit waits for)."""
        units = sum(r.cores for j, r in self._running.items() if j is not but)
        return units + sum(n for j, n in self._helpers.items() if j is not but)

    def _core_wait(self, now: float) -> float:
        """How much longer a free worker leaves the ready unit because the running units
        hold every core (Rule 5; called with the lock held): until ``CORE_WAIT_MARGIN_S``
        before its deadline; 0 while a core is free (its own helpers' cores count as its
        own; cores another job's start claims do not: Rule 6), or for an utterance's
        first unit."""
        got = self._queue.peek(now)
        if got is None or got[0].steps == 0:
            return 0.0
        if self._cores_held(but=got[0]) + self._claimed(but=got[0]) < self.cpus:
            return 0.0
        return max(0.0, got[1] - CORE_WAIT_MARGIN_S - now)

    def _work(self) -> None:
        lower_thread_priority()
        while True:
            got = self._take()
            if got is None:
                return
            job, wait_s, grant = got
            step = Step([], 0.0, wait_s, True)
            set_unit_grant(grant)
            try:
                step = job.ctx.run(self._step, job, wait_s)
                step.cores = grant.cores
            finally:
                set_unit_grant(None)
                with self._cond:
                    self.busy -= 1
                    self._running.pop(job, None)
                    self._claims.pop(job, None)  # a claim ends with its unit (Rule 6)
                    self._cond.notify_all()  # its cores are free (a helper may wait for one)
                    if step.finished:
                        job.state = JobState.DONE
                        self._open.discard(job)
                    else:
                        job.state = JobState.OUT
                        job.out_at = time.monotonic()
                    if self._stopping:
                        self._cond.notify_all()
                job.deliver(step)

    def _step(self, job: Job, wait_s: float) -> Step:
        """One ``next()`` (or the close of a cancelled job), framed into packets."""
        if job.token.cancelled or self._stopping:
            return Step([], 0.0, wait_s, True, _close(job, None))
        t0 = time.perf_counter()
        chunk: FloatArray | None = None
        error: BaseException | None = None
        finished = False
        try:
            if job.gen is None:
                job.gen = job.start()
            chunk = next(job.gen)
        except StopIteration:
            finished = True
        except SynthesisCancelled:
            finished = True
        except BaseException as exc:  # reported on the loop; never kills other calls
            error, finished = exc, True
        compute = time.perf_counter() - t0
        job.steps += 1
        job.compute_s += compute
        packets: list[bytes] = []
        if chunk is not None and not job.token.cancelled:
            packets = list(job.framer.process(chunk))
            job.meter.produced(sum(len(p) for p in packets) // 4)
        if job.framer.truncated or job.token.cancelled:
            finished = True
        if finished:
            error = _close(job, error)
        return Step(packets, compute, wait_s, finished, error)


@dataclass(slots=True)
class _Running:
    """A unit a worker runs (Rule 4): when it began, whether it is its utterance's first,
    and the token that recalls it (``UnitGrant.recall``)."""

    started: float
    first: bool
    recall: CancelToken
    cores: int = 1  # the cores it was granted (Rule 5)


def _close(job: Job, error: BaseException | None) -> BaseException | None:
    """Close the job's generator (runs its ``finally`` blocks) in this worker thread."""
    return close_generator(job.gen, error)


def close_generator(gen: object, error: BaseException | None) -> BaseException | None:
    """Close a synthesis generator; the error to report: ``error``, else one raised while
    closing (a cancellation is not an error)."""
    # getattr: ``synthesize`` returns any iterator; only a generator has ``close``
    close: Callable[[], None] | None = getattr(gen, "close", None)
    if close is not None:
        try:
            close()
        except BaseException as exc:  # a generator that fails while closing
            if error is None and not isinstance(exc, SynthesisCancelled):
                error = exc
    return error
