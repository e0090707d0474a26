"""Our export modules (``convert.stages``) on the real Kokoro-82M architecture, in torch.

One real-shape check (random weights of hexgrad/Kokoro-82M's config, ~82M
parameters: PL-BERT, the predictor, the iSTFTNet decoder): the prosody and
decoder stages that ``kokoro-convert`` traces give the official forward's
durations and audio (noise held equal). The traced graphs themselves are
judged on the tiny config (tests/test_kokoro_convert_validation.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("kokoro")
torch = pytest.importorskip("torch")

import kokoro_convert_helpers as kch  # noqa: E402

from engines.kokoro.convert import validate as va  # noqa: E402
from engines.kokoro.convert.stages import DecoderStage, ProsodyStage  # noqa: E402


def stages_forward(model: Any, ref: va.Reference, seed: int) -> tuple[np.ndarray, np.ndarray]:
    box: list[Any] = []
    prosody, decoder = ProsodyStage(model).eval(), DecoderStage(model).eval()
    with va.held_noise(seed, box), torch.no_grad():
        tokens, style = torch.from_numpy(ref.tokens), torch.from_numpy(ref.style)
        features, f0, _energy, phase, durations = prosody(
            tokens, style, torch.tensor([ref.speed], dtype=torch.float32)
        )
        audio = decoder(features, f0, phase, style)
    return audio.numpy().reshape(-1), durations.numpy()


def test_the_real_architecture_through_our_stages_is_the_official_forward() -> None:
    config = kch.real_config()
    model = kch.random_kmodel(config, seed=4)
    n_params = sum(p.numel() for p in model.parameters())
    assert 81_000_000 < n_params < 83_000_000, n_params  # "Kokoro-82M"
    tokens = kch.probe_tokens(config["vocab"], 12, seed=4)
    style = (np.random.default_rng(4).standard_normal(256) * 0.15).astype(np.float32)
    ref = va.official_forward(model, tokens, style, 1.0, seed=4)
    audio, durations = stages_forward(model, ref, seed=4)
    np.testing.assert_array_equal(durations, ref.durations)
    distance = va.spectral_distance(ref.audio, audio)
    print(f"real shape: {n_params} parameters, {len(ref.audio)} samples, {distance:.4f} dB")
    assert distance <= va.FLOAT32_TOLERANCE_DB / 10


def test_the_cut_phase_ignores_sinegens_random_initial_phase() -> None:
    """``SineGen`` adds random initial phases at sample 0; the 1/300 linear resampling never
    reads sample 0, so two official forwards with different initial phases (and the same
    noise) give the same audio."""
    config = kch.tiny_config()
    model = kch.random_kmodel(config, seed=1)
    tokens = kch.probe_tokens(config["vocab"], 8, seed=1)
    style = np.zeros(256, np.float32)
    torch.manual_seed(10)
    a = va.official_forward(model, tokens, style, seed=2)
    torch.manual_seed(11)
    b = va.official_forward(model, tokens, style, seed=2)
    np.testing.assert_array_equal(a.audio, b.audio)
