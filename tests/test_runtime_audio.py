"""Audio framing of engine output: golden bytes, fade-in, streaming normalisation rule."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engines.runtime.audio import (
    FADE_IN_SAMPLES,
    GAIN_RAMP_SAMPLES,
    MAX_GAIN,
    MAX_UTTERANCE_SAMPLES,
    PACKET_SAMPLES,
    TARGET_PEAK,
    UtteranceFramer,
    audio_payload,
    fade_in,
    normalize_whole,
    reference_gain,
    to_pcm16,
)


def run(framer: UtteranceFramer, chunks: list[np.ndarray]) -> tuple[list[bytes], np.ndarray]:
    packets = [p for c in chunks for p in framer.process(c)]
    out = np.frombuffer(b"".join(packets), dtype="<f4")
    return packets, out


def test_audio_header_golden_bytes() -> None:
    pcm = np.array([0.5, -1.0], dtype="<f4").tobytes()
    payload = audio_payload(pcm, 0x0102030405060708)
    # 24000 = 0x00005DC0 little-endian, then the u64 timestamp big-endian, then f32 LE PCM
    assert payload == (
        b"\xc0\x5d\x00\x00"
        + b"\x01\x02\x03\x04\x05\x06\x07\x08"
        + b"\x00\x00\x00\x3f\x00\x00\x80\xbf"
    )


def test_pcm16_golden() -> None:
    assert to_pcm16(np.array([0.0, 1.0, -1.0, 2.0, 0.5], dtype=np.float32)) == (
        b"\x00\x00\xff\x7f\x01\x80\xff\x7f\x00\x40"
    )


def test_fade_in_is_linear_over_48_samples_across_chunks() -> None:
    f = UtteranceFramer()
    _, out = run(f, [np.full(30, 0.9, np.float32), np.full(100, 0.9, np.float32)])
    want = np.full(130, 0.9, np.float32)
    want[:48] *= np.arange(48, dtype=np.float32) / 48
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-6)
    assert out[0] == 0.0 and out[48] == pytest.approx(0.9)


def test_single_chunk_matches_reference_rule() -> None:
    x = (0.5 * np.sin(np.linspace(0, 40, 7000))).astype(np.float32)
    _, out = run(UtteranceFramer(), [x])
    np.testing.assert_allclose(out, normalize_whole(x), atol=1e-6)
    assert float(np.max(np.abs(out))) == pytest.approx(TARGET_PEAK, abs=1e-6)


@pytest.mark.parametrize(
    ("peak", "gain"),
    [(0.5, 0.9 / 0.5), (0.9005, 1.0), (0.8995, 1.0), (0.0099, 1.0), (0.01, 1.0), (2.0, 0.45)],
)
def test_reference_gain(peak: float, gain: float) -> None:
    assert reference_gain(peak) == pytest.approx(gain)


def test_quiet_utterance_left_alone() -> None:
    x = np.full(500, 0.008, np.float32)
    _, out = run(UtteranceFramer(), [x])
    np.testing.assert_allclose(out[48:], x[48:])


def test_gain_only_decreases_and_never_clips() -> None:
    f = UtteranceFramer()
    a = np.full(2000, 0.3, np.float32)  # decides gain 3.0
    b = np.full(2000, 0.6, np.float32)  # would clip at 3.0: drops to 1.5 with a ramp
    c = np.full(2000, 0.1, np.float32)  # quieter: gain stays 1.5 (never rises)
    _, out = run(f, [a, b, c])
    assert f.gain == pytest.approx(1.5)
    assert float(np.max(np.abs(out))) <= TARGET_PEAK
    np.testing.assert_allclose(out[100:2000], 0.9, atol=1e-6)
    np.testing.assert_allclose(out[2000 + GAIN_RAMP_SAMPLES : 4000], 0.9, atol=1e-6)
    np.testing.assert_allclose(out[4000:], 0.15, atol=1e-6)
    assert f.gain_changes == 1


def test_quiet_onset_gain_capped_then_ramped() -> None:
    f = UtteranceFramer()
    onset = np.full(1000, 0.02, np.float32)  # reference gain 45: capped at MAX_GAIN
    _, out = run(f, [onset])
    assert f.gain == MAX_GAIN
    np.testing.assert_allclose(out[48:], 0.02 * MAX_GAIN, atol=1e-6)
    _, out2 = run(f, [np.full(1000, 0.5, np.float32)])
    assert float(np.max(np.abs(out2))) <= TARGET_PEAK
    np.testing.assert_allclose(out2[GAIN_RAMP_SAMPLES:], 0.9, atol=1e-6)


def test_undecided_gain_ramps_up_after_silence() -> None:
    f = UtteranceFramer()
    _, _head = run(f, [np.full(100, 0.005, np.float32)])
    assert f.gain is None
    _, out = run(f, [np.full(200, 0.45, np.float32)])
    assert f.gain == pytest.approx(2.0)
    assert out[0] < 0.9 and np.all(np.diff(out[:GAIN_RAMP_SAMPLES]) >= 0)
    np.testing.assert_allclose(out[GAIN_RAMP_SAMPLES:], 0.9, atol=1e-6)


def test_packets_at_most_4800_samples() -> None:
    packets, out = run(UtteranceFramer(), [np.full(12000, 0.2, np.float32)])
    assert [len(p) // 4 for p in packets] == [4800, 4800, 2400]
    assert PACKET_SAMPLES == 4800 and out.size == 12000


def test_cap_truncates_at_120_s() -> None:
    f = UtteranceFramer()
    chunk = np.full(24000 * 50, 0.3, np.float32)
    total = sum(len(p) // 4 for _ in range(3) for p in f.process(chunk))
    assert total == MAX_UTTERANCE_SAMPLES == 120 * 24000
    assert f.truncated
    assert list(f.process(chunk)) == []


def test_nan_and_inf_become_silence() -> None:
    _, out = run(UtteranceFramer(), [np.array([np.nan, np.inf, -np.inf] + [0.5] * 60, np.float32)])
    assert np.all(np.isfinite(out)) and out[0] == 0.0


def test_fade_in_helper_offsets() -> None:
    x = np.ones(10, np.float32)
    fade_in(x, start=FADE_IN_SAMPLES - 5)
    np.testing.assert_allclose(x[:5], np.arange(43, 48) / 48)
    assert np.all(x[5:] == 1.0)


@given(
    st.lists(
        st.tuples(st.integers(0, 6000), st.floats(0.0, 3.0, allow_subnormal=False)),
        min_size=1,
        max_size=8,
    ),
    st.integers(0, 2**32 - 1),
)
def test_stream_property_never_clips_gain_monotone(
    spec: list[tuple[int, float]], seed: int
) -> None:
    rng = np.random.default_rng(seed)
    f = UtteranceFramer()
    gains: list[float] = []
    n_in = 0
    for n, amp in spec:
        chunk = (rng.uniform(-1, 1, n) * amp).astype(np.float32)
        n_in += n
        for p in f.process(chunk):
            assert 0 < len(p) // 4 <= 4800 and len(p) % 4 == 0
            assert float(np.max(np.abs(np.frombuffer(p, "<f4")))) <= TARGET_PEAK
        if f.gain is not None:
            gains.append(f.gain)
    assert f.samples_out == n_in
    assert all(b <= a for a, b in itertools.pairwise(gains))
    assert all(g <= MAX_GAIN for g in gains)
