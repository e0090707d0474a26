"""``Qwen3Synthesizer``: the Qwen3-TTS engine behind the runtime's ``Synthesizer`` interface.

Per utterance: the talker + code predictor (``FrameGenerator.iter_frames``)
produce one 16-code frame at a time (12.5 Hz); each frame goes straight into a
``StreamingDecoder`` (ONNX vocoder, small chunks with left context), and every
completed chunk is yielded at once, so the first audio leaves after
``first_chunk_frames`` frames. The cancel token is checked after every frame
(and handed to the engine, which checks it inside its loop).

Concurrent utterances are not serialised: the engine's batch scheduler runs
every active utterance (any call) as one row of each frame step, so
``self_scheduled`` is True: the runtime gives each utterance its own thread
that just iterates ``synthesize`` (which blocks on the scheduler's frames).
Admission is deadline-aware: the call's ``CallState.playback.ahead_s()`` (the
runtime's playback clock; 0 s when there is no listener, ``state.playback`` is
``None``) tells the scheduler which waiting utterance is closest to running dry.
TTFA, underruns and the per-call figures are the runtime's (STATS ``ttfa_*``,
``call.<id>=``, the ``utterance_completed`` log line); this file's stats are the
engine's own timings: prefill, talker, code predictor, vocoder and batch queue wait.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt
import structlog

from engines.qwen3.errors import RequestError
from engines.qwen3.modes import (
    PresetSpeaker,
    QtsMode,
    mode_slug,
    preset_names,
    qts_mode,
    speaker_name,
)
from engines.qwen3.serving.clone_voices import ClonePromptVoices
from engines.qwen3.serving.request import ModeSynthesizeRequest, VoiceClonePrompt
from engines.qwen3.serving.vocoder import SAMPLES_PER_FRAME, StreamingDecoder, Vocoder, VocoderError
from engines.qwen3.serving.vocoder_batch import VocoderBatcher
from engines.qwen3.weights.paths import ModelPathError, ModeModelPaths
from engines.runtime.synth import (
    SAMPLE_RATE,
    CallState,
    CancelToken,
    FloatArray,
    SynthesisCancelled,
    SynthesisError,
    VoiceNotFound,
)
from engines.text import LexiconReload, TextFrontEnd, TextOptions

if TYPE_CHECKING:
    from engines.qwen3.model.config import ModelMetadata
    from engines.qwen3.serving.frame_generator import BatchResult

log = structlog.get_logger(__name__)

DEFAULT_VOICE = "default"
#: docs/wire.md, "Per-call engine behaviour": no utterance over 120 s;
#: 1500 frames = 120 s at 12.5 Hz.
MAX_FRAMES_CAP = 1500
#: Vocoder left context per streamed chunk: one attention window of the codec decoder
#: (README, Qwen3: measured SNR vs the full decode 27 dB at 25 frames, 45 dB at 72).
DEFAULT_LEFT_CONTEXT = 72


@runtime_checkable
class FrameSource(Protocol):
    """What the synthesiser needs from a ``FrameGenerator`` (tests script their own)."""

    timings: dict[str, float]

    @property
    def mode(self) -> QtsMode | str: ...

    def iter_frames(
        self, req: ModeSynthesizeRequest, *, cancel: Callable[[], bool] | None = None
    ) -> Iterator[npt.NDArray[np.int64]]: ...

    def generate_codes(
        self, req: ModeSynthesizeRequest, *, cancel: Callable[[], bool] | None = None
    ) -> tuple[npt.NDArray[np.int64], dict[str, float]]: ...

    def preset_speakers(self) -> list[PresetSpeaker]: ...


@runtime_checkable
class BatchingFrameSource(FrameSource, Protocol):
    """A ``FrameSource`` with the batch scheduler's extras (``FrameGenerator``).

    Optional: checked once when the model loads (``Qwen3Synthesizer.batching_generator``).
    """

    def submit(
        self,
        req: ModeSynthesizeRequest,
        *,
        cancel: Callable[[], bool] | None = None,
        urgency: Callable[[], float] | None = None,
        name: str = "",
        on_end: Callable[[dict[str, float]], None] | None = None,
    ) -> Iterator[npt.NDArray[np.int64]]: ...

    def batch_stats(self) -> dict[str, float]: ...

    def generate_batch(
        self, reqs: Sequence[tuple[str, ModeSynthesizeRequest]]
    ) -> list[BatchResult]: ...

    def close(self) -> None: ...


@runtime_checkable
class DescribedModel(Protocol):
    """A frame source that tells the loaded checkpoint's facts (``FrameGenerator.meta``).

    Optional: voice-clone prompts are checked against its size and width when it has them.
    """

    @property
    def meta(self) -> ModelMetadata: ...


@dataclass
class Qwen3Options:
    """Everything a ``Qwen3Synthesizer`` needs to find, load and drive the model."""

    model_dir: Path | None = None
    mode: str = "customvoice"
    size: str | None = None  # "1.7b" / "0.6b"; None = whichever exists, 1.7b first
    talker_gguf: Path | None = None
    code_predictor_gguf: Path | None = None
    tokenizer_gguf: Path | None = None
    vocoder_onnx: Path | None = None
    speaker: str | None = None  # CustomVoice preset (default voice); None = first preset
    language: str = "auto"
    instruct: str | None = None
    speaker_embedding: Path | None = None  # Base: x-vector .npy (float32 [hidden])
    ref_codes: Path | None = None  # Base ICL: reference codec frames .npy (int [R, 16])
    ref_text: str | None = None  # Base ICL: transcript of the reference audio
    clone_prompt: Path | None = None  # Base: qwen3-clone-prompt .npz (default voice = its stem)
    clone_prompt_dir: Path | None = None  # Base: every *.npz in it is a voice
    device: str = "cpu"
    dtype: str = "float32"
    vocoder_threads: int | None = None
    chunk_frames: int = 4
    first_chunk_frames: int | None = None  # None: the ramp 1, 2, 4, ... up to chunk_frames
    left_context: int = DEFAULT_LEFT_CONTEXT
    max_frames: int = MAX_FRAMES_CAP
    greedy: bool = False
    seed: int | None = None
    non_streaming: bool = False
    sampling: dict[str, float] = field(default_factory=dict)
    warm_up_text: str = "Hello."
    text: TextOptions = field(default_factory=TextOptions)  # --no-normalize, --lexicon
    max_batch: int | None = None  # None: the device default (BatchOptions.for_device)
    max_context: int | None = None

    def model_paths(self) -> ModeModelPaths:
        """Resolve the four model files (explicit paths win over the directory search)."""
        explicit = {
            "talker_gguf": self.talker_gguf,
            "code_predictor_gguf": self.code_predictor_gguf,
            "tokenizer_gguf": self.tokenizer_gguf,
            "vocoder_onnx": self.vocoder_onnx,
        }
        if self.model_dir is not None:
            return ModeModelPaths.from_model_dir(
                self.model_dir, self.mode, size=self.size, **explicit
            )
        if self.talker_gguf is None:
            raise SynthesisError("qwen3: give --model-dir or at least --talker-gguf")
        return ModeModelPaths.from_files(
            self.talker_gguf, self.code_predictor_gguf, self.tokenizer_gguf, self.vocoder_onnx
        )


GeneratorLoader = Callable[[ModeModelPaths, Qwen3Options], FrameSource]


def _default_generator_loader(paths: ModeModelPaths, opts: Qwen3Options) -> FrameSource:
    import torch  # the model stack loads only here: option checks stay light

    from engines.qwen3.model.tts_model import resolve_device
    from engines.qwen3.serving.frame_generator import BatchOptions, FrameGenerator

    base = BatchOptions.for_device(resolve_device(opts.device))
    batching = BatchOptions(
        max_batch=opts.max_batch or base.max_batch,
        max_context=opts.max_context or base.max_context,
        cuda_graphs=base.cuda_graphs,
    )
    with torch.inference_mode():
        return FrameGenerator.load_mode(
            paths, _qts_mode(opts.mode), device=opts.device, dtype=opts.dtype, batching=batching
        )


def _qts_mode(mode: str) -> QtsMode:
    try:
        return qts_mode(mode)
    except RequestError as exc:
        raise SynthesisError(f"qwen3: {exc}") from exc


def ramp(chunk_frames: int) -> list[int]:
    """First chunk sizes before steady ``chunk_frames`` chunks: 1, 2, 4, ... (< chunk_frames)."""
    out = []
    n = 1
    while n < chunk_frames:
        out.append(n)
        n *= 2
    return out


class Qwen3Synthesizer:
    """Qwen3-TTS (GGUF talker + code predictor, ONNX vocoder) as a ``Synthesizer``."""

    name = "qwen3"
    sample_rate = SAMPLE_RATE

    def __init__(self, options: Qwen3Options, *, generator_loader: GeneratorLoader | None = None):
        self.options = options
        self.mode = mode_slug(options.mode)  # validates early; cheap
        if options.chunk_frames < 1:
            raise ValueError(f"chunk_frames must be >= 1, got {options.chunk_frames}")
        if not 1 <= options.max_frames <= MAX_FRAMES_CAP:
            raise ValueError(f"max_frames must be in 1..{MAX_FRAMES_CAP}, got {options.max_frames}")
        self._generator_loader = generator_loader or _default_generator_loader
        # markup filter, normaliser, lexicon (respellings only: the tokenizer reads text)
        self.text = TextFrontEnd(options.text, ipa=False, lang=options.language)
        self.generator: FrameSource | None = None
        self._batching: BatchingFrameSource | None = None  # the generator, when it batches
        self.vocoder: Vocoder | None = None
        self.paths: ModeModelPaths | None = None
        self._checked = False  # options checked against the request rules (load)
        self._speakers: list[str] = []
        self._speaker_embedding: np.ndarray | None = None
        self._ref_codes: np.ndarray | None = None
        self._lock = threading.Lock()
        self._prompts = ClonePromptVoices()
        self._stats: dict[str, float] = {}
        self._totals = {"utterances": 0.0, "frames": 0.0, "cancelled": 0.0}
        self._speaking = 0  # utterances in synthesize() now (the vocoder batcher's hint)
        self._batcher: VocoderBatcher | None = None

    #: The runtime keeps one thread per utterance iterating ``synthesize`` and does not
    #: serialise them: the engine's batch scheduler runs them together.
    self_scheduled = True

    # -- lifecycle ------------------------------------------------------------------------

    def load(self, *, need_vocoder: bool = True) -> None:
        """Resolve and check every file, load vocoder and engine; raise a clear error first.

        ``need_vocoder=False`` (offline code generation) skips the vocoder.
        """
        o = self.options
        try:
            paths = o.model_paths().check(need_vocoder=need_vocoder)
        except ModelPathError as exc:
            raise SynthesisError(str(exc)) from exc
        if o.device not in ("cpu", "cuda"):
            raise SynthesisError(f"qwen3: device must be cpu or cuda, got {o.device!r}")
        if o.device == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise SynthesisError("qwen3: --device cuda but torch sees no CUDA device")
        if o.speaker_embedding is not None:
            self._speaker_embedding = _load_embedding(o.speaker_embedding)
        if o.ref_codes is not None:
            if self.mode != "base":
                raise SynthesisError(
                    f"qwen3: --ref-codes (voice cloning) needs mode base, not {self.mode}"
                )
            if not o.ref_text or not o.ref_text.strip():
                raise SynthesisError(
                    "qwen3: --ref-codes needs --ref-text (the reference transcript)"
                )
            self._ref_codes = _load_ref_codes(o.ref_codes)
        # Check the options against the request rules before the (slow) model load.
        self._checked = True
        self._speakers = preset_names() if self.mode == "customvoice" else []
        if self.mode != "customvoice" and o.speaker is not None:
            raise SynthesisError(f"qwen3: --speaker is only for customvoice, not {self.mode}")
        self.make_request("check", o.speaker)
        vocoder = None
        if need_vocoder:
            try:
                vocoder = Vocoder(paths.vocoder_onnx, device=o.device, threads=o.vocoder_threads)
            except VocoderError as exc:
                raise SynthesisError(str(exc)) from exc
        try:
            generator = self._generator_loader(paths, o)
        except SynthesisError:
            raise
        except Exception as exc:
            raise SynthesisError(
                f"qwen3: cannot load the model ({paths.describe()}): {exc}"
            ) from exc
        files_mode = mode_slug(generator.mode)
        if files_mode != self.mode:
            raise SynthesisError(
                f"qwen3: the model files are a {files_mode} checkpoint, not {self.mode}"
            )
        self.paths, self.vocoder, self.generator = paths, vocoder, generator
        self._batching = generator if isinstance(generator, BatchingFrameSource) else None
        self._load_clone_prompts(generator)
        if vocoder is not None:
            self._batcher = VocoderBatcher(vocoder, active=lambda: self._speaking)
        self._speakers = self._preset_speakers()
        if self.mode == "customvoice":
            if not self._speakers:
                raise SynthesisError("qwen3: the CustomVoice model defines no preset speakers")
            if o.speaker is not None:
                self._resolve_speaker(o.speaker)  # raises VoiceNotFound with the list
        log.info(
            "synthesizer_loaded",
            engine=self.name,
            mode=self.mode,
            device=o.device,
            dtype=o.dtype,
            files=paths.describe(),
            vocoder=vocoder.describe() if vocoder is not None else None,
            speakers=len(self._speakers),
        )

    def warm_up(self) -> None:
        """Generate and vocode a few frames so that kernels and caches are ready."""
        self._require_loaded()
        t0 = time.perf_counter()
        req = self.make_request(self.options.warm_up_text, self.default_voice, max_frames=4)
        assert self.generator is not None
        frames = list(self.generator.iter_frames(req))
        if frames:
            assert self.vocoder is not None
            self.vocoder.decode(np.stack(frames))
        log.info("engine_warmed", engine=self.name, ms=round((time.perf_counter() - t0) * 1e3))

    def close(self) -> None:
        with self._lock:
            if self.vocoder is not None:
                self.vocoder.close()
            if self._batching is not None:
                self._batching.close()
            self.generator = None
            self._batching = None
            self.vocoder = None

    @property
    def batching_generator(self) -> BatchingFrameSource | None:
        """The loaded generator when it runs the batch scheduler (checked at load), else None."""
        return self._batching

    # -- voices ---------------------------------------------------------------------------

    def voices(self) -> list[str]:
        if self.mode == "customvoice":
            return list(self._speakers) if self._speakers else preset_names()
        return self._prompts.voices()

    # Voice-clone prompts (Base): engine-wide with SET_VOICE, per call with SET_CALL_VOICE
    # (the runtime keeps the call's voice in ``CallState``; ``synthesize`` reads ``voice``).
    def _load_clone_prompts(self, generator: FrameSource) -> None:
        o = self.options
        if o.clone_prompt is None and o.clone_prompt_dir is None:
            return
        if self.mode != "base":
            raise SynthesisError(f"qwen3: --clone-prompt needs mode base, not {self.mode}")
        meta = generator.meta if isinstance(generator, DescribedModel) else None
        self._prompts.configure(
            o.clone_prompt,
            o.clone_prompt_dir,
            model_size=meta.model_size if meta is not None else None,
            width=meta.talker.hidden_size if meta is not None else None,
        )

    def reload_voices(self) -> list[str]:
        """Rescan ``--clone-prompt-dir`` (cmd port ``RELOAD_VOICES``); returns the voices."""
        self._prompts.rescan()
        return self.voices()

    @property
    def default_voice(self) -> str:
        if self.mode != "customvoice":
            return self._prompts.default or DEFAULT_VOICE
        if self.options.speaker is not None:
            return self.options.speaker.lower()
        names = self.voices()
        return names[0] if names else DEFAULT_VOICE

    def _preset_speakers(self) -> list[str]:
        """Lower-case preset names the loaded model defines (engine metadata), else all presets."""
        assert self.generator is not None
        got = self.generator.preset_speakers()
        if got:
            return [speaker_name(s) for s in got]
        return preset_names() if self.mode == "customvoice" else []

    def _resolve_speaker(self, voice: str) -> PresetSpeaker:
        want = voice.strip().lower()
        if want not in self._speakers:
            raise VoiceNotFound(
                f"qwen3: unknown speaker {voice!r}; this model has {', '.join(self._speakers)}"
            )
        for p in PresetSpeaker:
            if speaker_name(p) == want:
                return p
        raise VoiceNotFound(f"qwen3: speaker {voice!r} is not a preset the engine knows")

    # -- synthesis ------------------------------------------------------------------------

    @property
    def ref_codes(self) -> np.ndarray | None:
        """ICL reference frames of the default voice (Base voice cloning), or None."""
        prompt = self._prompts.get(self.default_voice)
        if prompt is not None:
            return prompt.ref_codes
        return self._ref_codes

    def make_request(
        self,
        text: str,
        voice: str | None,
        *,
        max_frames: int | None = None,
        language: str | None = None,
        instruct: str | None = None,
        non_streaming: bool | None = None,
    ) -> ModeSynthesizeRequest:
        """The engine's ``ModeSynthesizeRequest`` for ``text`` in ``voice`` with these options.

        ``language``, ``instruct`` and ``non_streaming`` override the options when given.
        """
        if not self._checked:
            raise SynthesisError("qwen3: model not loaded (call load() first)")
        o = self.options
        mode = _qts_mode(self.mode)
        kw: dict[str, Any] = {
            "text": text,
            "mode": mode,
            "language": language if language is not None else o.language,
            "instruct": instruct if instruct is not None else o.instruct,
            "non_streaming": non_streaming if non_streaming is not None else o.non_streaming,
            "greedy": o.greedy,
            "seed": o.seed,
            "max_frames": max_frames if max_frames is not None else o.max_frames,
        }
        prompt = None
        if self.mode == "customvoice":
            kw["speaker"] = self._resolve_speaker(voice or self.default_voice)
        elif (prompt := self._prompts.get(voice or self.default_voice)) is not None:
            pass
        elif voice not in (None, DEFAULT_VOICE):
            raise VoiceNotFound(
                f"qwen3: unknown voice {voice!r}; this engine has {', '.join(self.voices())}"
            )
        if prompt is not None and prompt.ref_codes is not None:
            kw["voice_clone_prompt"] = VoiceClonePrompt(
                ref_code=prompt.ref_codes,
                ref_text=prompt.ref_text,
                ref_spk_embedding=prompt.x_vector,
                icl_mode=True,
            )
        elif prompt is not None:
            kw["speaker_embedding"] = prompt.x_vector
        elif self._ref_codes is not None:
            kw["voice_clone_prompt"] = VoiceClonePrompt(
                ref_code=self._ref_codes,
                ref_text=o.ref_text,
                ref_spk_embedding=self._speaker_embedding,
                icl_mode=True,
            )
        elif self._speaker_embedding is not None and self.mode == "base":
            kw["speaker_embedding"] = self._speaker_embedding
        kw.update(o.sampling)
        try:
            req = ModeSynthesizeRequest(**kw)
            req.validate()
        except (TypeError, ValueError) as exc:
            raise SynthesisError(f"qwen3: bad request: {exc}") from exc
        return req

    def synthesize(self, text: str, state: CallState, cancel: CancelToken) -> Iterator[FloatArray]:
        self._require_loaded()
        text = self.text.speak(text).text  # what the tokenizer sees: the spoken form
        if not text.strip():
            return
        cancel.raise_if_cancelled()
        voice = state.voice  # the runtime's snapshot: request, call, then engine voice
        req = self.make_request(text, voice)
        prompt = self._prompts.get(voice or self.default_voice) if self.mode == "base" else None
        ref = prompt.ref_codes if prompt is not None else self._ref_codes
        assert self.vocoder is not None
        o = self.options
        first = o.first_chunk_frames
        dec = StreamingDecoder(
            self.vocoder,
            chunk_frames=o.chunk_frames,
            left_context=o.left_context,
            first_chunk_frames=first,
            ramp=ramp(o.chunk_frames) if first is None else None,
            ref_codes=ref,  # ICL: the reference frames are the decoder's context
            runner=self._batcher.run if self._batcher is not None else None,
        )
        with self._lock:
            self._speaking += 1
        try:
            yield from self._run(req, dec, cancel, state)
        finally:
            with self._lock:
                self._speaking -= 1

    def _frames(
        self,
        req: ModeSynthesizeRequest,
        cancel: CancelToken,
        ahead: Callable[[], float],
        timings: dict[str, float],
    ) -> Iterator[npt.NDArray[np.int64]]:
        eng = self.generator
        assert eng is not None
        if self._batching is None:  # a plain FrameSource: no admission hints
            it = eng.iter_frames(req, cancel=lambda: cancel.cancelled)
            yield from it
            timings.update(eng.timings)
            return
        yield from self._batching.submit(
            req, cancel=lambda: cancel.cancelled, urgency=ahead, on_end=timings.update
        )

    def _run(
        self,
        req: ModeSynthesizeRequest,
        dec: StreamingDecoder,
        cancel: CancelToken,
        state: CallState,
    ) -> Iterator[FloatArray]:
        t0 = time.perf_counter()
        voc_ms = 0.0
        ttfa_ms = -1.0
        frames = 0
        samples = 0
        done = False
        timings: dict[str, float] = {}

        def ahead() -> float:  # the scheduler's urgency: the runtime's playback clock
            pb = state.playback
            return 0.0 if pb is None else pb.ahead_s()

        try:
            for frame in self._frames(req, cancel, ahead, timings):
                cancel.raise_if_cancelled()
                frames += 1
                tv = time.perf_counter()
                audio = dec.push(frame)
                voc_ms += (time.perf_counter() - tv) * 1e3
                if audio is not None:
                    if ttfa_ms < 0:
                        ttfa_ms = (time.perf_counter() - t0) * 1e3
                    samples += audio.shape[0]
                    yield audio
                    cancel.raise_if_cancelled()
            cancel.raise_if_cancelled()
            tv = time.perf_counter()
            rest = dec.flush()
            voc_ms += (time.perf_counter() - tv) * 1e3
            if rest.size:
                if ttfa_ms < 0:
                    ttfa_ms = (time.perf_counter() - t0) * 1e3
                samples += rest.shape[0]
                yield rest
            done = True
        except SynthesisCancelled:
            self._totals["cancelled"] += 1
            raise
        except (SynthesisError, GeneratorExit):
            raise
        except Exception as exc:
            if cancel.cancelled:
                self._totals["cancelled"] += 1
                raise SynthesisCancelled() from exc
            if isinstance(exc, VocoderError | ValueError):
                raise SynthesisError(f"qwen3: {exc}") from exc
            raise SynthesisError(f"qwen3: synthesis failed: {exc}") from exc
        finally:
            wall_ms = (time.perf_counter() - t0) * 1e3
            self._record(frames, samples, wall_ms, voc_ms, ttfa_ms, done, timings)

    def _record(
        self,
        frames: int,
        samples: int,
        wall_ms: float,
        voc_ms: float,
        ttfa_ms: float,
        done: bool,
        timings: dict[str, float],
    ) -> None:
        audio_s = samples / SAMPLE_RATE
        st: dict[str, float] = {
            "frames": float(frames),
            "audio_s": audio_s,
            "wall_ms": wall_ms,
            "ttfa_ms": ttfa_ms,
            "prefill_ms": float(timings.get("prefill", 0.0)),
            "talker_ms": float(timings.get("talker", 0.0)),
            "code_predictor_ms": float(timings.get("code_predictor", 0.0)),
            "vocoder_ms": voc_ms,
            "queue_ms": float(timings.get("queue", 0.0)),
            "rtf": (wall_ms / 1e3) / audio_s if audio_s > 0 else 0.0,
            "frames_per_s": frames / (wall_ms / 1e3) if wall_ms > 0 else 0.0,
            "completed": 1.0 if done else 0.0,
        }
        with self._lock:
            self._stats = st
            self._totals["utterances"] += 1
            self._totals["frames"] += frames
        log.debug(
            "utterance_synthesized", engine=self.name, **{k: round(v, 2) for k, v in st.items()}
        )

    def stats(self) -> dict[str, float]:
        """The engine's own figures: the last utterance's stage timings, totals, the vocoder
        batcher and the batch scheduler (TTFA, underruns and per-call figures are the
        runtime's)."""
        with self._lock:
            out = {f"last_{k}": v for k, v in self._stats.items()}
            out.update({f"total_{k}": v for k, v in self._totals.items()})
            if self._batcher is not None:
                out["vocoder_runs"] = float(self._batcher.runs)
                out["vocoder_windows"] = float(self._batcher.windows)
        if self._batching is not None:
            out.update({f"batch_{k}": float(v) for k, v in self._batching.batch_stats().items()})
        return out

    def status_suffix(self) -> str:
        return f":MODE:{self.mode}"

    def normalize(self, text: str) -> str:
        """The spoken form of ``text`` (cmd ``NORMALIZE``)."""
        return self.text.speak(text).text

    def reload_lexicon(self) -> LexiconReload:
        """Read ``--lexicon`` again (cmd ``RELOAD_LEXICON``, SIGHUP)."""
        return self.text.reload_lexicon()

    def _require_loaded(self) -> None:
        if self.generator is None or self.vocoder is None:
            raise SynthesisError("qwen3: model not loaded (call load() first)")


def _load_ref_codes(path: Path) -> np.ndarray:
    try:
        arr = np.asarray(np.load(path))
    except (OSError, ValueError) as exc:
        raise SynthesisError(
            f"qwen3: reference codes {str(path)!r}: cannot be read: {exc}"
        ) from exc
    if arr.ndim != 2 or arr.shape[1] != 16 or arr.shape[0] < 1:
        raise SynthesisError(
            f"qwen3: reference codes {str(path)!r}: need shape [frames, 16], got {list(arr.shape)}"
        )
    if not np.issubdtype(arr.dtype, np.integer) or arr.min() < 0 or arr.max() > 2047:
        raise SynthesisError(f"qwen3: reference codes {str(path)!r}: need integers in 0..2047")
    return arr.astype(np.int64)


def _load_embedding(path: Path) -> np.ndarray:
    try:
        arr = np.load(path)
    except (OSError, ValueError) as exc:
        raise SynthesisError(
            f"qwen3: speaker embedding {str(path)!r}: cannot be read: {exc}"
        ) from exc
    arr = np.asarray(arr, dtype=np.float32).reshape(-1)
    if arr.size == 0 or not np.all(np.isfinite(arr)):
        raise SynthesisError(f"qwen3: speaker embedding {str(path)!r}: empty or not finite")
    return arr


__all__ = [
    "DEFAULT_VOICE",
    "SAMPLES_PER_FRAME",
    "BatchingFrameSource",
    "FrameSource",
    "Qwen3Options",
    "Qwen3Synthesizer",
]
