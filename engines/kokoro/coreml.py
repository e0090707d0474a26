"""CoreML backend (macOS only): the split Kokoro pipeline of the WhisperTalk C++ Kokoro
service (duration model, HAR source, decoder buckets).

Rule 1: importing this module never needs coremltools (Linux CI imports it);
``CoreMLBackend.load`` imports coremltools and fails with a clear message.
Rule 2: the CPU parts of the pipeline (bucket choice, padding and trimming,
duration alignment, the harmonic (HAR) source) are plain numpy here, so
they are unit-tested on Linux.

Layout (``<models>/kokoro-<variant>/``, written by ``ttsdock kokoro-convert --coreml``)::

    coreml/kokoro_duration.mlpackage|.mlmodelc      tokens -> durations, d, t_en
    decoder_variants/kokoro_f0n_{3s,5s,10s}.mlpackage  aligned d, style -> F0, N
    decoder_variants/kokoro_decoder_split_{3s,5s,10s}.mlpackage|.mlmodelc
    decoder_variants/split_config.json               names, buckets, HAR weights
    vocab.json, <voice>_voice.bin

Flow: duration model (fixed 512 tokens + mask) -> durations on CPU ->
alignment (repeat each token column by its duration) -> F0/N model ->
HAR source from F0 (numpy, below) -> decoder bucket (the smallest that
holds the frames; zero-padded) -> waveform trimmed to the real length.

Untested: everything that calls CoreML (no macOS here). The C++ service's
``kokoro_har_*.pt`` TorchScript files are not used: the HAR maths is numpy.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from engines.kokoro.models import ModelFileError
from engines.runtime.synth import CancelToken, FloatArray, SynthesisError

SAMPLES_PER_FRAME = 600  # one duration frame at 24 kHz (the predictor's 40 Hz)
F0_PER_FRAME = 2  # F0/N are predicted at twice the frame rate
ISTFT_N_FFT = 20
ISTFT_HOP = 5
SAMPLE_RATE = 24000
DURATION_TOKENS = 512  # fixed input length of the duration model
HARMONICS = 8  # SineGen harmonic_num: fundamental + 8 overtones
SINE_AMP = 0.1
NOISE_STD = 0.003
VOICED_THRESHOLD = 10.0


@dataclass(frozen=True)
class Bucket:
    """One fixed-size decoder: ``frames`` duration frames (seed: 72 / 120 / 240)."""

    name: str
    frames: int

    @property
    def f0_frames(self) -> int:
        return self.frames * F0_PER_FRAME

    @property
    def samples(self) -> int:
        return self.frames * SAMPLES_PER_FRAME

    @property
    def har_frames(self) -> int:
        return self.samples // ISTFT_HOP + 1


REFERENCE_BUCKETS = (Bucket("3s", 72), Bucket("5s", 120), Bucket("10s", 240))


def choose_bucket(frames: int, buckets: Sequence[Bucket] = REFERENCE_BUCKETS) -> Bucket:
    """The smallest bucket that holds ``frames``; the largest if none does (split later)."""
    if frames <= 0:
        raise ValueError(f"frames must be positive, got {frames}")
    ordered = sorted(buckets, key=lambda b: b.frames)
    for b in ordered:
        if frames <= b.frames:
            return b
    return ordered[-1]


def split_frames(
    frames: int, buckets: Sequence[Bucket] = REFERENCE_BUCKETS
) -> list[tuple[int, int]]:
    """(start, end) frame windows, each fitting the largest bucket."""
    size = max(b.frames for b in buckets)
    return [(i, min(i + size, frames)) for i in range(0, frames, size)]


def pad_last(x: npt.NDArray[Any], length: int) -> npt.NDArray[Any]:
    """Zero-pad (or cut) the last axis of ``x`` to ``length``."""
    n = x.shape[-1]
    if n >= length:
        return x[..., :length]
    pad = [(0, 0)] * (x.ndim - 1) + [(0, length - n)]
    return np.pad(x, pad)


def durations_to_frames(pred_dur: npt.NDArray[Any], n_tokens: int) -> npt.NDArray[np.int64]:
    """Per-token frame counts of the first ``n_tokens`` (pads included), at least 1 each."""
    d = np.rint(np.asarray(pred_dur, dtype=np.float64).reshape(-1)[:n_tokens])
    return np.maximum(d, 1).astype(np.int64)


def align(features: npt.NDArray[Any], durations: npt.NDArray[np.int64]) -> npt.NDArray[Any]:
    """Repeat each token column of ``features`` ``[C, T]`` by its duration -> ``[C, sum(d)]``."""
    if features.shape[-1] != len(durations):
        raise ValueError(f"{features.shape[-1]} token columns but {len(durations)} durations")
    return np.repeat(features, durations, axis=-1)


def har_source(
    f0: npt.NDArray[Any],
    weight: Sequence[float],
    bias: float,
    *,
    rng: np.random.Generator | None = None,
    upsample: int = SAMPLES_PER_FRAME // F0_PER_FRAME,
) -> FloatArray:
    """The harmonic-plus-noise source of Kokoro's iSTFTNet (SineGen + l_linear + tanh).

    ``f0`` is per F0 frame (Hz); the result has ``len(f0) * upsample`` samples.
    Phase is accumulated at the sample rate (the torch code does the same
    cumulative sum on a down-sampled grid and interpolates back; the
    difference is a phase offset within one frame).
    """
    rng = rng or np.random.default_rng(0)
    f0_up = np.repeat(np.asarray(f0, dtype=np.float64).reshape(-1), upsample)
    n_harm = HARMONICS + 1
    if len(weight) != n_harm:
        raise ValueError(f"need {n_harm} merge weights, got {len(weight)}")
    fn = f0_up[:, None] * np.arange(1, n_harm + 1)[None, :]
    rad = np.mod(fn / SAMPLE_RATE, 1.0)
    initial = rng.random(n_harm)
    initial[0] = 0.0  # the fundamental starts at phase 0
    rad[0, :] += initial
    phase = 2 * np.pi * np.cumsum(rad, axis=0)
    sines = SINE_AMP * np.sin(phase)
    uv = (f0_up > VOICED_THRESHOLD).astype(np.float64)[:, None]
    noise_amp = uv * NOISE_STD + (1 - uv) * SINE_AMP / 3
    sines = sines * uv + noise_amp * rng.standard_normal(sines.shape)
    merged = np.tanh(sines @ np.asarray(weight, dtype=np.float64) + float(bias))
    return merged.astype(np.float32)


def stft_har(
    source: npt.NDArray[Any], n_fft: int = ISTFT_N_FFT, hop: int = ISTFT_HOP
) -> FloatArray:
    """``torch.stft(center=True, reflect, hann)`` magnitude and phase: ``[n_fft + 2, frames]``."""
    x = np.asarray(source, dtype=np.float64).reshape(-1)
    half = n_fft // 2
    x = np.pad(x, (half, half), mode="reflect")
    frames = 1 + (len(x) - n_fft) // hop
    idx = np.arange(n_fft)[None, :] + hop * np.arange(frames)[:, None]
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft)  # periodic Hann
    spec = np.fft.rfft(x[idx] * window, axis=1).T  # [n_fft//2+1, frames]
    return np.concatenate([np.abs(spec), np.angle(spec)], axis=0).astype(np.float32)


def find_model(base: Path, stem: str) -> Path | None:
    for suffix in (".mlmodelc", ".mlpackage"):
        p = base / f"{stem}{suffix}"
        if p.exists():
            return p
    return None


@dataclass
class SplitLayout:
    root: Path
    duration: Path
    decoders: dict[str, Path]
    f0n: dict[str, Path]
    config: dict[str, Any]
    buckets: tuple[Bucket, ...]

    @classmethod
    def find(cls, root: Path) -> SplitLayout:
        duration = find_model(root / "coreml", "kokoro_duration")
        if duration is None:
            raise ModelFileError(f"CoreML duration model missing under {root / 'coreml'}")
        dv = root / "decoder_variants"
        cfg_path = dv / "split_config.json"
        try:
            config: dict[str, Any] = json.loads(cfg_path.read_text("utf-8"))
        except (OSError, ValueError) as exc:
            raise ModelFileError(f"split config {cfg_path} unreadable: {exc}") from exc
        buckets = (
            tuple(Bucket(str(b["name"]), int(b["frames"])) for b in config.get("buckets", []))
            or REFERENCE_BUCKETS
        )
        decoders: dict[str, Path] = {}
        f0n: dict[str, Path] = {}
        for b in buckets:
            dec = find_model(dv, f"kokoro_decoder_split_{b.name}")
            fn = find_model(dv, f"kokoro_f0n_{b.name}")
            if dec is None or fn is None:
                raise ModelFileError(f"CoreML bucket {b.name} incomplete under {dv}")
            decoders[b.name], f0n[b.name] = dec, fn
        return cls(root, duration, decoders, f0n, config, buckets)


class CoreMLBackend:
    """The split pipeline on CoreML (ANE/GPU/CPU as CoreML decides). macOS only; untested here."""

    name = "coreml"

    def __init__(self, root: Path) -> None:
        self.root = root
        self.layout: SplitLayout | None = None
        self._models: dict[str, Any] = {}

    def load(self) -> None:
        if sys.platform != "darwin":
            raise ModelFileError("the CoreML backend runs on macOS only; use --backend onnx")
        try:
            import coremltools as ct
        except ImportError as exc:
            raise ModelFileError(
                "coremltools is not installed: pip install 'ttsdock[coreml]'"
            ) from exc
        self.layout = layout = SplitLayout.find(self.root)

        def load_one(path: Path) -> Any:
            if path.suffix == ".mlmodelc":
                return ct.models.CompiledMLModel(str(path))
            return ct.models.MLModel(str(path))

        self._models["duration"] = load_one(layout.duration)
        for name, path in layout.decoders.items():
            self._models[f"dec_{name}"] = load_one(path)
        for name, path in layout.f0n.items():
            self._models[f"f0n_{name}"] = load_one(path)

    def infer(
        self, tokens: Sequence[int], style: FloatArray, speed: float, cancel: CancelToken
    ) -> FloatArray:
        layout = self.layout
        if layout is None:
            raise SynthesisError("CoreML backend not loaded")
        ids = [0, *tokens, 0]
        if len(ids) > DURATION_TOKENS:
            raise SynthesisError(f"{len(tokens)} tokens exceed the duration model's 510")
        mask = np.zeros((1, DURATION_TOKENS), np.int32)
        mask[0, : len(ids)] = 1
        ref_s = np.asarray(style, np.float32).reshape(1, -1)
        out = self._models["duration"].predict(
            {
                "input_ids": pad_last(np.array([ids], np.int32), DURATION_TOKENS),
                "attention_mask": mask,
                "ref_s": ref_s,
                "speed": np.array([speed], np.float32),
            }
        )
        dur = durations_to_frames(out["pred_dur"], len(ids))
        en = align(np.asarray(out["d"])[0][:, : len(ids)], dur)  # [640, frames]
        asr = align(np.asarray(out["t_en"])[0][:, : len(ids)], dur)  # [512, frames]
        har_cfg = layout.config.get("har", {})
        weight = har_cfg.get("weight", [1.0 / (HARMONICS + 1)] * (HARMONICS + 1))
        bias = float(har_cfg.get("bias", 0.0))
        pieces: list[FloatArray] = []
        for start, end in split_frames(en.shape[-1], layout.buckets):
            cancel.raise_if_cancelled()
            n = end - start
            b = choose_bucket(n, layout.buckets)
            f0n = self._models[f"f0n_{b.name}"].predict(
                {
                    "en": pad_last(en[None, :, start:end], b.frames).astype(np.float32),
                    "s": ref_s[:, 128:],
                }
            )
            f0 = np.asarray(f0n["F0_pred"]).reshape(-1)
            har = stft_har(har_source(f0, weight, bias))[None, :, : b.har_frames]
            wav = self._models[f"dec_{b.name}"].predict(
                {
                    "asr": pad_last(asr[None, :, start:end], b.frames).astype(np.float32),
                    "F0_pred": f0[None, :].astype(np.float32),
                    "N_pred": np.asarray(f0n["N_pred"]).reshape(1, -1).astype(np.float32),
                    "ref_s": ref_s[:, :128],
                    "har": pad_last(har, b.har_frames).astype(np.float32),
                }
            )
            audio = np.asarray(wav["waveform"], np.float32).reshape(-1)
            pieces.append(audio[: n * SAMPLES_PER_FRAME])
        return np.concatenate(pieces) if pieces else np.zeros(0, np.float32)

    def close(self) -> None:
        self._models.clear()
