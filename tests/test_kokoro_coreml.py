"""CoreML backend: what Linux can check (buckets, padding, alignment, HAR source)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from engines.kokoro import coreml
from engines.kokoro.coreml import (
    REFERENCE_BUCKETS,
    CoreMLBackend,
    align,
    choose_bucket,
    durations_to_frames,
    har_source,
    pad_last,
    split_frames,
    stft_har,
)
from engines.kokoro.models import ModelFileError


def test_reference_bucket_sizes() -> None:
    # the C++ service's CoreML buckets: ASR frames 72/120/240, F0 frames 144/240/480,
    # HAR 8641/14401/28801
    assert [(b.frames, b.f0_frames, b.har_frames) for b in REFERENCE_BUCKETS] == [
        (72, 144, 8641),
        (120, 240, 14401),
        (240, 480, 28801),
    ]


@pytest.mark.parametrize(
    ("frames", "name"), [(1, "3s"), (72, "3s"), (73, "5s"), (240, "10s"), (999, "10s")]
)
def test_choose_bucket(frames: int, name: str) -> None:
    assert choose_bucket(frames).name == name


def test_split_long_frames() -> None:
    assert split_frames(500) == [(0, 240), (240, 480), (480, 500)]
    with pytest.raises(ValueError):
        choose_bucket(0)


def test_pad_and_trim() -> None:
    x = np.ones((1, 3, 5))
    assert pad_last(x, 8).shape == (1, 3, 8) and pad_last(x, 8)[..., 5:].sum() == 0
    assert pad_last(x, 2).shape == (1, 3, 2)


def test_alignment_repeats_columns() -> None:
    feats = np.array([[1.0, 2.0, 3.0]])
    dur = durations_to_frames(np.array([0.2, 2.4, 1.6, 9.0]), 3)
    assert dur.tolist() == [1, 2, 2]
    assert align(feats, dur).tolist() == [[1, 2, 2, 3, 3]]
    with pytest.raises(ValueError):
        align(feats, np.array([1, 1]))


def test_har_source_is_a_tone_where_voiced() -> None:
    f0 = np.concatenate([np.full(80, 200.0), np.zeros(64)])  # 144 F0 frames = 1.8 s
    w = [1.0] + [0.0] * 8  # fundamental only
    src = har_source(f0, w, 0.0, rng=np.random.default_rng(0))
    assert src.shape == (144 * 300,)
    voiced = src[: 80 * 300]
    spec = np.abs(np.fft.rfft(voiced))
    peak_hz = np.argmax(spec) * 24000 / len(voiced)
    assert abs(peak_hz - 200) < 2
    # voiced: sine of amplitude 0.1 (std 0.0707); unvoiced: noise of std 0.1 / 3 (SineGen)
    assert abs(np.std(voiced) - 0.1 / np.sqrt(2)) < 0.005
    unvoiced = src[80 * 300 :]
    assert abs(np.std(unvoiced) - 0.1 / 3) < 0.003
    uspec = np.abs(np.fft.rfft(unvoiced))
    assert uspec[200 * len(unvoiced) // 24000] < 5 * np.median(uspec)
    with pytest.raises(ValueError):
        har_source(f0, [1.0], 0.0)


def test_stft_har_matches_numpy_reference_and_bucket() -> None:
    src = np.sin(np.arange(43200) / 10.0).astype(np.float32)
    har = stft_har(src)
    assert har.shape == (22, REFERENCE_BUCKETS[0].har_frames)
    # frame 10 by hand: reflect-padded, periodic Hann, rfft
    x = np.pad(src.astype(np.float64), (10, 10), mode="reflect")[50:70]
    win = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(20) / 20)
    ref = np.fft.rfft(x * win)
    np.testing.assert_allclose(har[:11, 10], np.abs(ref), rtol=1e-4, atol=1e-5)


def test_backend_import_safe_and_clear_errors(tmp_path: Path) -> None:
    backend = CoreMLBackend(tmp_path)
    if sys.platform != "darwin":
        with pytest.raises(ModelFileError, match="macOS"):
            backend.load()
    with pytest.raises(ModelFileError, match="duration model"):
        coreml.SplitLayout.find(tmp_path)


def test_split_layout_found(tmp_path: Path) -> None:
    (tmp_path / "coreml" / "kokoro_duration.mlpackage").mkdir(parents=True)
    dv = tmp_path / "decoder_variants"
    dv.mkdir()
    for b in REFERENCE_BUCKETS:
        (dv / f"kokoro_decoder_split_{b.name}.mlmodelc").mkdir()
        (dv / f"kokoro_f0n_{b.name}.mlpackage").mkdir()
    (dv / "split_config.json").write_text('{"har": {"weight": [0,0,0,0,0,0,0,0,1], "bias": 0}}')
    layout = coreml.SplitLayout.find(tmp_path)
    assert layout.buckets == REFERENCE_BUCKETS
    assert layout.decoders["5s"].suffix == ".mlmodelc"
