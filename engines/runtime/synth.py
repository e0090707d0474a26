"""The interface between the engine runtime and a speech model.

Rule 1: everything an engine must implement to be driven by the runtime is
declared here; nothing here knows about sockets, asyncio or the dock.
Rule 2: every method of a ``Synthesizer`` is blocking and is called from a
worker thread (never from the event loop), so inference may take as long as
it takes while keepalive PONGs still leave on time.

Vocabulary: a *call* is one call id's lifetime, an *utterance* is
the audio for one text packet, a *phrase* is a piece of an utterance that is
synthesised at once, a *chunk* is what ``synthesize`` yields (float32 mono at
``sample_rate``; the runtime re-frames it into <= 4800-sample packets).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, runtime_checkable

import numpy as np
import numpy.typing as npt

from engines.text import LexiconReload

SAMPLE_RATE = 24000  # docs/wire.md#handshake: the only rate the dock accepts
SPEED_MIN = 0.5  # docs/wire.md#engine-cmd-port: SET_SPEED clamps to [0.5, 2.0]
SPEED_MAX = 2.0

FloatArray = npt.NDArray[np.float32]
_T = TypeVar("_T")


class SynthesisCancelled(Exception):
    """Raised inside a synthesiser when its cancel token fires."""


class SynthesisError(Exception):
    """A synthesis failed for a reason worth one log line (bad text, model error)."""


class UnitRecalled(Exception):
    """Raised inside a synthesiser's unit whose ``UnitGrant.recall`` fired (a model call
    that registered for it ended early): the synthesiser ends the unit with an empty
    chunk and does that work again in its next unit."""


class VoiceNotFound(SynthesisError):
    """The requested voice does not exist."""


class CancelToken:
    """A thread-safe, one-way flag: set by the event loop, polled by the model thread.

    Synthesisers check it at every natural step (Kokoro: between phrases;
    Qwen3: every frame) and stop with ``SynthesisCancelled``. A model call that
    can be interrupted from outside registers ``on_cancel`` instead of polling
    (a polling thread wakes the process and takes the GIL hundreds of times a
    second while the event loop needs it).
    """

    __slots__ = ("_callbacks", "_event", "_lock")

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], object]] = []

    def cancel(self) -> None:
        with self._lock:
            if self._event.is_set():
                return
            self._event.set()
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            try:
                fn()
            except Exception:  # a callback must never break the canceller (the event loop)
                pass

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def raise_if_cancelled(self) -> None:
        if self._event.is_set():
            raise SynthesisCancelled()

    def on_cancel(self, fn: Callable[[], object]) -> Callable[[], None]:
        """Call ``fn`` once when the token fires (at once if it already has).

        ``fn`` runs in the cancelling thread (normally the event loop): it must be
        quick and must not block. Returns a function that unregisters ``fn``.
        """
        with self._lock:
            if not self._event.is_set():
                self._callbacks.append(fn)
                return lambda: self._forget(fn)
        try:
            fn()
        except Exception:
            pass
        return _noop

    def _forget(self, fn: Callable[[], object]) -> None:
        with self._lock:
            try:
                self._callbacks.remove(fn)
            except ValueError:
                pass


def _noop() -> None:
    pass


@dataclass(frozen=True, slots=True)
class UnitGrant:
    """What the inference pool grants the unit of work running in this thread.

    ``cores``: cores this unit may use (intra-op threads); more than 1 only while no
    other unit is waiting for a worker, so one call can use the whole machine.
    ``cpus``: cores of the machine available to the engine. ``others``: other
    utterances in progress engine-wide (they share ``cpus`` with this one).
    ``calls``: calls the engine serves now, speaking or not (any of them may send its
    next sentence at any moment).
    ``hold``: the pool's count of cores a unit's helper threads decode on beyond its
    worker's own (``hold(1)`` as one begins, ``hold(-1)`` as it ends): a gang's other
    windows run on after the unit has yielded its first, and the pool grants and leaves
    units by the cores held (``pool`` Rule 5). None outside the pool.
    ``recall``: fires when the pool wants this unit's worker back for a new utterance's
    first unit (``pool`` Rule 4; only while this utterance's listener has audio to
    spare); a synthesiser may end the unit early with an empty chunk and do the work in
    its next unit (``UnitRecalled``), or ignore it. None outside the pool.
    ``claim``: a sentence's first unit asks for this many more cores for its helper
    threads (0: drops the claim); answers the seconds until they are expected free
    (``math.inf``: not known, or not granted), and from then on other utterances' later
    units leave them to it (``pool`` Rule 6). ``take``: a helper takes a claimed core,
    waiting up to the given seconds for one to come free (True: one was free), and then
    holds it as ``hold(1)`` does (give it back with ``hold(-1)``). None outside the pool.
    A synthesiser reads it with ``unit_grant()`` inside ``next()``.
    """

    cores: int = 1
    cpus: int = 1
    others: int = 0
    calls: int = 1
    recall: CancelToken | None = field(default=None, compare=False)
    hold: Callable[[int], None] | None = field(default=None, compare=False)
    claim: Callable[[int], float] | None = field(default=None, compare=False)
    take: Callable[[float], bool] | None = field(default=None, compare=False)

    @property
    def share(self) -> float:
        """Cores this utterance can count on over its next units when every utterance in
        progress gets its turn (below 1: it waits for others' units too)."""
        return self.cpus / (self.others + 1)


_grant = threading.local()


def unit_grant() -> UnitGrant:
    """The grant of the unit running in this thread (one core outside the pool)."""
    got = getattr(_grant, "value", None)  # thread-local: unset in a thread the pool never ran
    return got if isinstance(got, UnitGrant) else UnitGrant()


def set_unit_grant(grant: UnitGrant | None) -> None:
    """Set (or clear) this thread's grant; called by the pool around each unit."""
    _grant.value = grant


@runtime_checkable
class PlaybackClock(Protocol):
    """How far an utterance's audio is ahead of the listener (``CallState.playback``)."""

    def ahead_s(self) -> float:
        """Seconds of this utterance's audio produced but not yet played by a real-time
        listener that started at the first packet; negative = underrun; thread-safe.

        The listener starts the utterance at its first packet, or when the call's
        previous utterance has played out if that is later; a packet that arrives after
        the listener ran dry shifts the listener's clock by the gap (an underrun).
        """

    def predict(self, gaps: int, gap_s: float) -> None:
        """The synthesiser's forecast of underruns for this utterance (``gaps`` of
        ``gap_s`` in all); the runtime logs it beside the real ones."""


@dataclass
class CallState:
    """Per-call state the runtime keeps and hands to every synthesis of that call; it ends
    with the call (CALL_END, eviction), and nothing of it outlives the call.

    ``voice`` and ``speed`` are snapshotted when the call starts an utterance: a
    protocol request's own, else the call's own voice (``call_voice``, ``set_voice``),
    else the engine settings. ``prosody`` belongs to the synthesiser: it may store
    whatever it needs to carry intonation across the sentences of one call (prosody
    carry-over, docs/wire.md#per-call-engine-behaviour). ``engine_state`` holds any
    other per-call object of the engine (a cloned voice's prompt, a cache), created on
    first use. ``playback`` is the runtime's playback clock of the utterance in
    progress: the runtime sets it for every synthesis it drives (calls, offline cmd-port
    syntheses); it is ``None`` only between utterances and when a synthesiser is called
    outside the runtime (tests, benchmarks), where no listener exists.
    """

    call_id: int
    voice: str | None = None
    speed: float = 1.0
    prosody: dict[str, Any] = field(default_factory=dict)
    utterances: int = 0
    playback: PlaybackClock | None = None
    #: the call's own voice (over the engine's ``SET_VOICE``; a protocol request's wins)
    call_voice: str | None = None
    _engine: dict[str, Any] = field(default_factory=dict, repr=False)

    def set_voice(self, voice: str | None) -> None:
        """Give the call its own voice from its next utterance on (``None``: the engine's)."""
        self.call_voice = voice

    def engine_state(self, key: str, factory: Callable[[], _T]) -> _T:
        """The engine's per-call object under ``key``, made by ``factory`` on first use;
        it ends with the call."""
        try:
            got: _T = self._engine[key]
        except KeyError:
            got = self._engine[key] = factory()
        return got


@runtime_checkable
class Synthesizer(Protocol):
    """What every engine implements. All methods block; the runtime calls them off-loop.

    Scheduling. By default the runtime drives ``synthesize`` generators from a fixed
    pool of worker threads (``--synth-workers``) fed by one queue ordered by deadline:
    each ``next()`` is one unit of inference work (Kokoro: one prosody pass and the
    first window, then one window), so a generator should do about one model run per
    ``next()`` and must not block waiting for anything but its own computation. An
    engine that schedules across calls itself (batching; its generator blocks waiting
    for frames) declares ``SelfScheduled`` (``self_scheduled = True``, checked once when
    the runtime is built): the runtime then gives each utterance a dedicated thread
    instead of the pool. After a barge-in the runtime may start the
    call's next utterance while a worker is still closing the cancelled generator (its
    ``finally`` blocks run on ``close()``); those must not change ``CallState``.
    """

    #: HELLO name, ``[A-Za-z0-9_-]{1,32}`` (docs/wire.md#handshake).
    name: str
    #: Output rate in Hz; must be 24000 for the dock.
    sample_rate: int

    def load(self) -> None:
        """Load model files; raise with a clear message when they are missing or corrupt."""

    def warm_up(self) -> None:
        """Run a short synthesis so that the first call is not slow."""

    def voices(self) -> list[str]:
        """Names accepted by ``CallState.voice`` / ``SET_VOICE`` / ``SET_CALL_VOICE``."""

    @property
    def default_voice(self) -> str:
        """The voice used when a call names none."""

    def synthesize(self, text: str, state: CallState, cancel: CancelToken) -> Iterator[FloatArray]:
        """Yield float32 mono chunks of the utterance for ``text`` as soon as each is ready.

        Must check ``cancel`` at every natural step and stop (raise
        ``SynthesisCancelled`` or return) once it is set. Raises
        ``SynthesisError`` for input it cannot speak.
        """

    def stats(self) -> dict[str, float]:
        """Engine-specific numbers for STATS/BENCHMARK (e.g. per-stage ms); may be empty."""

    def status_suffix(self) -> str:
        """Extra ``STATUS`` fields, e.g. ``":G2P:espeak"``; may be ``""``
        (docs/wire.md#engine-cmd-port)."""

    def close(self) -> None:
        """Release models (called on SHUTDOWN)."""


@dataclass(frozen=True)
class PlanInfo:
    """How an engine runs its model on this machine (``ExecutionPlan.plan``).

    ``name``: the plan (e.g. ``int8`` or ``fp32-conv2d``); ``source``: ``measured``,
    ``cached``, ``forced`` or ``default``; ``rtf``: compute seconds per audio second by
    intra-op thread count; ``capacity``: audio seconds the engine can make per wall
    second on all cores (0: unknown).
    """

    name: str
    source: str
    rtf: dict[int, float]
    capacity: float


@runtime_checkable
class ExecutionPlan(Protocol):
    """Optional: an engine that reports its execution plan and speed (STATUS, METRICS,
    the ``model_ready`` log line, the load figures). Non-blocking: it reads a few numbers
    and may be called on the event loop."""

    def plan(self) -> PlanInfo:
        """The plan in use and its measured speed."""


@runtime_checkable
class TextControl(Protocol):
    """Optional methods of a ``Synthesizer`` with a text front end (``engines.text``).

    The cmd port checks each once (``SpokenForm``, ``LexiconControl``): an engine
    without them answers ``NORMALIZE`` and ``RELOAD_LEXICON`` with a clear ERROR, and
    SIGHUP does nothing. Both block (they may read a file) and run in a worker thread.
    """

    def normalize(self, text: str) -> str:
        """The spoken form of ``text`` on one line (IPA from the lexicon between slashes)."""

    def reload_lexicon(self) -> LexiconReload:
        """Read the lexicon file again; with any bad line the old lexicon stays in use."""


@runtime_checkable
class SpokenForm(Protocol):
    """Optional: ``NORMALIZE`` (the text front end's spoken form; ``TextControl``)."""

    def normalize(self, text: str) -> str: ...


@runtime_checkable
class LexiconControl(Protocol):
    """Optional: ``RELOAD_LEXICON`` and SIGHUP (``TextControl``)."""

    def reload_lexicon(self) -> LexiconReload: ...


@runtime_checkable
class SelfScheduled(Protocol):
    """Optional: a synthesiser that schedules across calls itself (a batch scheduler; its
    generator blocks waiting for frames). With ``self_scheduled`` true the runtime runs
    each utterance in a thread of its own instead of the inference pool
    (``engines.runtime.calls``)."""

    self_scheduled: bool


@runtime_checkable
class VoiceStore(Protocol):
    """Optional: ``RELOAD_VOICES`` (rescan the stored voices; the new list). Blocks; runs in
    a worker thread."""

    def reload_voices(self) -> list[str]: ...
