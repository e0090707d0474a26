"""Silence trimming, the crossfade joiner and the prompt-audio cache."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from engines.kokoro.audio import (
    CROSSFADE_SAMPLES,
    Joiner,
    equal_power,
    fit_tail,
    speech_bounds,
    trim,
    trim_tail,
)
from engines.kokoro.cache import AudioCache


def tone(seconds: float, amp: float = 0.3) -> np.ndarray:
    t = np.arange(int(seconds * 24000)) / 24000
    return (amp * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


def test_trim_keeps_margins() -> None:
    x = np.concatenate([np.zeros(12000, np.float32), tone(0.5), np.zeros(24000, np.float32)])
    start, end = speech_bounds(x)  # type: ignore[misc]
    assert abs(start - 12000) <= 240 and abs(end - 24000) <= 240
    y = trim(x, 480, 960)
    assert abs(len(y) - (12000 + 480 + 960)) <= 480
    assert len(trim(np.zeros(5000, np.float32), 10, 10)) == 0


def test_fit_tail_trims_a_long_silence_and_pads_a_short_one() -> None:
    speech = tone(0.5)
    long = np.concatenate([speech, np.full(24000, 1e-5, np.float32)])
    np.testing.assert_array_equal(fit_tail(long, 7200), trim_tail(long, 7200))
    short = np.concatenate([speech, np.full(1200, 1e-5, np.float32)])
    padded = fit_tail(short, 7200)
    end = speech_bounds(short)[1]  # type: ignore[index]
    assert len(padded) == end + 7200
    np.testing.assert_array_equal(padded[: len(short) - 240], short[: len(short) - 240])
    assert not padded[len(short) :].any(), "silence, not rendered audio, after the decode"
    fade = padded[len(short) - 240 : len(short)] / short[len(short) - 240 :]
    assert fade[0] == 1.0 and fade[-1] == 0.0 and (np.diff(fade) <= 0).all()
    assert len(fit_tail(np.zeros(5000, np.float32), 100)) == 0


def test_equal_power_sums_to_one() -> None:
    fo, fi = equal_power(CROSSFADE_SAMPLES)
    np.testing.assert_allclose(fo**2 + fi**2, 1.0, rtol=1e-6)
    assert fo[0] > 0.99 and fi[-1] > 0.99


def test_joiner_crossfades_and_keeps_length() -> None:
    a, b = tone(0.2), tone(0.3, 0.1)
    j = Joiner()
    out1 = j.push(a)
    assert len(out1) == len(a) - CROSSFADE_SAMPLES  # everything but the held tail, at once
    out = np.concatenate([out1, j.push(b), j.finish()])
    assert len(out) == len(a) + len(b) - CROSSFADE_SAMPLES
    np.testing.assert_array_equal(out[: len(out1)], a[: len(out1)])
    # the join region mixes both signals
    mid = out[len(out1) : len(out1) + CROSSFADE_SAMPLES]
    fo, fi = equal_power(CROSSFADE_SAMPLES)
    np.testing.assert_allclose(
        mid, a[-CROSSFADE_SAMPLES:] * fo + b[:CROSSFADE_SAMPLES] * fi, atol=1e-6
    )


@given(st.lists(st.integers(0, 1000), min_size=1, max_size=8))
def test_joiner_handles_any_piece_lengths(lengths: list[int]) -> None:
    j = Joiner()
    total = 0
    emitted = 0
    for n in lengths:
        emitted += len(j.push(np.ones(n, np.float32)))
        total += n
    emitted += len(j.finish())
    overlaps = sum(min(CROSSFADE_SAMPLES, a, b) for a, b in itertools.pairwise(lengths))
    assert emitted <= total and emitted >= total - overlaps - CROSSFADE_SAMPLES * len(lengths)


def test_audio_cache_lru_bounded_in_bytes() -> None:
    c = AudioCache(max_bytes=3 * 2000)  # three entries of 1000 samples at 2 bytes each
    for k in "abc":
        c.put(k, np.zeros(1000, np.float32))
    assert c.get("a") is not None  # a is now most recent
    c.put("d", np.zeros(1000, np.float32))  # evicts b
    assert c.get("b") is None and c.get("c") is not None
    assert c.nbytes <= 6000 and len(c) == 3
    c.put("huge", np.zeros(10_000, np.float32))  # bigger than the bound: not stored
    assert c.get("huge") is None
    assert (c.hits, c.misses) == (2, 2)
    got = c.get("a")
    assert got is not None and not got.flags.writeable


@settings(max_examples=100, deadline=None)
@given(
    audio=hnp.arrays(
        np.float32,
        st.integers(1, 400),
        elements=st.floats(-4, 4, width=32, allow_subnormal=False),
    ),
    gain=st.sampled_from([1.0, 1e-3, 1e-6]),
)
def test_audio_cache_keeps_16_bits_relative_to_each_entrys_peak(
    audio: np.ndarray, gain: float
) -> None:
    x = (audio * np.float32(gain)).astype(np.float32)
    c = AudioCache(max_bytes=1 << 20)
    c.put("k", x)
    got = c.get("k")
    assert got is not None and got.dtype == np.float32 and got.shape == x.shape
    peak = float(np.max(np.abs(x)))
    assert np.max(np.abs(got - x)) <= peak / 32767 * 0.51 + 1e-12
    assert c.nbytes == 2 * len(x)
