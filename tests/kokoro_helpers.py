"""Shared fixtures for the Kokoro tests: the real model, assembled once per session."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest

from engines.kokoro.audio import Joiner
from engines.kokoro.backend import OnnxBackend, Prosody
from engines.kokoro.models import assemble_default_model
from engines.kokoro.synth import KokoroConfig, KokoroSynthesizer
from engines.kokoro.windows import (
    CROSSFADE_SAMPLES,
    FRAME_SAMPLES,
    WindowPlanner,
    boundary_frames,
    window_piece,
)
from engines.runtime.playback import PlaybackMeter, play_as_produced
from engines.runtime.synth import SAMPLE_RATE, CallState, CancelToken, FloatArray

#: How long a test waits for the voices' statistics (measured once per models directory in
#: the background): a bound against a hang, not a speed target. A slow machine (a 1-CPU
#: quota beside other work) took 30-50 s a voice, five voices: over the engine's default
NORMS_WAIT_S = 1800.0

EN_SENTENCE = "Hello, how can I help you today?"
DE_SENTENCE = "Guten Tag, wie kann ich Ihnen heute helfen?"


_SHARED: dict[str, Path] = {}


def shared_models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A models dir holding the assembled default model (assembled once per session).

    Test modules wrap this in their own fixture: ``tmp_path_factory`` lives for
    the whole session, and the result is cached here.
    """
    if "dir" not in _SHARED:
        mdir = tmp_path_factory.mktemp("kokoro-models")
        assemble_default_model(mdir)
        _SHARED["dir"] = mdir
    return _SHARED["dir"]


class SpyBackend(OnnxBackend):
    """The real ONNX backend, recording each prosody pass (or whole inference) and window."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.calls: list[tuple[int, ...]] = []  # tokens of each prosody pass / whole inference
        self.windows: list[tuple[int, int]] = []  # decoded frames [start, end) of each window

    def infer(
        self, tokens: Sequence[int], style: FloatArray, speed: float, cancel: CancelToken
    ) -> FloatArray:
        if not self.split:
            self.calls.append(tuple(tokens))
        return super().infer(tokens, style, speed, cancel)

    def prosody(
        self, tokens: Sequence[int], style: FloatArray, speed: float, cancel: CancelToken
    ) -> Prosody:
        self.calls.append(tuple(tokens))
        return super().prosody(tokens, style, speed, cancel)

    def decode(
        self,
        prosody: Prosody,
        start: int,
        end: int,
        style: FloatArray,
        cancel: CancelToken,
        ahead: int = 0,
    ) -> FloatArray:
        self.windows.append((start, end))
        return super().decode(prosody, start, end, style, cancel, ahead)

    def clear(self) -> None:
        self.calls.clear()
        self.windows.clear()


def loaded_synth(models_dir: Path) -> Iterator[KokoroSynthesizer]:
    """A loaded synthesizer with a recording backend (wrap in a module-scoped fixture)."""
    from engines.kokoro.models import KOKORO_INT8_NAME

    model = models_dir / "kokoro" / KOKORO_INT8_NAME
    synth = KokoroSynthesizer(
        # windows paced as on a fast CPU, whatever this machine's speed
        KokoroConfig(models_dir=models_dir, prompt_cache_mb=16, assume_rtf=0.3),
        backend=SpyBackend(model, threads=2),
    )
    synth.load()
    assert synth.wait_for_voice_norms(NORMS_WAIT_S), "the voices' statistics are measured"
    spy(synth).clear()  # the measurement's own prosody passes
    yield synth
    synth.close()


def spy(synth: KokoroSynthesizer) -> SpyBackend:
    backend = synth._backend
    assert isinstance(backend, SpyBackend)
    return backend


def speak(
    synth: KokoroSynthesizer,
    text: str,
    state: CallState | None = None,
    cancel: CancelToken | None = None,
) -> list[FloatArray]:
    """The utterance's chunks, for a listener that plays each as it is produced (the
    runtime's playback clock, as in an offline cmd-port synthesis)."""
    st = state or CallState(call_id=1)
    token = cancel or CancelToken()
    return list(play_as_produced(st, lambda: synth.synthesize(text, st, token)))


def speak_at(synth: KokoroSynthesizer, text: str, rtf: float, call_id: int = 1) -> list[FloatArray]:
    """The utterance's chunks, for a listener that starts at the first chunk, on a virtual
    clock that advances ``rtf`` x each chunk's duration as the chunk is produced: the
    window plan is that of a machine decoding at ``rtf``, whatever this machine's speed
    (with ``assume_rtf`` pinning the engine's own estimate, the result is deterministic)."""
    state = CallState(call_id=call_id)
    now = [0.0]
    meter = PlaybackMeter(lambda: now[0])
    state.playback = meter
    out: list[FloatArray] = []
    for chunk in synth.synthesize(text, state, CancelToken()):
        now[0] += rtf * len(chunk) / SAMPLE_RATE
        meter.sent(len(chunk), now[0])
        out.append(chunk)
    return out


def rms(audio: FloatArray) -> float:
    return float(np.sqrt(np.mean(np.square(audio, dtype=np.float64)))) if len(audio) else 0.0


def assert_seamless_windows(
    synth: KokoroSynthesizer, backend: OnnxBackend, tokens: Sequence[int], style: FloatArray
) -> int:
    """Decode one sentence window by window as the engine does; check every join.

    At every join the step between samples stays within the windows' own 99th
    percentile, and the crossfade never makes a steeper slope than either
    window had. Returns the number of joins (at least two).
    """
    cancel = CancelToken()
    prosody = backend.prosody(tokens, style, 1.0, cancel)
    planner = WindowPlanner(
        prosody.n_frames,
        prosody.frame_energy(),
        boundary_frames(prosody.durations, tokens, synth._boundary_ids),
        lead_frames=int(prosody.durations[0]),
    )
    joiner = Joiner(CROSSFADE_SAMPLES, equal_gain=True)
    pieces = []
    out = []
    budgets = iter([40, 60, 80, 120, 200, 200, 200])
    budget: int | None = None
    while (w := planner.next(budget)) is not None:
        piece = window_piece(
            backend.decode(prosody, w.ctx_start, w.ctx_end, style, cancel), w, CROSSFADE_SAMPLES
        )
        pieces.append((w, piece))
        out.append(joiner.push(piece))
        budget = next(budgets)
    out.append(joiner.finish())
    assert len(pieces) >= 3, "the test sentence must have at least two joins"
    y = np.concatenate(out)
    assert abs(len(y) - prosody.n_frames * FRAME_SAMPLES) <= 1
    inside = np.concatenate([np.abs(np.diff(p)) for _, p in pieces])
    p99 = float(np.percentile(inside, 99))
    half = CROSSFADE_SAMPLES // 2
    for (wa, pa), (_wb, pb) in itertools.pairwise(pieces):
        cut = wa.end * FRAME_SAMPLES
        assert abs(float(y[cut] - y[cut - 1])) <= p99
        region = np.abs(np.diff(y[cut - half : cut + half]))
        own_a = np.abs(np.diff(pa[len(pa) - 2 * half :]))
        own_b = np.abs(np.diff(pb[: 2 * half]))
        assert float(region.max()) <= max(float(own_a.max()), float(own_b.max())) * 1.05 + 1e-4
    return len(pieces) - 1
