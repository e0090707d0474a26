"""Per-call workers: the asyncio shell that carries out the call table's decisions.

Rule 1: this file only reads, waits, writes and times. Every decision about a call (open,
queue, cut, end, evict, send or drop, what to count) is ``calltable.CallTable``'s; this
file turns dock events into table calls, carries out the actions it returns (start a
call's worker task, wake it), and drives each utterance's synthesis off the loop.
Rule 2: this file does not know the wire: audio leaves through an ``AudioSink`` (the
dock client; for a protocol request, HTTP or Wyoming, the sink of that request:
``open_request``, ``engines.runtime.requests``), and events arrive as method calls.

The synthesis driver is the engine's inference scheduler (``pool.SynthesisPool``:
``--synth-workers`` threads, one deadline queue, one ``next()`` of an utterance's
generator per unit of work). A synthesiser that schedules across calls itself
(``synth.SelfScheduled``, Qwen3's batch scheduler) instead gets one thread per utterance
(``threaded.UtteranceThreads``; why it is kept is written there).

Deadlines (``schedule``). An utterance's first unit is due when its text was received
(or, if the call is still playing its previous utterance, when that runs dry minus the
engine's estimate of a first unit), so it goes ahead of later units of calls that still
have audio queued. After each unit the utterance is re-queued, due when its listener
runs dry (``playback``: first packet + audio produced, shifted by underruns) minus its
estimated next unit (EMA of its own units, seeded with the engine's), and parked while
more than ``max_ahead_s`` of its audio is queued ahead of playback. The runtime pulls
the next unit only after it has sent the last one (and the dock socket has drained), so
a call whose queue is full stops pulling from synthesis.

Barge-in guarantee: ``on_speech_active`` runs synchronously when the SPEECH_ACTIVE frame
is decoded; the table cancels the utterance's token, and ``_send`` asks the table's gate
immediately before every socket write with no ``await`` in between.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol, cast

import structlog

from engines.runtime.calltable import (
    CALL_IDLE_S,
    MAX_CALLS,
    Action,
    Call,
    CallPhase,
    CallsSnapshot,
    CallTable,
    EngineSettings,
    RequestHooks,
    StartWorker,
    Utterance,
    UtteranceEnd,
)
from engines.runtime.cpus import available_cpus
from engines.runtime.load import LoadSnapshot
from engines.runtime.playback import PlaybackMeter
from engines.runtime.pool import Job, Step, SynthesisPool
from engines.runtime.schedule import MAX_AHEAD_S, RECALL_WAIT_S, SYNTH_WORKERS
from engines.runtime.stats import RuntimeStats
from engines.runtime.synth import (
    ExecutionPlan,
    SelfScheduled,
    Synthesizer,
)
from engines.runtime.threaded import UtteranceThreads

__all__ = [
    "AudioSink",
    "CallManager",
    "CallPhase",
    "EngineSettings",
    "RequestHooks",
    "SynthesisFigures",
]

log = structlog.get_logger(__name__)


class AudioSink(Protocol):
    """Where audio packets go (the dock client)."""

    def send_audio(self, call_id: int, pcm: bytes) -> bool:
        """Stamp and write one packet now; ``False`` when there is no dock link."""

    @property
    def write_paused(self) -> bool: ...

    async def drain(self) -> None: ...


@dataclass(frozen=True, slots=True)
class SynthesisFigures:
    """The synthesis side's figures (``CallManager.synthesis``) for STATS and METRICS.

    ``workers`` and the ``sched_*`` figures are ``None`` for a self-scheduled synthesiser
    (no pool)."""

    running: int  # utterances holding synthesis capacity
    waiting: int  # utterances waiting for it
    max_concurrent: int
    workers: int | None
    queued: int | None = None
    parked: int | None = None
    busy: int | None = None
    open_jobs: int | None = None
    recalled: int | None = None  # recalls asked for a start (pool Rule 4), ever


class _Worker:
    """The asyncio side of one call: the event its task waits on."""

    __slots__ = ("wakeup",)

    def __init__(self) -> None:
        self.wakeup = asyncio.Event()


class CallManager:
    """All calls of the engine; the dock client calls ``on_*`` from the event loop."""

    def __init__(
        self,
        synth: Synthesizer,
        sink: AudioSink,
        stats: RuntimeStats,
        settings: EngineSettings,
        max_concurrent: int,
        *,
        idle_s: float = CALL_IDLE_S,
        max_calls: int = MAX_CALLS,
        clock: Callable[[], float] = time.monotonic,
        synth_workers: int = SYNTH_WORKERS,
        max_ahead_s: float = MAX_AHEAD_S,
    ) -> None:
        if max_concurrent < 1:
            raise ValueError("max_concurrent must be >= 1")
        if synth_workers < 1:
            raise ValueError(f"synth_workers must be >= 1, got {synth_workers}")
        if not max_ahead_s > 0:
            raise ValueError(f"max_ahead_s must be > 0, got {max_ahead_s}")
        self.synth = synth
        self.sink = sink
        self.stats = stats
        self.settings = settings
        self.max_concurrent = max_concurrent
        self.clock = clock  # lifecycle time (idle eviction); tests pass their own
        #: checked once, at load: a self-scheduled synthesiser gets the thread driver
        self.self_scheduled = isinstance(synth, SelfScheduled) and synth.self_scheduled
        self.synth_workers = synth_workers
        #: the inference scheduler; None for a self-scheduled synthesiser
        self.pool = None if self.self_scheduled else SynthesisPool(synth_workers)
        self.table = CallTable(
            stats,
            settings,
            cpus=available_cpus() if self.pool is None else self.pool.cpus,
            idle_s=idle_s,
            max_calls=max_calls,
            max_ahead_s=max_ahead_s,
            playback_clock=time.monotonic,
        )
        if self.pool is not None:
            self.pool.live_calls = lambda: len(self.table.calls)
            self.pool.unit_s = lambda job: self.table.next_unit_s(job.estimate, 0.0)
            self.pool.first_unit_s = lambda: self.table.first_unit.value
        self._capacity = asyncio.Semaphore(max_concurrent)  # utterances synthesised at once
        self.waiting = 0  # utterances waiting for synthesis capacity
        self.running = 0  # utterances holding it
        self._workers: dict[Call, _Worker] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        #: the thread-per-utterance driver; None when the pool drives synthesis
        self.threaded = UtteranceThreads(synth) if self.self_scheduled else None

    # -- what the table holds (read-only views) ----------------------------------------

    @property
    def calls(self) -> OrderedDict[int, Call]:
        """Live calls, least recently active first (the table's; tests read it)."""
        return self.table.calls

    @property
    def calls_evicted(self) -> dict[str, int]:
        return self.table.calls_evicted

    @property
    def closing(self) -> bool:
        return self.table.closing

    @property
    def max_ahead_s(self) -> float:
        return self.table.max_ahead_s

    @max_ahead_s.setter
    def max_ahead_s(self, value: float) -> None:
        self.table.max_ahead_s = value

    def is_open(self, call_id: int) -> bool:
        return self.table.is_open(call_id)

    def active_calls(self) -> int:
        return len(self.table.calls)

    def snapshot(self, limit: int) -> CallsSnapshot:
        """The calls' figures (at most ``limit`` listed one by one): STATS, METRICS."""
        return self.table.snapshot(limit)

    def synthesis(self) -> SynthesisFigures:
        """The synthesis side's figures: capacity in use and the pool's queue."""
        pool = self.pool
        if pool is None:
            return SynthesisFigures(self.running, self.waiting, self.max_concurrent, None)
        queued, parked, busy, open_jobs = pool.snapshot()
        return SynthesisFigures(
            self.running,
            self.waiting,
            self.max_concurrent,
            pool.workers,
            queued,
            parked,
            busy,
            open_jobs,
            pool.recalled,
        )

    # -- events from the dock (all synchronous, on the loop) -------------------------------

    def on_text(self, call_id: int, payload: bytes, t_rx_ns: int) -> None:
        self._apply(self.table.text(call_id, payload, t_rx_ns, self.clock()))

    def on_speech_active(self, call_id: int, t_rx_ns: int) -> None:
        self._apply(self.table.speech_active(call_id, t_rx_ns, self.clock(), time.monotonic_ns()))

    def on_speech_idle(self, call_id: int) -> None:
        self._apply(self.table.speech_idle(call_id, self.clock()))

    def on_call_end(self, call_id: int) -> None:
        self._apply(self.table.call_end(call_id))

    def set_call_voice(self, call_id: int, voice: str | None) -> None:
        """SET_CALL_VOICE: the call's own voice (``None``: the engine's); ``CallTable``."""
        self.table.set_call_voice(call_id, voice, self.clock())

    def on_link_lost(self) -> None:
        self.table.link_lost()

    def open_request(self, call_id: int, sink: AudioSink, hooks: RequestHooks) -> None:
        """Open a call for a protocol request (HTTP, Wyoming; ``engines.runtime.requests``):
        a call like a docked one (text through ``on_text``, cancel through
        ``on_speech_active``, end through ``on_call_end``), whose audio goes to ``sink``."""
        self._apply(self.table.open_request(call_id, sink, hooks, self.clock()))

    def stop_intake(self) -> None:
        """Take no new work from now on (shutdown has begun); calls finish or are closed."""
        self.table.closing = True

    def sweep(self) -> int:
        """Evict idle calls and enforce ``max_calls`` now; the number evicted."""
        actions = self.table.sweep(self.clock())
        self._apply(actions)
        return len(actions)

    async def sweep_forever(self) -> None:
        """The engine's idle-call sweeper task (``Engine.start``)."""
        interval = min(max(self.table.idle_s / 4, 0.01), 30.0)
        while not self.table.closing:
            await asyncio.sleep(interval)
            self.sweep()

    async def close(self, grace: float) -> None:
        """Stop taking work, cancel every synthesis, wait up to ``grace`` s for workers."""
        self._apply(self.table.close())
        tasks = set(self._tasks)
        if tasks:
            _done, pending = await asyncio.wait(tasks, timeout=grace)
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.wait(pending, timeout=0.1)
        if self.pool is not None:
            self.pool.stop()  # the workers close what is left, then exit

    def load_snapshot(self) -> LoadSnapshot:
        """Utilisation, capacity and headroom now (``load.py``); the engine's own capacity
        estimate stands in until enough work was measured."""
        estimate = self.synth.plan().capacity if isinstance(self.synth, ExecutionPlan) else None
        return self.table.load_snapshot(time.monotonic(), estimate)

    def headroom_calls(self) -> float | None:
        """How many more calls the engine predicts it can take (None: unknown)."""
        return self.load_snapshot().headroom_calls

    def live_threads(self) -> int:
        """Synthesis threads still alive (pool workers or self-scheduled threads)."""
        pool = 0 if self.pool is None else self.pool.live_threads()
        return pool + (0 if self.threaded is None else self.threaded.live())

    # -- carrying out the table's actions ------------------------------------------------

    def _apply(self, actions: Iterable[Action]) -> None:
        for action in actions:
            call = action.call
            if isinstance(action, StartWorker):
                self._start(call)
            else:
                worker = self._workers.get(call)
                if worker is not None:
                    worker.wakeup.set()

    def _start(self, call: Call) -> None:
        if call.sink is None:
            call.sink = self.sink
        self._workers[call] = _Worker()
        ctx = contextvars.copy_context()
        task = asyncio.get_running_loop().create_task(
            self._run(call), name=f"call-{call.call_id}", context=ctx
        )
        call.task = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(lambda _t: self._workers.pop(call, None))

    # -- the worker ------------------------------------------------------------------------

    async def _run(self, call: Call) -> None:
        structlog.contextvars.bind_contextvars(call_id=call.call_id)
        worker = self._workers[call]
        while not call.closed:
            utt = self.table.next_utterance(call, self.clock())
            if utt is None:
                worker.wakeup.clear()
                await worker.wakeup.wait()
                continue
            try:
                await self._speak(call, utt)
            except asyncio.CancelledError:
                utt.token.cancel()
                raise
            except Exception:  # a runtime bug must not take the other calls down
                log.exception("utterance_crashed", call_id=call.call_id)
                utt.token.cancel()
            finally:
                self.table.utterance_done(call)

    async def _speak(self, call: Call, utt: Utterance) -> None:
        self.waiting += 1
        try:
            await self._capacity.acquire()
        finally:
            self.waiting -= 1
        self.running += 1
        try:
            if self.table.admitted(call, utt, time.monotonic_ns()):
                await self._synthesize(call, utt)
        finally:
            self.running -= 1
            self._capacity.release()

    async def _synthesize(self, call: Call, utt: Utterance) -> None:
        meter = self.table.begin(call, utt)
        try:
            if self.threaded is not None:
                end = await self._run_threaded(call, utt, meter, self.threaded)
            else:
                assert self.pool is not None
                end = await self._run_pooled(call, utt, meter, self.pool)
        finally:
            self.table.end(call, meter)
        self.table.finished(call, utt, end, time.monotonic_ns())

    async def _run_threaded(
        self, call: Call, utt: Utterance, meter: PlaybackMeter, threaded: UtteranceThreads
    ) -> UtteranceEnd:
        """One utterance in its own thread (a self-scheduled synthesiser)."""
        sink = self._sink(call)

        async def pace() -> None:
            if sink.write_paused:
                await sink.drain()

        return await threaded.run(
            call.call_id,
            call.state,
            utt.text,
            utt.token,
            meter,
            lambda pcm: self._send(call, utt, pcm),
            pace,
        )

    @staticmethod
    def _sink(call: Call) -> AudioSink:
        """Where the call's audio goes (the table carries it untyped; ``_start`` sets it)."""
        return cast(AudioSink, call.sink)

    async def _run_pooled(
        self, call: Call, utt: Utterance, meter: PlaybackMeter, pool: SynthesisPool
    ) -> UtteranceEnd:
        """One utterance through the inference scheduler: send each unit's packets, then
        queue its next unit by deadline.

        A cancelled utterance (barge-in, CALL_END, dock lost) ends here at once; the pool
        closes its generator first thing (it is queued ahead of everything, so before the
        call's next utterance starts its first unit)."""
        loop = asyncio.get_running_loop()
        steps: asyncio.Queue[Step | None] = asyncio.Queue()  # None: the token fired
        sink = self._sink(call)

        def deliver(step: Step | None) -> None:  # in a pool worker (or the canceller)
            try:
                loop.call_soon_threadsafe(steps.put_nowait, step)
            except RuntimeError:  # loop closed: the process is exiting
                pass

        st = call.state
        job = Job(
            start=lambda: self.synth.synthesize(utt.text, st, utt.token),
            token=utt.token,
            deliver=deliver,
            meter=meter,
        )
        pool.submit(job, self.table.first_deadline(call, utt))
        # pool Rule 4 again once a unit expected to end soon may have run on past it
        recheck = loop.call_later(2 * RECALL_WAIT_S, pool.recall_check)
        utt.token.on_cancel(lambda: deliver(None))
        end: UtteranceEnd | None = None
        cancelled = False
        try:
            while True:
                step = await steps.get()
                if step is None:
                    cancelled = True
                    end = UtteranceEnd(job.framer.samples_out, job.framer.truncated, None)
                    break
                self.table.unit(
                    call,
                    utt,
                    job.estimate,
                    compute_s=step.compute_s,
                    cores=step.cores,
                    wait_s=step.wait_s,
                    packets=step.packets,
                    now=time.monotonic(),
                )
                for i, pcm in enumerate(step.packets):
                    # a unit can be seconds of audio: while the dock pushes back, the rest
                    # waits here, where a barge-in (the gate in _send) still drops it
                    if i and sink.write_paused:
                        await sink.drain()
                    self._send(call, utt, pcm, unit_start=i == 0)
                if step.finished:
                    end = UtteranceEnd(job.framer.samples_out, job.framer.truncated, step.error)
                    break
                if sink.write_paused:
                    await sink.drain()
                deadline, ready_at = self.table.next_deadline(
                    utt, job.estimate, step.compute_s, time.monotonic()
                )
                pool.requeue(job, deadline, ready_at)
        finally:
            recheck.cancel()
            if end is None or cancelled:  # the pool closes the generator
                pool.release(job)
        return end

    def _send(self, call: Call, utt: Utterance, pcm: bytes, unit_start: bool = True) -> None:
        """Write one packet of the utterance now, unless the table's gate drops it."""
        # Barge-in gate: nothing may run between this check and the write.
        if not self.table.gate(call, utt):
            return
        if not self._sink(call).send_audio(call.call_id, pcm):
            self.table.unsent(call, utt)
            return
        self.table.sent(call, utt, len(pcm) // 4, time.monotonic_ns(), unit_start)
