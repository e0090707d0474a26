"""Exported graphs judged against the official ``KModel`` forward, with the noise held equal.

Rule 1: the reference is always ``KModel.forward_with_tokens`` (the official
code, ``disable_complex=True``), never our own ``stages`` modules.
Rule 2: the random source is held equal, not switched off: the official
forward's one ``randn_like`` of the harmonic source's shape is answered with
noise drawn here, and the graph gets the same array through
``onnx_export.noise_as_input``. (``SineGen``'s random initial phases stay
random on the torch side: they never reach the audio, see ``stages``.)

The judge is a log-magnitude spectrogram distance: the RMS over time and
frequency of the dB difference of band magnitudes (1024-point Hann STFT, hop
256, 24 log-spaced bands, floored 50 dB below the reference's peak). Waveform
SNR is a poor judge: float32 torch and onnxruntime differ by only 19-30 dB SNR
on random weights. Random weights are also chaotic: float32 rounding in the
harmonic source (phases of ~1e4 rad) moves the audio by ~1 dB, and any real
change (another noise draw, weights off by 1 %) by 3-4 dB; so the tolerances
sit between (calibrated in tests/test_kokoro_convert_validation.py):
``FLOAT32_TOLERANCE_DB`` for the float32 graphs, ``INT8_TOLERANCE_DB`` for int8.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from engines.kokoro.convert.onnx_export import NOISE_INPUT

FLOAT32_TOLERANCE_DB = 2.0
INT8_TOLERANCE_DB = 4.5
N_FFT = 1024
HOP = 256
BANDS = 24
FLOOR_DB = -50.0
SAMPLES_PER_FRAME = 600

FloatArray = npt.NDArray[np.float32]


def band_magnitude(audio: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """RMS ``|STFT|`` (periodic Hann, ``N_FFT``/``HOP``) in ``BANDS`` log-spaced bands."""
    x = np.asarray(audio, dtype=np.float64).reshape(-1)
    if len(x) < N_FFT:
        x = np.pad(x, (0, N_FFT - len(x)))
    frames = 1 + (len(x) - N_FFT) // HOP
    idx = np.arange(N_FFT)[None, :] + HOP * np.arange(frames)[:, None]
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(N_FFT) / N_FFT)
    mag = np.abs(np.fft.rfft(x[idx] * window, axis=1))
    edges = np.unique(np.geomspace(1, mag.shape[1], BANDS + 1).astype(int))
    bands = [np.sqrt(np.mean(mag[:, a:b] ** 2, axis=1)) for a, b in itertools.pairwise(edges)]
    out: npt.NDArray[np.float64] = np.stack(bands, axis=1)
    return out


def spectral_distance(reference: npt.ArrayLike, test: npt.ArrayLike) -> float:
    """RMS dB difference of the band spectrograms (``band_magnitude``); inf on another length."""
    ref = np.asarray(reference).reshape(-1)
    out = np.asarray(test).reshape(-1)
    if ref.shape != out.shape:
        return math.inf
    r, t = band_magnitude(ref), band_magnitude(out)
    floor = max(float(r.max()), 1e-12) * 10 ** (FLOOR_DB / 20)
    diff = 20 * np.log10((r + floor) / (t + floor))
    return float(np.sqrt(np.mean(diff**2)))


@dataclass(frozen=True)
class Reference:
    """One official forward: its inputs, the noise it was given, and its outputs."""

    tokens: npt.NDArray[np.int64]  # [1, T], pads included
    style: FloatArray  # [1, 256]
    speed: float
    noise: FloatArray  # [1, samples, harmonics]
    audio: FloatArray  # [samples]
    durations: npt.NDArray[np.int64]  # [T]


@contextlib.contextmanager
def held_noise(seed: int, box: list[Any], scale: float = 1.0) -> Iterator[None]:
    """Answer the harmonic source's ``randn_like`` with seeded noise (kept in ``box``).

    ``SineGen`` draws one ``randn_like`` of shape ``[1, samples, harmonics]``;
    ``SourceModuleHnNSF`` draws another of ``[1, samples, 1]`` that the
    generator discards (zeros here). Anything else is left alone. ``scale`` 0
    holds the noise at zero (the engine test runs graphs without noise).
    """
    import torch

    real = torch.randn_like
    rng = np.random.default_rng(seed)

    def fake(t: Any, *args: Any, **kwargs: Any) -> Any:
        if t.ndim == 3 and t.shape[0] == 1 and t.shape[2] > 1:
            draw = rng.standard_normal(tuple(t.shape)) * scale
            noise = torch.from_numpy(draw.astype(np.float32))
            box.append(noise.numpy())
            return noise
        if t.ndim == 3 and t.shape[2] == 1:
            return torch.zeros_like(t)
        return real(t, *args, **kwargs)

    torch.randn_like = fake  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.randn_like = real


def official_forward(
    kmodel: Any,
    tokens: Sequence[int],
    style: npt.ArrayLike,
    speed: float = 1.0,
    seed: int = 0,
    noise_scale: float = 1.0,
) -> Reference:
    """``KModel.forward_with_tokens`` on ``[0, *tokens, 0]`` with held noise."""
    import torch

    ids = np.array([[0, *tokens, 0]], dtype=np.int64)
    ref_s = np.asarray(style, dtype=np.float32).reshape(1, -1)
    box: list[Any] = []
    with held_noise(seed, box, noise_scale), torch.no_grad():
        audio, durations = kmodel.forward_with_tokens(
            torch.from_numpy(ids), torch.from_numpy(ref_s), speed
        )
    if len(box) != 1:
        raise RuntimeError(f"the official forward drew {len(box)} harmonic noise tensors, not 1")
    return Reference(
        tokens=ids,
        style=ref_s,
        speed=float(speed),
        noise=box[0],
        audio=audio.detach().numpy().astype(np.float32).reshape(-1),
        durations=durations.detach().numpy().astype(np.int64).reshape(-1),
    )


@dataclass(frozen=True)
class Judgement:
    """One graph on one reference."""

    durations_equal: bool
    distance_db: float

    def passes(self, tolerance_db: float) -> bool:
        return self.durations_equal and self.distance_db <= tolerance_db


def session(model: Any) -> Any:
    """An onnxruntime CPU session of a ``ModelProto``, bytes or path."""
    import onnxruntime as ort

    data = model.SerializeToString() if hasattr(model, "SerializeToString") else model
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])


def judge_whole(whole_with_noise: Any, ref: Reference) -> Judgement:
    """The whole graph (``noise_as_input`` applied) on ``ref``'s inputs and noise."""
    audio, durations = whole_with_noise.run(
        ["audio", "durations_out"],
        {
            "tokens": ref.tokens,
            "style": ref.style,
            "speed": np.array([ref.speed], np.float32),
            NOISE_INPUT: ref.noise,
        },
    )
    same = np.array_equal(np.asarray(durations).reshape(-1), ref.durations)
    return Judgement(same, spectral_distance(ref.audio, audio) if same else math.inf)


def judge_stages(prosody: Any, decoder_with_noise: Any, ref: Reference) -> Judgement:
    """Prosody, then one decode of all frames (``noise_as_input`` applied) on ``ref``."""
    features, f0, _energy, phase, durations = prosody.run(
        None,
        {"tokens": ref.tokens, "style": ref.style, "speed": np.array([ref.speed], np.float32)},
    )
    same = np.array_equal(np.asarray(durations).reshape(-1), ref.durations)
    if not same:
        return Judgement(False, math.inf)
    (audio,) = decoder_with_noise.run(
        None,
        {
            "features": features,
            "f0": f0,
            "phase": phase,
            "style": ref.style,
            NOISE_INPUT: ref.noise,
        },
    )
    return Judgement(True, spectral_distance(ref.audio, audio))
