"""Per-call workers: FIFO text queues, barge-in, CALL_END, and the synthesis threads.

Rule 1: everything a call id owns lives here: its ``CallState``, its text
queue, its lifecycle phase (a small transition table, below) and the one
utterance it is speaking. All of it is touched only on the event loop; the
synthesis itself runs off the loop: by default in the engine's inference
scheduler (``pool.SynthesisPool``: ``--synth-workers`` threads, one deadline
queue, one ``next()`` of an utterance's generator per unit of work), or, for a
synthesiser that sets ``self_scheduled``, in a thread per utterance that hands
packets to the loop through a bounded ``ChunkChannel``.

Deadlines (``schedule``). An utterance's first unit is due when its text was
received (or, if the call is still playing its previous utterance, when that
runs dry minus the engine's estimate of a first unit), so it goes ahead of
later units of calls that still have audio queued. After each unit the
utterance is re-queued, due when its listener runs dry (``playback``: first
packet + audio produced, shifted by underruns) minus its estimated next unit
(EMA of its own units, seeded with the engine's), and parked while more than
``max_ahead_s`` of its audio is queued ahead of playback. The runtime pulls the
next unit only after it has sent the last one (and the dock socket has drained),
so a call whose queue is full stops pulling from synthesis.
Rule 2: this file does not know the wire: audio leaves through an
``AudioSink`` (the dock client; for a protocol request, HTTP or Wyoming, the
sink of that request: ``open_request``, ``engines.runtime.requests``), and
events arrive as method calls.

Barge-in guarantee: ``on_speech_active`` runs synchronously when the
SPEECH_ACTIVE frame is decoded; it cancels the utterance's token, and the
sender checks that token immediately before every socket write with no
``await`` in between, so no audio packet of that call is written after the
SPEECH_ACTIVE frame has been processed (packets already produced are dropped
and counted as ``packets_suppressed``).

Bounded calls: a call whose CALL_END never arrives (LLaMA crashed, a dock
restart lost it) must not keep its worker forever. A call that is not
speaking (nothing queued, no utterance in progress) is evicted after
``idle_s`` without any event of its own, and when more than ``max_calls``
calls are live the least recently active idle call is evicted to make room.
A speaking call is never evicted. An evicted call that later gets text simply
reopens (fresh ``CallState``). Evictions are counted (``calls_evicted``) and
logged (``call_evicted``).
"""

from __future__ import annotations

import asyncio
import contextvars
import enum
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import structlog

from engines.runtime.audio import UtteranceFramer
from engines.runtime.load import LoadMeter, LoadSnapshot
from engines.runtime.playback import PlaybackMeter
from engines.runtime.pool import Job, Step, SynthesisPool, close_generator
from engines.runtime.schedule import (
    MAX_AHEAD_S,
    SYNTH_WORKERS,
    StepEstimate,
    deadline_for,
    start_deadline,
)
from engines.runtime.stats import RuntimeStats
from engines.runtime.synth import (
    SAMPLE_RATE,
    CallState,
    CancelToken,
    ExecutionPlan,
    SynthesisCancelled,
    SynthesisError,
    Synthesizer,
    available_cpus,
)
from engines.runtime.threads import lower_thread_priority
from svc.lru import EndedCalls

log = structlog.get_logger(__name__)

CHANNEL_PACKETS = 32  # packets (<= 200 ms each) a synthesis thread may run ahead of the socket
MAX_QUEUED_TEXTS = 256  # per call; more text is dropped (counted, logged)
ENDED_MEMORY = 1000  # WIRE.md 2: remember at least the last 1000 ended call ids
SLOT_POLL = 0.1  # seconds: a blocked producer re-checks its cancel token this often
CALL_IDLE_S = 600.0  # a call silent (no text, no speech event) this long is evicted
MAX_CALLS = 4096  # live calls kept; beyond, the least recently active idle call is evicted


class CallPhase(enum.Enum):
    IDLE = "idle"  # no text pending
    SPEAKING = "speaking"  # an utterance is queued or being spoken
    INTERRUPTED = "interrupted"  # the caller is speaking (barge-in); nothing queued
    ENDED = "ended"  # terminal


class CallInput(enum.Enum):
    TEXT = "text"
    DRAINED = "drained"  # the worker finished an utterance and its queue is empty
    SPEECH_ACTIVE = "speech_active"
    SPEECH_IDLE = "speech_idle"
    CALL_END = "call_end"


_P, _I = CallPhase, CallInput
#: The call lifecycle (STYLE.md 1). A missing key is a bug: ``CallStateError``.
#: Text that arrives while the caller is speaking is queued and spoken: the
#: barge-in cancels what was queued or speaking when SPEECH_ACTIVE arrived.
TRANSITIONS: dict[CallPhase, dict[CallInput, CallPhase]] = {
    _P.IDLE: {
        _I.TEXT: _P.SPEAKING,
        _I.DRAINED: _P.IDLE,
        _I.SPEECH_ACTIVE: _P.INTERRUPTED,
        _I.SPEECH_IDLE: _P.IDLE,
        _I.CALL_END: _P.ENDED,
    },
    _P.SPEAKING: {
        _I.TEXT: _P.SPEAKING,
        _I.DRAINED: _P.IDLE,
        _I.SPEECH_ACTIVE: _P.INTERRUPTED,
        _I.SPEECH_IDLE: _P.SPEAKING,
        _I.CALL_END: _P.ENDED,
    },
    _P.INTERRUPTED: {
        _I.TEXT: _P.SPEAKING,
        _I.DRAINED: _P.INTERRUPTED,
        _I.SPEECH_ACTIVE: _P.INTERRUPTED,
        _I.SPEECH_IDLE: _P.IDLE,
        _I.CALL_END: _P.ENDED,
    },
    _P.ENDED: {},
}


class CallStateError(RuntimeError):
    """An input the lifecycle table does not allow (a runtime bug, never a peer's)."""


def transition(phase: CallPhase, event: CallInput) -> CallPhase:
    try:
        return TRANSITIONS[phase][event]
    except KeyError:
        raise CallStateError(f"{event.value} not allowed in phase {phase.value}") from None


class AudioSink(Protocol):
    """Where audio packets go (the dock client)."""

    def send_audio(self, call_id: int, pcm: bytes) -> bool:
        """Stamp and write one packet now; ``False`` when there is no dock link."""

    @property
    def write_paused(self) -> bool: ...

    async def drain(self) -> None: ...


class RequestHooks(Protocol):
    """What a protocol request adds to its call: its own voice and speed (``None``: the
    engine's), and a callback after each of its utterances (done, failed or cancelled)."""

    voice: str | None
    speed: float | None

    def utterance_ended(self) -> None: ...


@dataclass
class EngineSettings:
    """Engine-wide settings changed from the cmd port; snapshotted per utterance."""

    voice: str | None = None
    speed: float = 1.0


class _End:
    __slots__ = ("error", "samples", "truncated")

    def __init__(self, samples: int, truncated: bool, error: BaseException | None) -> None:
        self.samples = samples
        self.truncated = truncated
        self.error = error


class ChunkChannel:
    """Thread -> loop hand-off of packet PCM, bounded at ``size`` packets in flight.

    The producer thread takes a slot per packet (blocking while the loop is
    behind, re-checking its cancel token every ``SLOT_POLL``) and posts with
    ``call_soon_threadsafe``; the consumer frees the slot when it takes the
    packet. The end marker needs no slot, so the producer can always finish.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, size: int = CHANNEL_PACKETS) -> None:
        self._loop = loop
        self._queue: asyncio.Queue[bytes | _End] = asyncio.Queue()
        self._slots = threading.Semaphore(size)

    def put(self, pcm: bytes, token: CancelToken) -> bool:
        while not self._slots.acquire(timeout=SLOT_POLL):
            if token.cancelled:
                return False
        return self._post(pcm)

    def finish(self, samples: int, truncated: bool, error: BaseException | None) -> None:
        self._post(_End(samples, truncated, error))

    def _post(self, item: bytes | _End) -> bool:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # loop closed: the process is exiting
            return False
        return True

    async def get(self) -> bytes | _End:
        item = await self._queue.get()
        if not isinstance(item, _End):
            self._slots.release()
        return item


@dataclass
class Utterance:
    text: str
    t_rx_ns: int
    token: CancelToken = field(default_factory=CancelToken)
    t_bargein_ns: int | None = None
    packets: int = 0
    meter: PlaybackMeter | None = None
    ttfa_ms: float | None = None
    ahead_min_s: float = float("inf")  # queued-ahead audio when a later unit arrived
    ahead_max_s: float = 0.0
    steps: int = 0
    compute_s: float = 0.0
    wait_s: float = 0.0  # time its units waited in the scheduler while ready


class CallWorker:
    """One call id: state, FIFO text queue, phase, and the task that speaks it."""

    def __init__(self, call_id: int, sink: AudioSink) -> None:
        self.state = CallState(call_id)
        self.sink = sink  # where its audio goes: the dock, or a protocol request's client
        self.request: RequestHooks | None = None  # set for a protocol request (``open_request``)
        self.phase = CallPhase.IDLE
        self.queue: deque[tuple[str, int]] = deque()
        self.current: Utterance | None = None
        self.closed = False
        self.wakeup = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.utterances = 0
        self.packets = 0
        self.bargeins = 0
        self.last_active = 0.0  # clock time of the call's last event (or end of speech)
        self.play_until = 0.0  # monotonic time its listener runs dry of the audio sent
        self.last_ttfa_ms = 0.0
        self.underruns = 0
        self.underrun_ms = 0.0

    @property
    def call_id(self) -> int:
        return self.state.call_id

    def apply(self, event: CallInput) -> None:
        new = transition(self.phase, event)
        if new is not self.phase:
            log.debug(
                "call_phase_changed",
                call_id=self.call_id,
                old=self.phase.value,
                new=new.value,
                cause=event.value,
            )
            self.phase = new

    def cut(self, t_ns: int | None = None) -> bool:
        """Clear the queue and cancel the utterance in progress; ``True`` if anything was cut."""
        cut = bool(self.queue)
        self.queue.clear()
        self.play_until = 0.0  # what was queued at the listener is flushed
        cur = self.current
        if cur is not None and not cur.token.cancelled:
            cur.token.cancel()
            cur.t_bargein_ns = t_ns
            cut = True
        return cut

    def depth(self) -> int:
        return len(self.queue) + (1 if self.current is not None else 0)

    def ahead_s(self) -> float:
        """Audio of the utterance in progress queued ahead of its listener (0 if none)."""
        cur = self.current
        if cur is None or cur.meter is None or not cur.meter.started:
            return 0.0
        return cur.meter.ahead_s()

    @property
    def idle(self) -> bool:
        """Nothing queued, nothing being spoken: the call may be evicted."""
        return self.phase is not CallPhase.SPEAKING and not self.queue and self.current is None


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
        if not idle_s > 0:
            raise ValueError(f"call idle time must be > 0 s, got {idle_s}")
        if max_calls < 1:
            raise ValueError(f"max_calls must be >= 1, got {max_calls}")
        self.synth = synth
        self.sink = sink
        self.stats = stats
        self.settings = settings
        self.max_concurrent = max_concurrent
        self.idle_s = idle_s
        self.max_calls = max_calls
        self.clock = clock
        #: live calls, least recently active first (``_touch`` moves a call to the end)
        self.calls: OrderedDict[int, CallWorker] = OrderedDict()
        self.calls_evicted: dict[str, int] = {"idle": 0, "cap": 0}
        self._ended = EndedCalls(ENDED_MEMORY)
        self._sem = asyncio.Semaphore(max_concurrent)
        self.waiting = 0  # utterances waiting for a synthesis slot
        self.running = 0  # utterances holding a slot
        self._tasks: set[asyncio.Task[None]] = set()
        self.threads: set[threading.Thread] = set()  # self-scheduled utterance threads
        self.closing = False
        self.self_scheduled = bool(getattr(synth, "self_scheduled", False))
        self.synth_workers = synth_workers
        self.max_ahead_s = max_ahead_s
        #: the inference scheduler; None for a self-scheduled synthesiser
        self.pool = None if self.self_scheduled else SynthesisPool(synth_workers)
        #: utilisation and headroom over the pool's recent units (``load.py``)
        self.load = LoadMeter(available_cpus() if self.pool is None else self.pool.cpus)
        self.first_unit = StepEstimate()  # engine-wide compute of an utterance's first unit
        self.later_unit = StepEstimate()  # ... and of its later units

    # -- events from the dock (all synchronous, on the loop) -------------------------------

    def on_text(self, call_id: int, payload: bytes, t_rx_ns: int) -> None:
        self.stats.texts_received += 1
        text = payload.decode("utf-8", errors="replace").strip()
        if not text:
            log.debug("text_ignored", call_id=call_id, reason="empty")
            return
        if self.closing:
            self._drop(call_id, "shutting_down")
            return
        w = self.calls.get(call_id)
        if w is None:
            if call_id in self._ended:
                self._ended.discard(call_id)
                log.info("call_reopened", call_id=call_id)
            w = self._open(call_id)
        self._touch(w)
        if len(w.queue) >= MAX_QUEUED_TEXTS:
            self._drop(call_id, "queue_full")
            return
        w.queue.append((text, t_rx_ns))
        w.apply(CallInput.TEXT)
        w.wakeup.set()

    def on_speech_active(self, call_id: int, t_rx_ns: int) -> None:
        w = self.calls.get(call_id)
        if w is None:
            if call_id in self._ended or self.closing:
                return
            w = self._open(call_id)
        self._touch(w)
        if w.cut(t_rx_ns):
            w.bargeins += 1
            self.stats.bargeins += 1
            self.stats.bargein_mute.add((time.monotonic_ns() - t_rx_ns) / 1e6)
            log.info("bargein_applied", call_id=call_id)
        w.apply(CallInput.SPEECH_ACTIVE)

    def on_speech_idle(self, call_id: int) -> None:
        w = self.calls.get(call_id)
        if w is None:
            if call_id in self._ended or self.closing:
                return
            w = self._open(call_id)  # prewarm: the caller will likely get an answer soon
        self._touch(w)
        w.apply(CallInput.SPEECH_IDLE)

    def on_call_end(self, call_id: int) -> None:
        w = self.calls.pop(call_id, None)
        self._ended.add(call_id)
        if w is None:
            return
        w.apply(CallInput.CALL_END)
        w.cut()
        w.closed = True
        w.wakeup.set()
        self.stats.calls_ended += 1
        log.info("call_ended", call_id=call_id, utterances=w.utterances, packets=w.packets)

    def on_link_lost(self) -> None:
        """The dock is gone: abandon every call's pending audio (the new dock would not
        know these utterances); calls keep their state (voice, prosody)."""
        abandoned = 0
        for w in self.calls.values():
            if w.request is None and w.cut():  # a protocol request's client is still there
                abandoned += 1
        if abandoned:
            log.info("utterances_abandoned", calls=abandoned, reason="dock_lost")

    def open_request(self, call_id: int, sink: AudioSink, hooks: RequestHooks) -> None:
        """Open a call for a protocol request (HTTP, Wyoming; ``engines.runtime.requests``):
        a call like a docked one (text through ``on_text``, cancel through
        ``on_speech_active``, end through ``on_call_end``), whose audio goes to ``sink``."""
        if call_id in self.calls:
            raise ValueError(f"call {call_id} is already open")
        w = self._open(call_id)
        w.sink = sink
        w.request = hooks

    # -- lifecycle -------------------------------------------------------------------------

    def _touch(self, w: CallWorker) -> None:
        w.last_active = self.clock()
        if self.calls.get(w.call_id) is w:
            self.calls.move_to_end(w.call_id)

    def _open(self, call_id: int) -> CallWorker:
        if len(self.calls) >= self.max_calls:
            self._evict_over_cap(self.max_calls - 1)
        w = CallWorker(call_id, self.sink)
        w.last_active = self.clock()
        self.calls[call_id] = w
        self.stats.calls_started += 1
        ctx = contextvars.copy_context()
        task = asyncio.get_running_loop().create_task(
            self._run(w), name=f"call-{call_id}", context=ctx
        )
        w.task = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        log.debug("call_opened", call_id=call_id)
        return w

    def _evict(self, w: CallWorker, reason: str) -> None:
        """Forget an idle call without CALL_END; its worker task ends at once."""
        assert w.idle, "a speaking call is never evicted"
        del self.calls[w.call_id]
        w.apply(CallInput.CALL_END)
        w.closed = True
        w.wakeup.set()
        self.calls_evicted[reason] += 1
        log.info(
            "call_evicted",
            call_id=w.call_id,
            reason=reason,
            idle_s=round(self.clock() - w.last_active, 1),
            utterances=w.utterances,
            live=len(self.calls),
        )

    def _evict_over_cap(self, keep: int) -> int:
        """Evict least recently active idle calls until at most ``keep`` remain."""
        evicted = 0
        if len(self.calls) <= keep:
            return 0
        for w in list(self.calls.values()):  # least recently active first
            if len(self.calls) <= keep:
                break
            if w.idle:
                self._evict(w, "cap")
                evicted += 1
        if len(self.calls) > keep:
            log.warning("calls_over_cap", live=len(self.calls), cap=self.max_calls)
        return evicted

    def sweep(self) -> int:
        """Evict calls idle for ``idle_s`` or more, then enforce ``max_calls``; the count."""
        limit = self.clock() - self.idle_s
        evicted = 0
        for w in list(self.calls.values()):
            if w.last_active > limit:
                break  # ordered by activity: every later call is more recent
            if w.idle:
                self._evict(w, "idle")
                evicted += 1
        return evicted + self._evict_over_cap(self.max_calls)

    async def sweep_forever(self) -> None:
        """The engine's idle-call sweeper task (``Engine.start``)."""
        interval = min(max(self.idle_s / 4, 0.01), 30.0)
        while not self.closing:
            await asyncio.sleep(interval)
            self.sweep()

    def _drop(self, call_id: int, reason: str) -> None:
        self.stats.texts_dropped += 1
        log.warning("text_dropped", call_id=call_id, reason=reason)

    async def close(self, grace: float) -> None:
        """Stop taking work, cancel every synthesis, wait up to ``grace`` s for workers."""
        self.closing = True
        for call_id in list(self.calls):
            w = self.calls.pop(call_id)
            w.cut()
            w.closed = True
            w.wakeup.set()
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
        return self.load.snapshot(time.monotonic(), estimate)

    def headroom_calls(self) -> float | None:
        """How many more calls the engine predicts it can take (None: unknown)."""
        return self.load_snapshot().headroom_calls

    def live_threads(self) -> int:
        """Synthesis threads still alive (pool workers or self-scheduled threads)."""
        pool = 0 if self.pool is None else self.pool.live_threads()
        return pool + sum(1 for t in list(self.threads) if t.is_alive())

    # -- the worker ------------------------------------------------------------------------

    async def _run(self, w: CallWorker) -> None:
        structlog.contextvars.bind_contextvars(call_id=w.call_id)
        while not w.closed:
            if not w.queue:
                w.apply(CallInput.DRAINED)
                if w.utterances:  # idle time counts from the end of the last utterance
                    self._touch(w)
                w.wakeup.clear()
                await w.wakeup.wait()
                continue
            text, t_rx_ns = w.queue.popleft()
            utt = Utterance(text, t_rx_ns)
            w.current = utt
            try:
                await self._speak(w, utt)
            except asyncio.CancelledError:
                utt.token.cancel()
                raise
            except Exception:  # a runtime bug must not take the other calls down
                log.exception("utterance_crashed", call_id=w.call_id)
                utt.token.cancel()
            finally:
                w.current = None
                if w.request is not None:
                    w.request.utterance_ended()

    async def _speak(self, w: CallWorker, utt: Utterance) -> None:
        self.waiting += 1
        try:
            await self._sem.acquire()
        finally:
            self.waiting -= 1
        self.running += 1
        try:
            if utt.token.cancelled or w.closed:
                self.stats.utterances_cancelled += 1
                return
            self.stats.queue_wait.add((time.monotonic_ns() - utt.t_rx_ns) / 1e6)
            await self._synthesize(w, utt)
        finally:
            self.running -= 1
            self._sem.release()

    async def _synthesize(self, w: CallWorker, utt: Utterance) -> None:
        st = w.state
        req = w.request
        st.voice = self.settings.voice if req is None or req.voice is None else req.voice
        st.speed = self.settings.speed if req is None or req.speed is None else req.speed
        st.utterances += 1
        w.utterances += 1
        self.stats.utterances_started += 1
        # the listener still plays the call's previous utterance (text came meanwhile)
        playing = w.play_until > utt.t_rx_ns / 1e9
        meter = PlaybackMeter(not_before=w.play_until if playing else 0.0)
        utt.meter = meter
        st.playback = meter
        log.debug("utterance_started", call_id=w.call_id, chars=len(utt.text))
        try:
            if self.pool is None:
                end = await self._run_thread(w, utt, meter)
            else:
                end = await self._run_pooled(w, utt, meter, self.pool)
        finally:
            if st.playback is meter:
                st.playback = None
        self._finished(w, utt, end)

    async def _run_pooled(
        self, w: CallWorker, utt: Utterance, meter: PlaybackMeter, pool: SynthesisPool
    ) -> _End:
        """One utterance through the inference scheduler: send each unit's packets, then
        queue its next unit by deadline.

        A cancelled utterance (barge-in, CALL_END, dock lost) ends here at once; the pool
        closes its generator first thing (it is queued ahead of everything, so before the
        call's next utterance starts its first unit)."""
        loop = asyncio.get_running_loop()
        steps: asyncio.Queue[Step | None] = asyncio.Queue()  # None: the token fired

        def deliver(step: Step | None) -> None:  # in a pool worker (or the canceller)
            try:
                loop.call_soon_threadsafe(steps.put_nowait, step)
            except RuntimeError:  # loop closed: the process is exiting
                pass

        st = w.state
        job = Job(
            start=lambda: self.synth.synthesize(utt.text, st, utt.token),
            token=utt.token,
            deliver=deliver,
            meter=meter,
        )
        pool.submit(job, start_deadline(utt.t_rx_ns / 1e9, w.play_until, self.first_unit.value))
        utt.token.on_cancel(lambda: deliver(None))
        end: _End | None = None
        cancelled = False
        try:
            while True:
                step = await steps.get()
                if step is None:
                    cancelled = True
                    end = _End(job.framer.samples_out, job.framer.truncated, None)
                    break
                self._account(w, utt, job, step)
                for i, pcm in enumerate(step.packets):
                    # a unit can be seconds of audio: while the dock pushes back, the rest
                    # waits here, where a barge-in (the gate in _send) still drops it
                    if i and w.sink.write_paused:
                        await w.sink.drain()
                    self._send(w, utt, pcm, unit_start=i == 0)
                if step.finished:
                    end = _End(job.framer.samples_out, job.framer.truncated, step.error)
                    break
                if w.sink.write_paused:
                    await w.sink.drain()
                now = time.monotonic()
                deadline, ready_at = deadline_for(
                    meter.dry_at(now), self._next_unit_s(job, step), self.max_ahead_s
                )
                pool.requeue(job, deadline, ready_at)
        finally:
            if end is None or cancelled:  # the pool closes the generator
                pool.release(job)
        return end

    def _account(self, w: CallWorker, utt: Utterance, job: Job, step: Step) -> None:
        if step.compute_s <= 0 and not step.packets:
            return  # a close, not a unit of work
        audio_s = sum(len(p) for p in step.packets) / 4 / SAMPLE_RATE
        self.load.unit(time.monotonic(), step.compute_s * step.cores, audio_s, w.call_id)
        utt.compute_s += step.compute_s
        utt.wait_s += step.wait_s
        self.stats.sched_wait.add(step.wait_s * 1000)
        if not step.packets:
            return  # the generator's end: not a unit whose time predicts the next one
        utt.steps += 1
        if utt.steps == 1:
            self.first_unit.add(step.compute_s)
        else:
            self.later_unit.add(step.compute_s)
            job.estimate.add(step.compute_s)

    def _next_unit_s(self, job: Job, step: Step) -> float:
        """Expected compute of the job's next unit: its own EMA, else the engine's."""
        if job.estimate.n:
            return job.estimate.value
        if self.later_unit.n:
            return self.later_unit.value
        return step.compute_s

    async def _run_thread(self, w: CallWorker, utt: Utterance, meter: PlaybackMeter) -> _End:
        """One utterance in its own thread (a self-scheduled synthesiser)."""
        chan = ChunkChannel(asyncio.get_running_loop())
        ctx = contextvars.copy_context()
        th = threading.Thread(
            target=ctx.run,
            args=(self._produce, w.state, utt.text, utt.token, chan, meter),
            name=f"synth-{w.call_id}",
            daemon=True,
        )
        self.threads.add(th)
        th.start()
        end: _End | None = None
        try:
            while True:
                item = await chan.get()
                if isinstance(item, _End):
                    end = item
                    break
                self._send(w, utt, item)
                if w.sink.write_paused:
                    await w.sink.drain()
        finally:
            if end is None:  # cancelled while waiting: the thread finishes on its own
                utt.token.cancel()
        return end

    def _send(self, w: CallWorker, utt: Utterance, pcm: bytes, unit_start: bool = True) -> None:
        """Write one packet of the utterance now, unless its call was barged in or ended.

        ``unit_start``: the packet begins a unit of work; the audio still queued ahead of
        the listener then is the utterance's queued-ahead audio (``ahead_min/max``)."""
        # Barge-in gate: nothing may run between this check and the write.
        if utt.token.cancelled or w.closed:
            self.stats.packets_suppressed += 1
            return
        if not w.sink.send_audio(w.call_id, pcm):
            self.stats.packets_unsent += 1
            utt.token.cancel()
            return
        now_ns = time.monotonic_ns()
        now = now_ns / 1e9
        samples = len(pcm) // 4
        meter = utt.meter
        if meter is not None:
            gap = meter.sent(samples, now)
            if gap > 0:
                self.stats.underruns += 1
                self.stats.underrun_ms += gap * 1000
                w.underruns += 1
                w.underrun_ms += gap * 1000
            w.play_until = meter.sent_until()
            if utt.packets and unit_start:
                ahead = w.play_until - now - samples / SAMPLE_RATE  # before this packet
                utt.ahead_min_s = min(utt.ahead_min_s, ahead)
                utt.ahead_max_s = max(utt.ahead_max_s, ahead)
        if utt.packets == 0:
            utt.ttfa_ms = (now_ns - utt.t_rx_ns) / 1e6
            w.last_ttfa_ms = utt.ttfa_ms
            self.stats.ttfa.add(utt.ttfa_ms)
        utt.packets += 1
        w.packets += 1
        self.stats.packets_sent += 1
        self.stats.samples_sent += samples

    def _finished(self, w: CallWorker, utt: Utterance, end: _End) -> None:
        if utt.t_bargein_ns is not None:
            self.stats.bargein_stop.add((time.monotonic_ns() - utt.t_bargein_ns) / 1e6)
        if end.truncated:
            self.stats.utterances_truncated += 1
            log.warning(
                "utterance_truncated",
                call_id=w.call_id,
                samples=end.samples,
                reason="120 s cap (WIRE.md 4)",
            )
        if end.error is not None:
            self.stats.utterances_failed += 1
            err = end.error
            if isinstance(err, SynthesisError):
                log.error("synthesis_failed", call_id=w.call_id, error=str(err))
            else:
                log.error(
                    "synthesis_failed",
                    call_id=w.call_id,
                    error=f"{type(err).__name__}: {err}",
                    exc_info=err,
                )
        elif utt.token.cancelled:
            self.stats.utterances_cancelled += 1
            log.debug("utterance_cancelled", call_id=w.call_id, packets=utt.packets)
        else:
            self.stats.utterances_completed += 1
            meter = utt.meter
            log.info(
                "utterance_completed",
                call_id=w.call_id,
                packets=utt.packets,
                samples=end.samples,
                audio_s=round(end.samples / SAMPLE_RATE, 3),
                ttfa_ms=None if utt.ttfa_ms is None else round(utt.ttfa_ms, 1),
                underruns=0 if meter is None else meter.underruns,
                underrun_ms=0.0 if meter is None else round(meter.underrun_s * 1000, 1),
                underruns_predicted=0 if meter is None else meter.gaps_predicted,
                underrun_ms_predicted=0.0
                if meter is None
                else round(meter.gap_s_predicted * 1000, 1),
                ahead_min_ms=round(utt.ahead_min_s * 1000, 1)
                if utt.ahead_min_s != float("inf")
                else None,
                ahead_max_ms=round(utt.ahead_max_s * 1000, 1),
                units=utt.steps,
                compute_ms=round(utt.compute_s * 1000, 1),
                sched_wait_ms=round(utt.wait_s * 1000, 1),
            )

    def _produce(
        self,
        state: CallState,
        text: str,
        token: CancelToken,
        chan: ChunkChannel,
        meter: PlaybackMeter,
    ) -> None:
        """Self-scheduled synthesis thread: run the blocking generator, frame, hand packets
        to the loop."""
        lower_thread_priority()
        framer = UtteranceFramer()
        error: BaseException | None = None
        gen = None
        try:
            gen = self.synth.synthesize(text, state, token)
            for chunk in gen:
                if token.cancelled:
                    break
                for pcm in framer.process(chunk):
                    meter.produced(len(pcm) // 4)
                    if not chan.put(pcm, token):
                        break
                if token.cancelled or framer.truncated:
                    break
        except SynthesisCancelled:
            pass
        except BaseException as exc:  # reported on the loop; never kills other calls
            error = exc
        finally:
            error = close_generator(gen, error)
            chan.finish(framer.samples_out, framer.truncated, error)
            self.threads.discard(threading.current_thread())
