"""``Qwen3Synthesizer``: the Qwen3-TTS engine behind the runtime's ``Synthesizer`` interface.

Per utterance: the talker + code predictor (``Qwen3TtsEngine.iter_frames``)
produce one 16-code frame at a time (12.5 Hz); each frame goes straight into a
``StreamingDecoder`` (ONNX vocoder, small chunks with left context), and every
completed chunk is yielded at once, so the first audio leaves after
``first_chunk_frames`` frames. The cancel token is checked after every frame
(and handed to the engine, which checks it inside its loop).

Model access is serialised with a lock: the engine keeps one KV cache, so two
calls synthesising at the same time take turns per utterance.
"""

from __future__ import annotations

import importlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import structlog

from engines.qwen3.clone_voices import ClonePromptVoices
from engines.qwen3.paths import ModelPathError, ModeModelPaths, mode_slug
from engines.qwen3.vocoder import SAMPLES_PER_FRAME, Vocoder, VocoderError
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

log = structlog.get_logger(__name__)

DEFAULT_VOICE = "default"
#: WIRE.md 4: outputs over 120 s are refused; 1500 frames = 120 s at 12.5 Hz.
MAX_FRAMES_CAP = 1500
#: Vocoder left context per streamed chunk: one attention window of the codec decoder
#: (README, Qwen3: measured SNR vs the full decode 27 dB at 25 frames, 45 dB at 72).
DEFAULT_LEFT_CONTEXT = 72


class FrameEngine(Protocol):
    """What the synthesiser needs from ``Qwen3TtsEngine``."""

    timings: dict[str, float]

    def iter_frames(
        self, req: Any, *, cancel: Callable[[], bool] | None = None
    ) -> Iterator[np.ndarray]: ...


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
    first_chunk_frames: int | None = None
    left_context: int = DEFAULT_LEFT_CONTEXT
    max_frames: int = MAX_FRAMES_CAP
    greedy: bool = False
    seed: int | None = None
    non_streaming: bool = False
    sampling: dict[str, float] = field(default_factory=dict)
    warm_up_text: str = "Hello."
    text: TextOptions = field(default_factory=TextOptions)  # --no-normalize, --lexicon

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


EngineLoader = Callable[[ModeModelPaths, Qwen3Options], Any]


def _default_engine_loader(paths: ModeModelPaths, opts: Qwen3Options) -> Any:
    engine_mod = importlib.import_module("engines.qwen3.engine")
    mode = _qts_mode(_engine_module(), opts.mode)
    return engine_mod.Qwen3TtsEngine.load_mode(paths, mode, device=opts.device, dtype=opts.dtype)


def _qts_mode(engine_mod: Any, mode: str) -> Any:
    slug = mode_slug(mode)
    for m in engine_mod.QtsMode:
        if mode_slug(m) == slug:
            return m
    raise SynthesisError(f"qwen3: mode {mode!r} not supported by the engine")


class Qwen3Synthesizer:
    """Qwen3-TTS (GGUF talker + code predictor, ONNX vocoder) as a ``Synthesizer``."""

    name = "qwen3"
    sample_rate = SAMPLE_RATE

    def __init__(self, options: Qwen3Options, *, engine_loader: EngineLoader | None = None):
        self.options = options
        self.mode = mode_slug(options.mode)  # validates early; cheap
        if options.chunk_frames < 1:
            raise ValueError(f"chunk_frames must be >= 1, got {options.chunk_frames}")
        if not 1 <= options.max_frames <= MAX_FRAMES_CAP:
            raise ValueError(f"max_frames must be in 1..{MAX_FRAMES_CAP}, got {options.max_frames}")
        self._engine_loader = engine_loader or _default_engine_loader
        # markup filter, normaliser, lexicon (respellings only: the tokenizer reads text)
        self.text = TextFrontEnd(options.text, ipa=False, lang=options.language)
        self.engine: Any = None
        self.vocoder: Vocoder | None = None
        self.paths: ModeModelPaths | None = None
        self._api: Any = None  # the engine module (request/enum types)
        self._speakers: list[str] = []
        self._speaker_embedding: np.ndarray | None = None
        self._ref_codes: np.ndarray | None = None
        self._lock = threading.Lock()
        self._prompts = ClonePromptVoices()
        self._stats: dict[str, float] = {}
        self._totals = {"utterances": 0.0, "frames": 0.0, "cancelled": 0.0}

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
        self._api = _engine_module()
        self._speakers = _all_preset_names() if self.mode == "customvoice" else []
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
            engine = self._engine_loader(paths, o)
        except SynthesisError:
            raise
        except Exception as exc:
            raise SynthesisError(
                f"qwen3: cannot load the model ({paths.describe()}): {exc}"
            ) from exc
        engine_mode = getattr(engine, "mode", None)
        if engine_mode is not None and mode_slug(engine_mode) != self.mode:
            raise SynthesisError(
                f"qwen3: the model files are a {mode_slug(engine_mode)} checkpoint, not {self.mode}"
            )
        self.paths, self.vocoder, self.engine = paths, vocoder, engine
        self._load_clone_prompts(engine)
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
        with self._lock:
            frames = list(self.engine.iter_frames(req))
        if frames:
            assert self.vocoder is not None
            self.vocoder.decode(np.stack(frames))
        log.info("engine_warmed", engine=self.name, ms=round((time.perf_counter() - t0) * 1e3))

    def close(self) -> None:
        with self._lock:
            if self.vocoder is not None:
                self.vocoder.close()
            close = getattr(self.engine, "close", None)
            if callable(close):
                close()
            self.engine = None
            self.vocoder = None

    # -- voices ---------------------------------------------------------------------------

    def voices(self) -> list[str]:
        if self.mode == "customvoice":
            return list(self._speakers) if self._speakers else _all_preset_names()
        return self._prompts.voices()

    # Voice-clone prompts (Base): engine-wide with SET_VOICE, per call with SET_CALL_VOICE.
    def _load_clone_prompts(self, engine: Any) -> None:
        o = self.options
        if o.clone_prompt is None and o.clone_prompt_dir is None:
            return
        if self.mode != "base":
            raise SynthesisError(f"qwen3: --clone-prompt needs mode base, not {self.mode}")
        meta = getattr(engine, "meta", None)
        self._prompts.configure(
            o.clone_prompt,
            o.clone_prompt_dir,
            model_size=getattr(meta, "model_size", None),
            width=getattr(getattr(meta, "talker", None), "hidden_size", None),
        )

    def reload_voices(self) -> list[str]:
        """Rescan ``--clone-prompt-dir`` (cmd port ``RELOAD_VOICES``); returns the voices."""
        self._prompts.rescan()
        return self.voices()

    def set_call_voice(self, call_id: int, voice: str | None) -> None:
        """Voice of one call's next utterances (cmd port ``SET_CALL_VOICE``); None clears."""
        if voice is not None and voice not in self.voices():
            raise VoiceNotFound(f"qwen3: unknown voice {voice!r}")
        self._prompts.set_call(call_id, voice)

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
        eng = self.engine
        for attr in ("preset_speakers", "available_speakers", "speakers"):
            got = getattr(eng, attr, None)
            if callable(got):
                got = got()
            if got:
                return [_speaker_name(s) for s in got]
        return _all_preset_names() if self.mode == "customvoice" else []

    def _resolve_speaker(self, voice: str) -> Any:
        want = voice.strip().lower()
        if want not in self._speakers:
            raise VoiceNotFound(
                f"qwen3: unknown speaker {voice!r}; this model has {', '.join(self._speakers)}"
            )
        preset_cls = self._api.PresetSpeaker
        for p in preset_cls:
            if _speaker_name(p) == want:
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

    def make_request(self, text: str, voice: str | None, *, max_frames: int | None = None) -> Any:
        """The engine's ``ModeSynthesizeRequest`` for ``text`` in ``voice`` with these options."""
        if self._api is None:
            raise SynthesisError("qwen3: model not loaded (call load() first)")
        o = self.options
        api = self._api
        mode = _qts_mode(api, self.mode)
        kw: dict[str, Any] = {
            "text": text,
            "mode": mode,
            "language": o.language,
            "instruct": o.instruct,
            "non_streaming": o.non_streaming,
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
            kw["voice_clone_prompt"] = api.VoiceClonePrompt(
                ref_code=prompt.ref_codes,
                ref_text=prompt.ref_text,
                ref_spk_embedding=prompt.x_vector,
                icl_mode=True,
            )
        elif prompt is not None:
            kw["speaker_embedding"] = prompt.x_vector
        elif self._ref_codes is not None:
            kw["voice_clone_prompt"] = api.VoiceClonePrompt(
                ref_code=self._ref_codes,
                ref_text=o.ref_text,
                ref_spk_embedding=self._speaker_embedding,
                icl_mode=True,
            )
        elif self._speaker_embedding is not None and self.mode == "base":
            kw["speaker_embedding"] = self._speaker_embedding
        kw.update(o.sampling)
        try:
            req = api.ModeSynthesizeRequest(**kw)
            validate = getattr(req, "validate", None)
            if callable(validate):
                validate()
        except (TypeError, ValueError) as exc:
            raise SynthesisError(f"qwen3: bad request: {exc}") from exc
        return req

    def synthesize(self, text: str, state: CallState, cancel: CancelToken) -> Iterator[FloatArray]:
        self._require_loaded()
        text = self.text.speak(text).text  # what the tokenizer sees: the spoken form
        if not text.strip():
            return
        cancel.raise_if_cancelled()
        voice = self._prompts.call_voice(state.call_id) or state.voice
        req = self.make_request(text, voice)
        prompt = self._prompts.get(voice or self.default_voice) if self.mode == "base" else None
        ref = prompt.ref_codes if prompt is not None else self._ref_codes
        assert self.vocoder is not None
        o = self.options
        dec = self.vocoder.streaming(
            chunk_frames=o.chunk_frames,
            left_context=o.left_context,
            first_chunk_frames=o.first_chunk_frames,
            ref_codes=ref,  # ICL: the reference frames are the decoder's context
        )
        with self._lock:
            yield from self._run(req, dec, cancel)

    def _run(self, req: Any, dec: Any, cancel: CancelToken) -> Iterator[FloatArray]:
        t0 = time.perf_counter()
        voc_ms = 0.0
        ttfa_ms = -1.0
        frames = 0
        samples = 0
        done = False
        try:
            it = self.engine.iter_frames(req, cancel=lambda: cancel.cancelled)
            for frame in it:
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
            self._record(frames, samples, wall_ms, voc_ms, ttfa_ms, done)

    def _record(
        self, frames: int, samples: int, wall_ms: float, voc_ms: float, ttfa_ms: float, done: bool
    ) -> None:
        timings = dict(getattr(self.engine, "timings", {}) or {})
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
            "rtf": (wall_ms / 1e3) / audio_s if audio_s > 0 else 0.0,
            "frames_per_s": frames / (wall_ms / 1e3) if wall_ms > 0 else 0.0,
            "completed": 1.0 if done else 0.0,
        }
        self._stats = st
        self._totals["utterances"] += 1
        self._totals["frames"] += frames
        log.debug(
            "utterance_synthesized", engine=self.name, **{k: round(v, 2) for k, v in st.items()}
        )

    def stats(self) -> dict[str, float]:
        out = {f"last_{k}": v for k, v in self._stats.items()}
        out.update({f"total_{k}": v for k, v in self._totals.items()})
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
        if self.engine is None or self.vocoder is None:
            raise SynthesisError("qwen3: model not loaded (call load() first)")


def _engine_module() -> Any:
    """The module with ``QtsMode``, ``PresetSpeaker`` and ``ModeSynthesizeRequest``."""
    return importlib.import_module("engines.qwen3.request")


def _speaker_name(s: Any) -> str:
    if isinstance(s, str):
        return s.lower()
    as_str = getattr(s, "as_str", None)
    if callable(as_str):
        return str(as_str()).lower()
    value = getattr(s, "value", None)
    if isinstance(value, str):
        return value.lower()
    return str(getattr(s, "name", s)).lower()


def _all_preset_names() -> list[str]:
    try:
        mod = _engine_module()
    except ImportError:
        return []
    return [_speaker_name(p) for p in mod.PresetSpeaker]


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
    "FrameEngine",
    "Qwen3Options",
    "Qwen3Synthesizer",
]
