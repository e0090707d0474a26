"""The call table: every call's lifecycle, text queue, eviction, barge-in, CALL_END, the
send gate and the accounting of the engine runtime.

Rule 1: everything a call id owns lives here: its ``CallState``, its FIFO text queue, its
lifecycle phase (a small transition table, below), the one utterance it is speaking and
its figures. Every decision about a call is made here: open or reopen it, queue or drop
a text, cut it on barge-in, end it on CALL_END, evict it when idle or over the cap, send
or suppress a packet (the barge-in gate), and what each unit of work and each packet
adds to the counters. Methods that change something return the ``Action``s the shell
must carry out (start a worker for a call, wake a call's worker).
Rule 2: this file knows no asyncio, threads or sockets and reads no clock: every method
that needs the time takes ``now`` (seconds, one monotonic clock) or ``now_ns``. The
asyncio shell is ``engines.runtime.calls``; the synthesis itself runs in
``engines.runtime.pool``.

Bounded calls: a call whose CALL_END never arrives (LLaMA crashed, a dock restart lost
it) must not keep its worker forever. A call that is not speaking (nothing queued, no
utterance in progress) is evicted after ``idle_s`` without any event of its own, and
when more than ``max_calls`` calls are live the least recently active idle call is
evicted to make room. A speaking call is never evicted. An evicted call that later gets
text simply reopens (fresh ``CallState``). Evictions are counted (``calls_evicted``) and
logged (``call_evicted``).

Per-call voice: ``set_call_voice`` (cmd port SET_CALL_VOICE) gives a call its own voice
in its ``CallState``, which ``begin`` snapshots at each utterance and which ends with the
call. A voice set for a call not open yet waits in ``pending_voices`` (bounded; dropped
by CALL_END and after ``idle_s``) and goes to the call's state when it opens.

Barge-in: ``speech_active`` cancels the utterance's token at once; ``gate`` is the check
the shell makes immediately before every socket write with nothing in between, so no
packet of that call is written after the SPEECH_ACTIVE frame has been processed
(packets already produced are dropped and counted as ``packets_suppressed``).
"""

from __future__ import annotations

import enum
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

import structlog

from engines.runtime.load import LoadMeter, LoadSnapshot
from engines.runtime.playback import PlaybackMeter
from engines.runtime.schedule import StepEstimate, deadline_for, start_deadline
from engines.runtime.stats import RuntimeStats
from engines.runtime.synth import SAMPLE_RATE, CallState, CancelToken, SynthesisError
from svc.lru import ENDED_CALLS, EndedCalls

log = structlog.get_logger(__name__)

MAX_QUEUED_TEXTS = 256  # per call; more text is dropped (counted, logged)
ENDED_MEMORY = ENDED_CALLS  # ended call ids remembered (svc.lru says why this many)
CALL_IDLE_S = 600.0  # a call silent (no text, no speech event) this long is evicted
MAX_CALLS = 4096  # live calls kept; beyond, the least recently active idle call is evicted
#: voices set (``set_call_voice``) for calls not open yet; beyond, the oldest is forgotten
MAX_PENDING_VOICES = 256


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


@dataclass
class Utterance:
    """One text packet of a call, from its queue to its last packet."""

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


@dataclass(frozen=True, slots=True)
class UtteranceEnd:
    """How an utterance's synthesis ended: audio made, 120 s cap hit, the error if any."""

    samples: int
    truncated: bool
    error: BaseException | None = None


class Call:
    """One call id: state, FIFO text queue, phase, the utterance in progress, figures.

    ``sink`` and ``task`` belong to the shell (where the call's audio goes, and the
    handle of the task that speaks it); the table only carries them."""

    def __init__(self, call_id: int, sink: object) -> None:
        self.state = CallState(call_id)
        self.sink = sink
        self.request: RequestHooks | None = None  # set for a protocol request
        self.task: object | None = None
        self.phase = CallPhase.IDLE
        self.queue: deque[tuple[str, int]] = deque()
        self.current: Utterance | None = None
        self.closed = False
        self.utterances = 0
        self.packets = 0
        self.bargeins = 0
        self.last_active = 0.0  # time of the call's last event (or end of speech)
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


# -- actions: what the shell carries out ------------------------------------------------


@dataclass(frozen=True, slots=True)
class StartWorker:
    """A call was opened: start the task that speaks it."""

    call: Call


@dataclass(frozen=True, slots=True)
class WakeWorker:
    """The call's worker has something to do: text queued, or the call closed."""

    call: Call


Action = StartWorker | WakeWorker


# -- snapshots: what the cmd port, METRICS and HTTP read ---------------------------------


@dataclass(frozen=True, slots=True)
class CallFigures:
    """One live call as STATS and METRICS list it."""

    call_id: int
    phase: str
    queued: int
    utterances: int
    packets: int
    bargeins: int
    ttfa_ms: float
    underruns: int
    underrun_ms: float
    ahead_s: float


@dataclass(frozen=True, slots=True)
class CallsSnapshot:
    """The call table's figures at one moment (``CallTable.snapshot``)."""

    active: int
    evicted_idle: int
    evicted_cap: int
    queue_depth: int
    calls: tuple[CallFigures, ...]  # least recently active first, at most the limit asked


class CallTable:
    """All calls of the engine (see the module docstring); driven by ``calls.CallManager``."""

    def __init__(
        self,
        stats: RuntimeStats,
        settings: EngineSettings,
        *,
        cpus: int,
        idle_s: float = CALL_IDLE_S,
        max_calls: int = MAX_CALLS,
        max_ahead_s: float,
        playback_clock: Callable[[], float],
    ) -> None:
        if not idle_s > 0:
            raise ValueError(f"call idle time must be > 0 s, got {idle_s}")
        if max_calls < 1:
            raise ValueError(f"max_calls must be >= 1, got {max_calls}")
        if not max_ahead_s > 0:
            raise ValueError(f"max_ahead_s must be > 0, got {max_ahead_s}")
        self.stats = stats
        self.settings = settings
        self.idle_s = idle_s
        self.max_calls = max_calls
        self.max_ahead_s = max_ahead_s
        #: handed to each utterance's ``PlaybackMeter`` (the synthesiser's ``ahead_s()``);
        #: the table itself never calls it
        self.playback_clock = playback_clock
        #: live calls, least recently active first (``touch`` moves a call to the end)
        self.calls: OrderedDict[int, Call] = OrderedDict()
        self.calls_evicted: dict[str, int] = {"idle": 0, "cap": 0}
        #: call id -> (voice, when set) for calls not open yet: handed to the call's
        #: ``CallState`` when it opens; CALL_END, ``idle_s`` and the bound drop it
        self.pending_voices: OrderedDict[int, tuple[str, float]] = OrderedDict()
        self.ended = EndedCalls(ENDED_MEMORY)
        self.closing = False  # no new work is taken (shutdown)
        #: utilisation and headroom over the recent units of work (``load.py``)
        self.load = LoadMeter(cpus)
        self.first_unit = StepEstimate()  # engine-wide compute of an utterance's first unit
        self.later_unit = StepEstimate()  # ... and of its later units

    # -- events (dock frames, protocol requests) ---------------------------------------

    def text(self, call_id: int, payload: bytes, t_rx_ns: int, now: float) -> list[Action]:
        """A text packet for ``call_id``: queue it (opening or reopening the call)."""
        self.stats.texts_received += 1
        text = payload.decode("utf-8", errors="replace").strip()
        if not text:
            log.debug("text_ignored", call_id=call_id, reason="empty")
            return []
        if self.closing:
            self._drop(call_id, "shutting_down")
            return []
        actions: list[Action] = []
        call = self.calls.get(call_id)
        if call is None:
            if call_id in self.ended:
                self.ended.discard(call_id)
                log.info("call_reopened", call_id=call_id)
            call = self._open(call_id, None, now, actions)
        self.touch(call, now)
        if len(call.queue) >= MAX_QUEUED_TEXTS:
            self._drop(call_id, "queue_full")
            return actions
        call.queue.append((text, t_rx_ns))
        call.apply(CallInput.TEXT)
        actions.append(WakeWorker(call))
        return actions

    def speech_active(self, call_id: int, t_rx_ns: int, now: float, now_ns: int) -> list[Action]:
        """SPEECH_ACTIVE (barge-in): cut what is queued and speaking, at once."""
        actions: list[Action] = []
        call = self.calls.get(call_id)
        if call is None:
            if call_id in self.ended or self.closing:
                return actions
            call = self._open(call_id, None, now, actions)
        self.touch(call, now)
        if call.cut(t_rx_ns):
            call.bargeins += 1
            self.stats.bargeins += 1
            self.stats.bargein_mute.add((now_ns - t_rx_ns) / 1e6)
            log.info("bargein_applied", call_id=call_id)
        call.apply(CallInput.SPEECH_ACTIVE)
        return actions

    def speech_idle(self, call_id: int, now: float) -> list[Action]:
        """SPEECH_IDLE: the caller stopped speaking (prewarm: open the call)."""
        actions: list[Action] = []
        call = self.calls.get(call_id)
        if call is None:
            if call_id in self.ended or self.closing:
                return actions
            call = self._open(call_id, None, now, actions)  # the caller will likely get an answer
        self.touch(call, now)
        call.apply(CallInput.SPEECH_IDLE)
        return actions

    def call_end(self, call_id: int) -> list[Action]:
        """CALL_END: the call ends now, whatever it was doing; its id is remembered."""
        call = self.calls.pop(call_id, None)
        self.ended.add(call_id)
        self.pending_voices.pop(call_id, None)
        if call is None:
            return []
        call.apply(CallInput.CALL_END)
        call.cut()
        call.closed = True
        self.stats.calls_ended += 1
        log.info("call_ended", call_id=call_id, utterances=call.utterances, packets=call.packets)
        return [WakeWorker(call)]

    def set_call_voice(self, call_id: int, voice: str | None, now: float) -> None:
        """SET_CALL_VOICE: the call's own voice from its next utterance on (``None``: back
        to the engine's). An open call keeps it in its ``CallState`` (it ends with the
        call); a call not open yet gets it when it opens, if that is within ``idle_s`` and
        before CALL_END (at most ``MAX_PENDING_VOICES`` such calls, oldest forgotten first).
        The caller has checked the name against the engine's voices."""
        call = self.calls.get(call_id)
        if call is not None:
            call.state.set_voice(voice)
            return
        self.pending_voices.pop(call_id, None)
        if voice is None:
            return
        self.pending_voices[call_id] = (voice, now)
        while len(self.pending_voices) > MAX_PENDING_VOICES:
            self.pending_voices.popitem(last=False)

    def link_lost(self) -> int:
        """The dock is gone: abandon every docked call's pending audio (the new dock would
        not know these utterances); calls keep their state (voice, prosody). The count."""
        abandoned = 0
        for call in self.calls.values():
            if call.request is None and call.cut():  # a protocol request's client is still there
                abandoned += 1
        if abandoned:
            log.info("utterances_abandoned", calls=abandoned, reason="dock_lost")
        return abandoned

    def open_request(
        self, call_id: int, sink: object, hooks: RequestHooks, now: float
    ) -> list[Action]:
        """Open a call for a protocol request (HTTP, Wyoming), whose audio goes to ``sink``."""
        if call_id in self.calls:
            raise ValueError(f"call {call_id} is already open")
        actions: list[Action] = []
        call = self._open(call_id, sink, now, actions)
        call.request = hooks
        return actions

    def close(self) -> list[Action]:
        """Stop taking work and end every call (shutdown)."""
        self.closing = True
        actions: list[Action] = []
        for call_id in list(self.calls):
            call = self.calls.pop(call_id)
            call.cut()
            call.closed = True
            actions.append(WakeWorker(call))
        return actions

    # -- lifecycle ---------------------------------------------------------------------

    def touch(self, call: Call, now: float) -> None:
        call.last_active = now
        if self.calls.get(call.call_id) is call:
            self.calls.move_to_end(call.call_id)

    def _open(self, call_id: int, sink: object, now: float, actions: list[Action]) -> Call:
        if len(self.calls) >= self.max_calls:
            actions += self._evict_over_cap(self.max_calls - 1, now)
        call = Call(call_id, sink)
        call.last_active = now
        pending = self.pending_voices.pop(call_id, None)
        if pending is not None:
            call.state.set_voice(pending[0])
        self.calls[call_id] = call
        self.stats.calls_started += 1
        actions.append(StartWorker(call))
        log.debug("call_opened", call_id=call_id)
        return call

    def _evict(self, call: Call, reason: str, now: float) -> WakeWorker:
        """Forget an idle call without CALL_END; its worker ends at once."""
        assert call.idle, "a speaking call is never evicted"
        del self.calls[call.call_id]
        call.apply(CallInput.CALL_END)
        call.closed = True
        self.calls_evicted[reason] += 1
        log.info(
            "call_evicted",
            call_id=call.call_id,
            reason=reason,
            idle_s=round(now - call.last_active, 1),
            utterances=call.utterances,
            live=len(self.calls),
        )
        return WakeWorker(call)

    def _evict_over_cap(self, keep: int, now: float) -> list[Action]:
        """Evict least recently active idle calls until at most ``keep`` remain."""
        actions: list[Action] = []
        if len(self.calls) <= keep:
            return actions
        for call in list(self.calls.values()):  # least recently active first
            if len(self.calls) <= keep:
                break
            if call.idle:
                actions.append(self._evict(call, "cap", now))
        if len(self.calls) > keep:
            log.warning("calls_over_cap", live=len(self.calls), cap=self.max_calls)
        return actions

    def sweep(self, now: float) -> list[Action]:
        """Evict calls idle for ``idle_s`` or more, then enforce ``max_calls``; forget
        voices set ``idle_s`` or more ago for calls that never opened."""
        limit = now - self.idle_s
        for call_id, (_, t_set) in list(self.pending_voices.items()):
            if t_set > limit:
                break  # in the order set: every later one is more recent
            del self.pending_voices[call_id]
        actions: list[Action] = []
        for call in list(self.calls.values()):
            if call.last_active > limit:
                break  # ordered by activity: every later call is more recent
            if call.idle:
                actions.append(self._evict(call, "idle", now))
        return actions + self._evict_over_cap(self.max_calls, now)

    def _drop(self, call_id: int, reason: str) -> None:
        self.stats.texts_dropped += 1
        log.warning("text_dropped", call_id=call_id, reason=reason)

    # -- a call's worker ---------------------------------------------------------------

    def next_utterance(self, call: Call, now: float) -> Utterance | None:
        """The call's next utterance, now in progress; ``None``: its queue is empty (the
        worker waits for a ``WakeWorker``)."""
        if not call.queue:
            call.apply(CallInput.DRAINED)
            if call.utterances:  # idle time counts from the end of the last utterance
                self.touch(call, now)
            return None
        text, t_rx_ns = call.queue.popleft()
        utt = Utterance(text, t_rx_ns)
        call.current = utt
        return utt

    def admitted(self, call: Call, utt: Utterance, now_ns: int) -> bool:
        """The utterance got synthesis capacity; ``False``: it was cut while waiting."""
        if utt.token.cancelled or call.closed:
            self.stats.utterances_cancelled += 1
            return False
        self.stats.queue_wait.add((now_ns - utt.t_rx_ns) / 1e6)
        return True

    def begin(self, call: Call, utt: Utterance) -> PlaybackMeter:
        """The utterance's synthesis starts: snapshot voice and speed into the call's state,
        and give it a playback clock (``CallState.playback``, until ``end``)."""
        st = call.state
        req = call.request
        st.voice = self.settings.voice if req is None or req.voice is None else req.voice
        if st.call_voice is not None and (req is None or req.voice is None):
            st.voice = st.call_voice
        st.speed = self.settings.speed if req is None or req.speed is None else req.speed
        st.utterances += 1
        call.utterances += 1
        self.stats.utterances_started += 1
        # the listener still plays the call's previous utterance (text came meanwhile)
        playing = call.play_until > utt.t_rx_ns / 1e9
        meter = PlaybackMeter(self.playback_clock, not_before=call.play_until if playing else 0.0)
        utt.meter = meter
        st.playback = meter
        log.debug("utterance_started", call_id=call.call_id, chars=len(utt.text))
        return meter

    def first_deadline(self, call: Call, utt: Utterance) -> float:
        """When the utterance's first unit of work is due (``schedule.start_deadline``)."""
        return start_deadline(utt.t_rx_ns / 1e9, call.play_until, self.first_unit.value)

    def next_deadline(
        self, utt: Utterance, estimate: StepEstimate, last_compute_s: float, now: float
    ) -> tuple[float, float]:
        """Deadline and ready time of the utterance's next unit (``schedule.deadline_for``)."""
        assert utt.meter is not None
        return deadline_for(
            utt.meter.dry_at(now), self.next_unit_s(estimate, last_compute_s), self.max_ahead_s
        )

    def next_unit_s(self, estimate: StepEstimate, last_compute_s: float) -> float:
        """Expected compute of a job's next unit: its own EMA, else the engine's."""
        if estimate.n:
            return estimate.value
        if self.later_unit.n:
            return self.later_unit.value
        return last_compute_s

    def unit(
        self,
        call: Call,
        utt: Utterance,
        estimate: StepEstimate,
        *,
        compute_s: float,
        cores: int,
        wait_s: float,
        packets: list[bytes],
        now: float,
    ) -> None:
        """Account one unit of work of the utterance (its load, time and estimates)."""
        if compute_s <= 0 and not packets:
            return  # a close, not a unit of work
        audio_s = sum(len(p) for p in packets) / 4 / SAMPLE_RATE
        self.load.unit(now, compute_s * cores, audio_s, call.call_id)
        utt.compute_s += compute_s
        utt.wait_s += wait_s
        self.stats.sched_wait.add(wait_s * 1000)
        if not packets:
            return  # the generator's end: not a unit whose time predicts the next one
        utt.steps += 1
        if utt.steps == 1:
            self.first_unit.add(compute_s)
            # the first audio's time, split: waiting for a worker, and the unit itself
            log.debug(
                "first_unit",
                call_id=call.call_id,
                wait_ms=round(wait_s * 1000, 1),
                compute_ms=round(compute_s * 1000, 1),
                cores=cores,
            )
        else:
            self.later_unit.add(compute_s)
            estimate.add(compute_s)

    def gate(self, call: Call, utt: Utterance) -> bool:
        """Barge-in gate: may a packet of the utterance be written now? A ``False`` is
        counted (``packets_suppressed``). The shell writes right after a ``True``, with
        nothing in between."""
        if utt.token.cancelled or call.closed:
            self.stats.packets_suppressed += 1
            return False
        return True

    def unsent(self, call: Call, utt: Utterance) -> None:
        """A packet found no link (the dock is gone): count it, abandon the utterance."""
        self.stats.packets_unsent += 1
        utt.token.cancel()

    def sent(self, call: Call, utt: Utterance, samples: int, now_ns: int, unit_start: bool) -> None:
        """A packet of ``samples`` was written at ``now_ns``: playback, TTFA, counters.

        ``unit_start``: the packet begins a unit of work; the audio still queued ahead of
        the listener then is the utterance's queued-ahead audio (``ahead_min/max``)."""
        now = now_ns / 1e9
        meter = utt.meter
        if meter is not None:
            gap = meter.sent(samples, now)
            if gap > 0:
                self.stats.underruns += 1
                self.stats.underrun_ms += gap * 1000
                call.underruns += 1
                call.underrun_ms += gap * 1000
            call.play_until = meter.sent_until()
            if utt.packets and unit_start:
                ahead = call.play_until - now - samples / SAMPLE_RATE  # before this packet
                utt.ahead_min_s = min(utt.ahead_min_s, ahead)
                utt.ahead_max_s = max(utt.ahead_max_s, ahead)
        if utt.packets == 0:
            utt.ttfa_ms = (now_ns - utt.t_rx_ns) / 1e6
            call.last_ttfa_ms = utt.ttfa_ms
            self.stats.ttfa.add(utt.ttfa_ms)
        utt.packets += 1
        call.packets += 1
        self.stats.packets_sent += 1
        self.stats.samples_sent += samples

    def end(self, call: Call, meter: PlaybackMeter) -> None:
        """The utterance's synthesis is over: its playback clock leaves the call's state."""
        if call.state.playback is meter:
            call.state.playback = None

    def finished(self, call: Call, utt: Utterance, end: UtteranceEnd, now_ns: int) -> None:
        """Count and log how the utterance ended."""
        if utt.t_bargein_ns is not None:
            self.stats.bargein_stop.add((now_ns - utt.t_bargein_ns) / 1e6)
        if end.truncated:
            self.stats.utterances_truncated += 1
            log.warning(
                "utterance_truncated",
                call_id=call.call_id,
                samples=end.samples,
                reason="120 s cap",
            )
        if end.error is not None:
            self.stats.utterances_failed += 1
            err = end.error
            if isinstance(err, SynthesisError):
                log.error("synthesis_failed", call_id=call.call_id, error=str(err))
            else:
                log.error(
                    "synthesis_failed",
                    call_id=call.call_id,
                    error=f"{type(err).__name__}: {err}",
                    exc_info=err,
                )
        elif utt.token.cancelled:
            self.stats.utterances_cancelled += 1
            log.debug("utterance_cancelled", call_id=call.call_id, packets=utt.packets)
        else:
            self.stats.utterances_completed += 1
            meter = utt.meter
            log.info(
                "utterance_completed",
                call_id=call.call_id,
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

    def utterance_done(self, call: Call) -> None:
        """The worker is done with the call's current utterance (any outcome)."""
        call.current = None
        if call.request is not None:
            call.request.utterance_ended()

    # -- reading -----------------------------------------------------------------------

    def is_open(self, call_id: int) -> bool:
        return call_id in self.calls

    def live(self) -> Iterator[Call]:
        """Live calls, least recently active first (a copy: safe to change the table)."""
        return iter(list(self.calls.values()))

    def snapshot(self, limit: int) -> CallsSnapshot:
        """The table's figures; per-call figures of at most ``limit`` calls."""
        figures = tuple(
            CallFigures(
                call_id=c.call_id,
                phase=c.phase.value,
                queued=c.depth(),
                utterances=c.utterances,
                packets=c.packets,
                bargeins=c.bargeins,
                ttfa_ms=c.last_ttfa_ms,
                underruns=c.underruns,
                underrun_ms=c.underrun_ms,
                ahead_s=c.ahead_s(),
            )
            for c in list(self.calls.values())[:limit]
        )
        return CallsSnapshot(
            active=len(self.calls),
            evicted_idle=self.calls_evicted["idle"],
            evicted_cap=self.calls_evicted["cap"],
            queue_depth=sum(c.depth() for c in self.calls.values()),
            calls=figures,
        )

    def load_snapshot(self, now: float, estimate: float | None) -> LoadSnapshot:
        """Utilisation, capacity and headroom at ``now`` (``load.py``)."""
        return self.load.snapshot(now, estimate)
