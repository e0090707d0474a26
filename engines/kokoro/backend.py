"""Inference backends behind one small interface; ONNX Runtime is the default.

Rule 1: a backend turns (tokens, style, speed) into raw 24 kHz float32 audio
and knows nothing about text, phrases or calls.
Rule 2: a backend run can be abandoned from another thread: the cancel token's
``on_cancel`` callback sets ``RunOptions.terminate`` the moment the token fires
(no polling thread), so a barge-in stops the model within milliseconds, not at
the next phrase.
Rule 3: memory stays at what the runs in progress need. Every run shrinks ONNX
Runtime's CPU arena when it ends (``memory.enable_memory_arena_shrinkage``: the
regions it grew for this run's shapes are freed), but for a prosody pass of up to
``PROSODY_KEEP_TOKENS`` tokens (its arena's size is bounded by that length, and the
warm-up reserves it), and glibc's mmap threshold is
fixed at ``MMAP_THRESHOLD`` so that those regions go back to the system instead
of staying in the heap. Every window and sentence has its own shape, and
without this the arena kept the largest set of shapes seen so far: a long window
or sentence late in a soak grew the process for good. Measured (one decoder
session, the same window run alternately with and without it; Xeon 2 vCPU):
0.97-1.02x the time for 68-220 frame windows on 1 and 2 threads; RSS over
random windows of 68-220 frames on both sessions flat at 510-540 MB against
734 -> 846 MB and rising without it. Smaller blocks live in glibc's per-thread
arenas, which keep the pages of what was freed: the synthesiser gives them back
(``trim_heap``) after utterances.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt
import structlog

from engines.kokoro.converted import Manifest, read_manifest
from engines.kokoro.graph_split import (
    DUR_CAP_INPUT,
    FRAME_MARGIN,
    SplitGraphs,
    patch_duration_cap_model,
    split_sources,
)
from engines.kokoro.graph_split import (
    DURATIONS_TENSOR as DURATIONS_TENSOR,
)
from engines.kokoro.models import ModelFileError
from engines.kokoro.norms import (
    MEAN_OUTPUT,
    VAR_OUTPUT,
    NormStats,
    add_norm_inputs,
    own_feeds,
)
from engines.runtime.cpus import available_cpus
from engines.runtime.synth import (
    CancelToken,
    FloatArray,
    SynthesisCancelled,
    SynthesisError,
    UnitRecalled,
    unit_grant,
)

log = structlog.get_logger(__name__)

# Edge caps (frames of 600 samples = 25 ms), opt-in (``--edge-cap``). The graph gives
# a final mark plus the trailing pad about 8-16 frames, silence that the synthesiser
# trims away again. The leading pad (about 13 frames) is never capped: the model
# renders nothing in the first ~8 frames of its output, whatever is aligned there,
# and it starts the first phoneme's sound 2-3 frames before the pad ends; a pad
# capped at 6 frames put that onset into the silent start, and the recogniser heard
# "Hello, how" as "Low how" and "Please hold" as "is hold" (README "Edge silence").
MARK_FRAMES = 2  # a final punctuation mark (the pause after it is ours to choose)
TAIL_PAD_FRAMES = 1  # trailing pad after a final mark
#: Trailing pad after a phoneme: it carries that phoneme's release and decay.
OPEN_TAIL_PAD_FRAMES = 6
NO_CAP = 1 << 20
#: Allocations from this size up are mapped and unmapped by glibc one by one (the
#: arena's regions); fixed, so glibc does not raise it after the first large free.
MMAP_THRESHOLD = 4 << 20
_M_MMAP_THRESHOLD = -3  # mallopt parameter (glibc malloc.h)
_SHRINK = ("memory.enable_memory_arena_shrinkage", "cpu:0")
#: A prosody pass of up to this many tokens leaves its session's arena as it is (Rule 3):
#: a shrunk arena maps its regions anew at the next run, which made the pass 15-30 %
#: slower (AMD EPYC, 2 threads, hot: 101 -> 85 ms at 120 tokens, 246 -> 167 ms at 250),
#: all of it before the sentence's first audio. What the arena keeps is bounded by this
#: length (about 0.2 MB a token per prosody session); longer passes shrink it.
PROSODY_KEEP_TOKENS = 200


def patch_duration_cap(model_path: Path) -> bytes | None:
    """The model with a ``dur_cap`` input (``patch_duration_cap_model``), serialised.

    Returns None when ``onnx`` is missing or the graph has no durations tensor:
    then edges are not capped.
    """
    try:
        import onnx
    except ImportError:
        log.info("edge_cap_unavailable", reason="the onnx package is not installed")
        return None
    model = onnx.load(str(model_path))
    if not patch_duration_cap_model(model):
        log.info("edge_cap_unavailable", reason="no duration tensor in the graph")
        return None
    data: bytes = model.SerializeToString()
    return data


class Backend(Protocol):
    name: str

    def load(self) -> None: ...

    def infer(
        self, tokens: Sequence[int], style: FloatArray, speed: float, cancel: CancelToken
    ) -> FloatArray: ...

    def close(self) -> None: ...


def capped_model_source(model_path: Path) -> str | bytes | None:
    """The duration-capped graph, patched once and kept beside the model.

    ``<model>.durcap`` (no ``.onnx`` suffix, so variant globbing ignores it) is
    reused while ``<model>.durcap.stamp`` matches the model's size and mtime, so
    later starts load a file instead of patching in memory (that would add about
    200 MB to the peak RSS). A read-only directory gets the bytes instead.
    """
    target = model_path.with_name(model_path.name + ".durcap")
    stamp = model_path.with_name(model_path.name + ".durcap.stamp")
    st = model_path.stat()
    want = f"{st.st_size}:{st.st_mtime_ns}"
    try:
        if target.is_file() and stamp.read_text() == want:
            return str(target)
    except OSError:
        pass
    data = patch_duration_cap(model_path)
    if data is None:
        return None
    part = target.with_name(f"{target.name}.{os.getpid()}.part")
    try:
        part.write_bytes(data)
        os.replace(part, target)
        stamp.write_text(want)
    except OSError as exc:
        part.unlink(missing_ok=True)
        log.info("edge_cap_not_cached", path=str(target), error=str(exc))
        return data
    return str(target)


@dataclass
class FeatureSpan:
    """The frame stage's ``features`` of frames ``[start, end)`` of one sentence, taken
    with ``norms``; exact but within ``FRAME_MARGIN`` of a cut end (``decode``)."""

    start: int = 0
    end: int = 0
    features: npt.NDArray[np.float32] | None = None
    norms: NormStats | None = None

    def covers(self, start: int, end: int, n_frames: int, norms: NormStats | None) -> bool:
        """Whether frames ``[start, end)`` are exact here (``norms`` None: the sentence's
        own statistics, so only a span of the whole sentence is)."""
        lo = self.start + FRAME_MARGIN if self.start > 0 else 0
        hi = self.end - FRAME_MARGIN if self.end < n_frames else n_frames
        return self.features is not None and self.norms is norms and lo <= start and end <= hi


@dataclass(frozen=True)
class Prosody:
    """The prosody stage's result for one sentence (``graph_split`` documents each array).

    ``features``, ``f0`` and ``phase`` are indexed in half-frames (``2 * F``), ``asr``
    in frames; ``energy`` is the predicted energy per half-frame, ``durations`` the
    frames per token position ``[pad, *tokens, pad]``. ``features`` is None until the
    frame stage has run over the whole sentence (``OnnxBackend.with_features``): with
    the voice's statistics each window runs it on its own frames instead.
    """

    features: npt.NDArray[np.float32] | None
    f0: npt.NDArray[np.float32]
    energy: npt.NDArray[np.float32]
    phase: npt.NDArray[np.float32]
    durations: npt.NDArray[np.int64]
    #: the voice's statistics for the instance norms of the frame and decoder stages
    #: (``norms``); None: each decoded window takes its own
    norms: NormStats | None = None
    #: the frame stage's input (``graph_split``); None when the prosody stage gives
    #: ``features`` itself (a converted checkpoint)
    asr: npt.NDArray[np.float32] | None = None
    #: features the windows computed last, for the next windows (``decode``)
    span: FeatureSpan = field(default_factory=lambda: FeatureSpan(), compare=False, repr=False)

    @property
    def n_frames(self) -> int:
        return int(self.f0.shape[1]) // 2

    def frame_energy(self) -> npt.NDArray[np.float32]:
        """Energy per frame (mean of its two half-frames)."""
        e = self.energy.reshape(-1)[: 2 * self.n_frames].astype(np.float32)
        return (e[0::2] + e[1::2]) * np.float32(0.5)


@runtime_checkable
class SplitBackend(Protocol):
    """A backend that runs the two stages of ``graph_split`` separately (``split`` says
    whether it does now: it may fall back to the whole graph)."""

    split: bool

    def prosody(
        self, tokens: Sequence[int], style: FloatArray, speed: float, cancel: CancelToken
    ) -> Prosody: ...

    def decode(
        self,
        prosody: Prosody,
        start: int,
        end: int,
        style: FloatArray,
        cancel: CancelToken,
        ahead: int = 0,
    ) -> FloatArray: ...

    def with_features(
        self, prosody: Prosody, style: FloatArray, cancel: CancelToken
    ) -> Prosody: ...


@runtime_checkable
class PreparedBackend(Protocol):
    """Optional: a split backend whose windows share state that a decode may write (the
    frame stage's span); ``prepare`` computes it for frames ``[start, end)`` (and
    ``ahead`` after), so that decodes of windows inside them, run at once from several
    threads, only read it."""

    def prepare(
        self,
        prosody: Prosody,
        start: int,
        end: int,
        style: FloatArray,
        cancel: CancelToken,
        ahead: int = 0,
    ) -> None: ...

    def covered(self, prosody: Prosody, start: int, end: int) -> bool:
        """Whether decodes of frames ``[start, end)`` need no run of the frame stage."""
        ...


@runtime_checkable
class MarkedBackend(Protocol):
    """Optional: a backend told the vocabulary ids of punctuation marks (at load)."""

    def set_marks(self, marks: frozenset[int]) -> None: ...


@runtime_checkable
class ThreadedBackend(Protocol):
    """Optional: a backend that picks the intra-op threads of a unit granted ``cores``."""

    def threads_for(self, cores: int) -> int: ...


class OnnxBackend:
    """Kokoro in ONNX Runtime: split into prosody and decoder stages, or one graph.

    By default the shipped graph is split (``graph_split``): ``prosody`` runs
    once per sentence and ``decode`` renders any window of its frames. A graph
    that cannot be split (another export), or ``split=False``, is run whole
    with ``infer`` (``tokens``/``input_ids``, ``style``, ``speed`` -> ``audio``).

    Threads: each stage is loaded once per thread count, ``threads`` intra-op
    threads (default 1) and ``wide_threads`` (default: every core the process may
    use). A run takes the widest session that the inference pool grants its unit
    (``engines.runtime.synth.unit_grant``): one call alone on the engine uses the
    whole machine; with other calls waiting each run keeps to ``threads``. One
    inter-op thread, sequential execution, and no spin-waiting by default: on a
    box shared with other calls and processes, spinning threads steal the CPU
    that the other inference needs. CUDA is used when ``onnxruntime-gpu`` offers
    ``CUDAExecutionProvider`` (``device="auto"``; then one session per stage).
    Concurrent calls share the sessions; ``max_parallel`` runs execute at once
    (default 0: no gate here; the runtime's inference pool, ``--synth-workers``,
    bounds the runs of live calls).
    """

    name = "onnx"

    def __init__(
        self,
        model_path: Path,
        *,
        threads: int = 2,
        wide_threads: int | None = None,
        device: str = "auto",
        spinning: bool = False,
        max_parallel: int = 0,
        edge_cap: bool = False,
        split: bool = True,
        stages: SplitGraphs | None = None,
    ) -> None:
        self.model_path = model_path
        self.edge_cap = edge_cap
        self.want_split = split
        self.split = False  # True once the two stages are loaded
        self.capped = False  # True once the loaded graph takes ``dur_cap``
        self.marks: frozenset[int] = frozenset()
        self.threads = max(1, threads)
        self.wide_threads = max(self.threads, wide_threads or available_cpus())
        self.device = device
        self.spinning = spinning
        self._stages = stages  # stage graphs given by the caller (a plan); else cut here
        self._gate: Any = (
            threading.BoundedSemaphore(max_parallel) if max_parallel > 0 else nullcontext()
        )
        #: a sentence's ``prosody.span`` is read by a gang's windows while a thread that
        #: is done with its own may write the next windows' (``prepare``, synth)
        self._span_lock = threading.Lock()
        #: stage ("whole", "prosody", "decoder") -> intra-op threads -> session
        self.sessions: dict[str, dict[int, Any]] = {}
        #: instance norms that take given statistics (``norms``), the frame stage's
        #: first; 0: none (windows take their own)
        self.norm_count = 0
        #: of them, the frame stage's (``graph_split``: 0 without a frame stage)
        self.frame_norms = 0
        self._stage_norms: dict[str, int] = {}  # stage -> its graph's norm inputs
        self._audio_output = "audio"
        self.providers: list[str] = []
        self._tokens_name = "tokens"
        self._speed_dtype: np.dtype[Any] = np.dtype(np.float32)
        self._style_dtype: np.dtype[Any] = np.dtype(np.float32)
        self._tokens_dtype: np.dtype[Any] = np.dtype(np.int64)

    @property
    def thread_counts(self) -> tuple[int, ...]:
        """The intra-op thread counts a stage is loaded with (ascending)."""
        return tuple(sorted({self.threads, self.wide_threads}))

    def _options(self, threads: int) -> tuple[Any, list[str]]:
        import onnxruntime as ort

        from engines.kokoro.graph_variants import session_options

        # no memory patterns: they are cached per input shape, and every window and
        # sentence has its own shape (the cache would grow for the process's lifetime)
        opts = session_options(threads, spinning=self.spinning, mem_pattern=False)
        available = ort.get_available_providers()
        providers = ["CPUExecutionProvider"]
        if self.device in ("auto", "cuda") and "CUDAExecutionProvider" in available:
            providers.insert(0, "CUDAExecutionProvider")
        elif self.device == "cuda":
            log.warning("cuda_unavailable", providers=available)
        return opts, providers

    def _load_stage(self, stage: str, source: str | bytes) -> None:
        """One session of ``source`` per thread count (one in all on CUDA)."""
        import onnxruntime as ort

        loaded: dict[int, Any] = {}
        for n in self.thread_counts:
            opts, providers = self._options(n)
            sess = ort.InferenceSession(source, opts, providers=providers)
            loaded[n] = sess
            if sess.get_providers()[0] != "CPUExecutionProvider":
                break  # a GPU session: threads do not matter
        self.sessions[stage] = loaded

    def session(self, stage: str, cores: int | None = None) -> Any:
        """The session of ``stage`` with the most threads within ``cores`` (default: the
        running unit's grant); ``None`` when the stage is not loaded."""
        loaded = self.sessions.get(stage)
        if not loaded:
            return None
        if cores is None:
            cores = unit_grant().cores
        fits = [n for n in loaded if n <= cores]
        return loaded[max(fits)] if fits else loaded[min(loaded)]

    def threads_for(self, cores: int) -> int:
        """Intra-op threads of the session a unit granted ``cores`` runs on."""
        fits = [n for n in self.thread_counts if n <= cores]
        return max(fits) if fits else self.threads

    @property
    def prosody_session(self) -> Any:
        return self.session("prosody", self.threads)

    @property
    def decoder_session(self) -> Any:
        return self.session("decoder", self.threads)

    def load(self) -> None:
        if not self.model_path.is_file():
            raise ModelFileError(f"model file {self.model_path} does not exist")
        fix_mmap_threshold()
        graphs: SplitGraphs | None = self._stages
        converted = read_manifest(self.model_path)  # raises when stale or corrupt
        if converted is not None:
            graphs = converted_sources(converted, self.model_path, self.want_split)
        elif self.want_split and graphs is None:
            try:
                graphs = split_sources(self.model_path)
            except Exception as exc:  # a corrupt or foreign graph: whole-utterance inference
                log.warning("graph_split_unavailable", reason=repr(exc))
                graphs = None
        if not self.want_split:
            graphs = None
        try:
            if graphs is not None:
                self._load_stage("prosody", graphs.prosody)
                norms = self._stage_norms
                if graphs.frame is not None:
                    frame, norms["frame"] = _with_norm_inputs(graphs.frame)
                    self._load_stage("frame", frame)
                    del frame
                decoder, norms["decoder"] = _with_norm_inputs(graphs.decoder)
                self._load_stage("decoder", decoder)
                del decoder
                # statistics for one stage but not the other: windows take their own
                if norms["decoder"] and norms.get("frame", 1):
                    self.frame_norms = norms.get("frame", 0)
                    self.norm_count = self.frame_norms + norms["decoder"]
                # the stage's own audio output (any export), read once, not per window
                self._audio_output = self.session("decoder", self.threads).get_outputs()[0].name
                self.split = True
            elif converted is not None:  # no duration tensor to cap in our own export
                self._load_stage("whole", str(self.model_path))
            else:
                patched = capped_model_source(self.model_path) if self.edge_cap else None
                source = str(self.model_path) if patched is None else patched
                self._load_stage("whole", source)
                del patched, source
        except Exception as exc:
            self.sessions.clear()
            raise ModelFileError(
                f"model file {self.model_path} is not a loadable ONNX model: {exc}"
            ) from exc
        del graphs
        live = self.session("prosody" if self.split else "whole", self.threads)
        inputs = {i.name: i for i in live.get_inputs()}
        self.providers = list(live.get_providers())
        types = {
            "tensor(float)": np.float32,
            "tensor(int64)": np.int64,
            "tensor(int32)": np.int32,
            "tensor(float16)": np.float16,
        }
        self._tokens_name = "input_ids" if "input_ids" in inputs else "tokens"
        missing = {self._tokens_name, "style", "speed"} - set(inputs)
        if missing:
            self.sessions.clear()
            self.split = False
            raise ModelFileError(
                f"model file {self.model_path} is not a Kokoro graph: inputs "
                f"{sorted(inputs)} lack {sorted(missing)}"
            )
        self._tokens_dtype = np.dtype(types.get(inputs[self._tokens_name].type, np.int64))
        self._style_dtype = np.dtype(types.get(inputs["style"].type, np.float32))
        self._speed_dtype = np.dtype(types.get(inputs["speed"].type, np.float32))
        self.capped = DUR_CAP_INPUT in inputs
        log.info(
            "model_loaded",
            path=str(self.model_path),
            providers=self.providers,
            threads=list(self.thread_counts),
            edge_cap=self.capped,
            split=self.split,
            voice_norms=self.norm_count,
        )

    def set_marks(self, marks: frozenset[int]) -> None:
        """Token ids of punctuation marks: a phrase's final mark gets ``MARK_FRAMES``."""
        self.marks = frozenset(marks)

    def duration_cap(self, tokens: Sequence[int]) -> np.ndarray[Any, np.dtype[np.int64]]:
        """Per-position frame caps for ``[pad, *tokens, pad]``: only the end is capped.

        The leading pad keeps the model's own length (the comment on ``MARK_FRAMES``).
        """
        cap = np.full(len(tokens) + 2, NO_CAP, dtype=np.int64)
        cap[-1] = OPEN_TAIL_PAD_FRAMES
        if tokens and tokens[-1] in self.marks:
            cap[-2] = MARK_FRAMES
            cap[-1] = TAIL_PAD_FRAMES
        # The last phoneme is left alone: the graph lengthens it to ~20 frames, mostly
        # silence, but capping it at 10 cut 0.2-0.3 s of audible decay (measured).
        return cap

    def _feeds(self, tokens: Sequence[int], style: FloatArray, speed: float) -> dict[str, Any]:
        speed_value: float | int = speed
        if self._speed_dtype.kind in "iu":
            speed_value = max(1, round(speed))
        feeds: dict[str, Any] = {
            self._tokens_name: np.array([[0, *tokens, 0]], dtype=self._tokens_dtype),
            "style": np.asarray(style, dtype=self._style_dtype).reshape(1, -1),
            "speed": np.array([speed_value], dtype=self._speed_dtype),
        }
        if self.capped:
            feeds[DUR_CAP_INPUT] = self.duration_cap(tokens)
        return feeds

    def _run(
        self,
        session: Any,
        feeds: dict[str, Any],
        cancel: CancelToken,
        outputs: list[str] | None = None,
        *,
        shrink: bool = True,
        recallable: bool = False,
    ) -> list[Any]:
        """One run of ``session``; ended early when ``cancel`` fires
        (``SynthesisCancelled``), and with ``recallable`` when the pool recalls the
        unit running in this thread (``UnitGrant.recall``: ``UnitRecalled``)."""
        import onnxruntime as ort

        if session is None:
            raise SynthesisError("model not loaded")
        run_options = ort.RunOptions()
        run_options.log_severity_level = 4  # a terminated run is not an error worth a line
        if shrink:
            run_options.add_run_config_entry(*_SHRINK)  # Rule 3
        recall = unit_grant().recall if recallable else None
        with self._gate:
            cancel.raise_if_cancelled()
            if recall is not None and recall.cancelled:
                raise UnitRecalled()
            forget = cancel.on_cancel(lambda: _terminate(run_options))
            unrecall = None if recall is None else recall.on_cancel(lambda: _terminate(run_options))
            try:
                result: list[Any] = session.run(outputs, feeds, run_options)
            except Exception as exc:
                if cancel.cancelled:
                    raise SynthesisCancelled() from None
                if recall is not None and recall.cancelled:
                    raise UnitRecalled() from None
                raise SynthesisError(f"inference failed: {exc}") from exc
            finally:
                forget()
                if unrecall is not None:
                    unrecall()
        cancel.raise_if_cancelled()
        return result

    def infer(
        self, tokens: Sequence[int], style: FloatArray, speed: float, cancel: CancelToken
    ) -> FloatArray:
        """Whole-utterance inference (the unsplit graph, or both stages over all frames)."""
        if self.split:
            prosody = self.with_features(self.prosody(tokens, style, speed, cancel), style, cancel)
            return self.decode(prosody, 0, prosody.n_frames, style, cancel)
        outputs = self._run(self.session("whole"), self._feeds(tokens, style, speed), cancel)
        return np.asarray(outputs[0], dtype=np.float32).reshape(-1)

    def prosody(
        self, tokens: Sequence[int], style: FloatArray, speed: float, cancel: CancelToken
    ) -> Prosody:
        """The prosody stage for one sentence of ``tokens`` (<= 510)."""
        session = self.session("prosody")
        keep = len(tokens) <= PROSODY_KEEP_TOKENS
        outputs = self._run(session, self._feeds(tokens, style, speed), cancel, shrink=not keep)
        names = [o.name for o in session.get_outputs()]
        out = dict(zip(names, outputs, strict=True))
        features, asr = out.get("features"), out.get("asr")
        return Prosody(
            features=None if features is None else np.asarray(features, np.float32),
            asr=None if asr is None else np.asarray(asr, np.float32),
            f0=np.asarray(out["f0"], np.float32),
            energy=np.asarray(out["energy"], np.float32),
            phase=np.asarray(out["phase"], np.float32),
            durations=np.asarray(out["durations"], np.int64).reshape(-1),
        )

    def decode(
        self,
        prosody: Prosody,
        start: int,
        end: int,
        style: FloatArray,
        cancel: CancelToken,
        ahead: int = 0,
    ) -> FloatArray:
        """Audio of frames ``[start, end)`` of ``prosody`` (600 samples per frame); the
        instance norms take ``prosody.norms`` when given, else the window's own. Without
        ``prosody.features`` the frame stage runs on the window, ``ahead`` frames after
        it (for the next windows: a run of the frame stage costs about 13 ms on one
        thread before its first frame, 0.4 ms a frame) and ``FRAME_MARGIN`` frames on
        each side (exact with given statistics; without them it runs on the whole
        sentence, once: ``with_features``); ``prosody.span`` keeps what it ran."""
        if not 0 <= start < end <= prosody.n_frames:
            raise SynthesisError(f"window [{start}, {end}) outside 0..{prosody.n_frames}")
        a, b = 2 * start, 2 * end
        features = prosody.features
        if features is not None:
            features = features[:, :, a:b]
        else:
            features = self._features(prosody, start, end, style, cancel, ahead)
        feeds = {
            "features": np.ascontiguousarray(features),
            "f0": np.ascontiguousarray(prosody.f0[:, a:b]),
            "phase": np.ascontiguousarray(prosody.phase[:, a:b, :]),
            "style": np.asarray(style, dtype=self._style_dtype).reshape(1, -1),
        }
        feeds.update(self._norm_feeds("decoder", prosody.norms))
        outputs = self._run(
            self.session("decoder"), feeds, cancel, [self._audio_output], recallable=True
        )
        return np.asarray(outputs[0], dtype=np.float32).reshape(-1)

    def prepare(
        self,
        prosody: Prosody,
        start: int,
        end: int,
        style: FloatArray,
        cancel: CancelToken,
        ahead: int = 0,
    ) -> None:
        """The frame stage's output for frames ``[start, end)`` (``PreparedBackend``):
        windows decoded at once then only read ``prosody.span``."""
        if not 0 <= start < end <= prosody.n_frames:
            raise SynthesisError(f"frames [{start}, {end}) outside 0..{prosody.n_frames}")
        if prosody.features is None:
            self._features(prosody, start, end, style, cancel, ahead)

    def covered(self, prosody: Prosody, start: int, end: int) -> bool:
        """Whether decodes of frames ``[start, end)`` need no run of the frame stage
        (``PreparedBackend``): the sentence's whole run, or the span last run covers them."""
        if prosody.features is not None:
            return True
        norms = prosody.norms if self.norm_count else None
        with self._span_lock:
            return prosody.span.covers(start, end, prosody.n_frames, norms)

    def _features(
        self,
        prosody: Prosody,
        start: int,
        end: int,
        style: FloatArray,
        cancel: CancelToken,
        ahead: int = 0,
    ) -> npt.NDArray[np.float32]:
        """The frame stage's output for frames ``[start, end)``, from ``prosody.span`` or
        a new run: with given statistics on these frames (``decode``), else on the whole
        sentence with its own."""
        span, n = prosody.span, prosody.n_frames
        norms = prosody.norms if self.norm_count else None
        with self._span_lock:
            if span.covers(start, end, n, norms):
                assert span.features is not None
                return span.features[:, :, 2 * (start - span.start) : 2 * (end - span.start)]
        lo = max(0, start - FRAME_MARGIN) if norms is not None else 0
        hi = min(n, end + max(0, ahead) + FRAME_MARGIN) if norms is not None else n
        out = self._frame(prosody, lo, hi, style, norms, cancel)[0]
        with self._span_lock:
            span.start, span.end, span.features, span.norms = lo, hi, out, norms
        return out[:, :, 2 * (start - lo) : 2 * (end - lo)]

    def _norm_feeds(self, stage: str, norms: NormStats | None) -> dict[str, Any]:
        """The norm inputs of ``stage``: its part of ``norms``, else its own (weight 1)."""
        count = self._stage_norms.get(stage, 0)
        if not count:
            return {}
        if norms is None or not self.norm_count:
            return own_feeds(count)
        first = 0 if stage == "frame" else self.frame_norms
        return norms.feeds(first, count)

    def _frame(
        self,
        prosody: Prosody,
        start: int,
        end: int,
        style: FloatArray,
        norms: NormStats | None,
        cancel: CancelToken,
        stats: bool = False,
    ) -> list[Any]:
        """The frame stage over frames ``[start, end)``: ``[features]``, and with ``stats``
        each of its norms' own means, then variances (weight 1)."""
        if prosody.asr is None:
            raise SynthesisError("this prosody stage gives no frame-stage input")
        feeds = {
            "asr": np.ascontiguousarray(prosody.asr[:, :, start:end]),
            "f0": np.ascontiguousarray(prosody.f0[:, 2 * start : 2 * end]),
            "energy": np.ascontiguousarray(prosody.energy[:, 2 * start : 2 * end]),
            "style": np.asarray(style, dtype=self._style_dtype).reshape(1, -1),
        }
        feeds.update(self._norm_feeds("frame", norms))
        names = ["features"]
        if stats:
            count = self._stage_norms.get("frame", 0)
            names += [MEAN_OUTPUT.format(k) for k in range(count)]
            names += [VAR_OUTPUT.format(k) for k in range(count)]
        return self._run(self.session("frame"), feeds, cancel, names)

    def with_features(self, prosody: Prosody, style: FloatArray, cancel: CancelToken) -> Prosody:
        """``prosody`` with the whole sentence's ``features`` (the frame stage over all
        frames, its norms taking the sentence's own statistics): what every window then
        slices; ``prosody`` itself when it has them."""
        if prosody.features is not None:
            return prosody
        own = replace(prosody, norms=None)  # the same span: computed once
        features = self._features(own, 0, prosody.n_frames, style, cancel)
        return replace(prosody, features=np.asarray(features, np.float32))

    def sentence_norms(
        self, prosody: Prosody, style: FloatArray, cancel: CancelToken
    ) -> tuple[int, list[Any], list[Any]]:
        """The instance-norm statistics of the whole sentence of ``prosody`` (its frames,
        each norm's mean and variance, the frame stage's first): the frame stage and one
        decode of all frames, with their own."""
        if not self.norm_count:
            raise SynthesisError("this decoder's instance norms take no statistics")
        means: list[Any] = []
        variances: list[Any] = []
        if prosody.features is None:
            out = self._frame(prosody, 0, prosody.n_frames, style, None, cancel, stats=True)
            k = self.frame_norms
            means, variances = list(out[1 : 1 + k]), list(out[1 + k :])
            prosody = replace(prosody, features=np.asarray(out[0], np.float32))
        assert prosody.features is not None
        count = self._stage_norms["decoder"]
        feeds = {
            "features": prosody.features,
            "f0": prosody.f0,
            "phase": prosody.phase,
            "style": np.asarray(style, dtype=self._style_dtype).reshape(1, -1),
            **own_feeds(count),
        }
        names = [MEAN_OUTPUT.format(k) for k in range(count)]
        names += [VAR_OUTPUT.format(k) for k in range(count)]
        out = self._run(self.session("decoder"), feeds, cancel, names)
        return prosody.n_frames, means + list(out[:count]), variances + list(out[count:])

    def close(self) -> None:
        self.sessions.clear()
        self.split = False


def _with_norm_inputs(source: str | bytes) -> tuple[str | bytes, int]:
    """The decoder ``source`` with instance norms that take a voice's statistics
    (``norms.add_norm_inputs``, Rule 2 there) and how many it has; ``source`` itself
    and 0 when the graph has none or cannot be rewritten (windows keep their own)."""
    import onnx

    try:
        model = onnx.load_from_string(source) if isinstance(source, bytes) else onnx.load(source)
        count = add_norm_inputs(model)
        return (model.SerializeToString(), count) if count else (source, 0)
    except Exception as exc:  # never worse than the decoder as given
        log.warning("voice_norms_unavailable", reason=repr(exc))
        return source, 0


@functools.cache
def _libc(name: str, *argtypes: Any) -> Any | None:
    """The C library's function ``name`` (returning int, taking ``argtypes``), or None
    where it has none (musl, macOS)."""
    import ctypes

    try:
        fn = getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None
    fn.argtypes = list(argtypes)
    fn.restype = ctypes.c_int
    return fn


def fix_mmap_threshold() -> bool:
    """Fix glibc's mmap threshold at ``MMAP_THRESHOLD`` (Rule 3); False where the C
    library has no ``mallopt`` (musl, macOS), which changes nothing else."""
    import ctypes

    mallopt = _libc("mallopt", ctypes.c_int, ctypes.c_int)
    return mallopt is not None and bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))


def trim_heap() -> bool:
    """Give the free pages inside glibc's arenas back to the system (``malloc_trim(0)``,
    Rule 3); False where the C library has no ``malloc_trim`` (musl, macOS), which
    changes nothing else. Takes each arena's lock in turn, briefly: call it off the
    event loop."""
    import ctypes

    malloc_trim = _libc("malloc_trim", ctypes.c_size_t)
    if malloc_trim is None:
        return False
    malloc_trim(0)
    return True


def converted_sources(manifest: Manifest, model_path: Path, split: bool) -> SplitGraphs | None:
    """A ``kokoro-convert`` directory: its own stage files (nothing is cut), all sha256-checked.

    Split: the two stages listed for ``model_path``; else None after checking
    the whole graph. Raises ``ModelFileError`` with the reason when stale or corrupt.
    """
    if split:
        graphs = manifest.stages(model_path)
        log.info("converted_stages", model=str(model_path), manifest=str(manifest.path))
        return graphs
    manifest.whole(model_path)
    return None


def _terminate(run_options: Any) -> None:
    """Ask onnxruntime to abandon the run (checked between graph nodes)."""
    run_options.terminate = True
