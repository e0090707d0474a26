"""Audio post-processing and packet framing for engine output (docs/wire.md#audio-payload).

Rule 1: everything between "a synthesiser yielded a float32 chunk" and "these
bytes follow the 12-byte header" lives here: peak normalisation, the 48-sample
fade-in, the 120 s cap and the split into <= 4800-sample packets.
Rule 2: this file knows no sockets, threads or clocks; the caller stamps
``t_engine_out_us`` right before the write (``audio_payload``).

Streaming normalisation rule (the reference scales a whole utterance to a
0.90 peak when its peak is above 0.01 and not already within 0.001 of 0.90;
a stream cannot see the whole utterance, so):

1. The gain is *undecided* (unity) until the first chunk whose peak exceeds
   ``SILENCE_PEAK`` (0.01). That chunk decides it: ``0.90 / peak`` (1.0 when
   the peak is already within 0.001 of 0.90), capped at ``MAX_GAIN`` (4.0,
   +12 dB) so that a quiet onset (a breath, the first 80 ms of a streaming
   model) cannot be blown up 50-fold before the loud part arrives. For an
   utterance delivered as one chunk this is exactly the reference rule
   (unless its peak is below 0.225, where the cap applies).
2. After that the gain only ever goes down: when a later chunk would exceed
   the 0.90 peak at the current gain, the gain drops to ``0.90 / peak`` of
   that chunk. A gain change (including the first decision after unity
   chunks were already sent) is a linear ramp over ``GAIN_RAMP_SAMPLES``
   (2 ms), and every ramp sample is additionally limited to ``0.90 / |x|``,
   so no output sample ever exceeds 0.90 in magnitude: the stream never
   clips and the gain is stable within an utterance except for rare downward
   steps.
3. The fade-in multiplies sample ``i`` (counted from the utterance start,
   across chunks) by ``i / 48`` for ``i < 48``, after the gain.
4. At ``MAX_UTTERANCE_SAMPLES`` (120 s) the utterance is truncated
   (``truncated`` becomes true; the caller logs it and stops synthesis).

Offline commands (TEST_SYNTH, BENCHMARK, SYNTH_WAV) hold the whole
utterance and use ``normalize_whole``, the exact reference rule.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import numpy.typing as npt

from protocol.audio import AUDIO_SAMPLE_RATE, MAX_SAMPLES_PER_PACKET, encode_audio_header

FloatArray = npt.NDArray[np.float32]

TARGET_PEAK = 0.90  # docs/wire.md#audio-post-processing
PEAK_TOLERANCE = 0.001  # docs/wire.md#audio-post-processing: "not already 0.90 (+-0.001)"
SILENCE_PEAK = 0.01  # docs/wire.md#audio-post-processing: only scale when the peak is above this
MAX_GAIN = 4.0  # streaming only: bound on the gain a quiet first chunk can set
GAIN_RAMP_SAMPLES = 48  # 2 ms at 24 kHz
FADE_IN_SAMPLES = 48  # docs/wire.md#audio-post-processing
MAX_UTTERANCE_SECONDS = 120  # docs/wire.md#audio-post-processing
MAX_UTTERANCE_SAMPLES = MAX_UTTERANCE_SECONDS * AUDIO_SAMPLE_RATE
PACKET_SAMPLES = MAX_SAMPLES_PER_PACKET  # 4800: 200 ms

_FADE = (np.arange(FADE_IN_SAMPLES, dtype=np.float64) / FADE_IN_SAMPLES).astype(np.float32)


def as_mono_f32(chunk: object) -> FloatArray:
    """Coerce a synthesiser chunk to a contiguous 1-D float32 array; NaN/inf become 0."""
    a = np.asarray(chunk, dtype=np.float32).reshape(-1)
    if not np.all(np.isfinite(a)):
        a = np.nan_to_num(a, nan=0.0, posinf=0.0, neginf=0.0)
    return np.ascontiguousarray(a)


def reference_gain(peak: float) -> float:
    """The reference whole-utterance gain for ``peak`` (docs/wire.md#audio-post-processing)."""
    if peak > SILENCE_PEAK and abs(peak - TARGET_PEAK) > PEAK_TOLERANCE:
        return TARGET_PEAK / peak
    return 1.0


def fade_in(samples: FloatArray, start: int = 0) -> FloatArray:
    """Apply the 48-sample linear fade-in in place to ``samples`` that begin at utterance
    sample index ``start``; returns ``samples``."""
    if start < FADE_IN_SAMPLES and samples.size:
        n = min(FADE_IN_SAMPLES - start, samples.size)
        samples[:n] *= _FADE[start : start + n]
    return samples


def normalize_whole(samples: FloatArray) -> FloatArray:
    """Reference post-processing of a complete utterance: peak normalisation, fade-in,
    120 s cap. Returns a new array."""
    a = as_mono_f32(samples)[:MAX_UTTERANCE_SAMPLES].copy()
    if a.size:
        peak = float(np.max(np.abs(a)))
        g = reference_gain(peak)
        if g != 1.0:
            a *= np.float32(g)
    return fade_in(a)


class UtteranceFramer:
    """Streaming post-processing of one utterance; ``process(chunk)`` yields packet PCM.

    Each yielded ``bytes`` is at most 4800 float32 LE samples, ready to follow
    the 12-byte audio header. Not thread-safe; one instance per utterance.
    """

    __slots__ = ("gain", "gain_changes", "max_samples", "samples_out", "truncated")

    def __init__(self, max_samples: int = MAX_UTTERANCE_SAMPLES) -> None:
        self.gain: float | None = None  # None: undecided (unity so far)
        self.samples_out = 0
        self.truncated = False
        self.gain_changes = 0
        self.max_samples = max_samples

    @property
    def current_gain(self) -> float:
        return 1.0 if self.gain is None else self.gain

    def process(self, chunk: object) -> Iterator[bytes]:
        a = self.shape(chunk)
        for i in range(0, a.size, PACKET_SAMPLES):
            yield a[i : i + PACKET_SAMPLES].tobytes()

    def shape(self, chunk: object) -> FloatArray:
        """Gain, fade-in and cap for one chunk; returns the processed samples."""
        if self.truncated:
            return np.zeros(0, dtype=np.float32)
        a = as_mono_f32(chunk).copy()
        room = self.max_samples - self.samples_out
        if a.size > room:
            a = a[:room]
            self.truncated = True
        if not a.size:
            return a
        peak = float(np.max(np.abs(a)))
        old = self.current_gain
        new = old
        if self.gain is None:
            if peak > SILENCE_PEAK:
                new = min(reference_gain(peak), MAX_GAIN)
                self.gain = new
        elif peak * old > TARGET_PEAK:
            new = TARGET_PEAK / peak
            self.gain = new
        if new != old and self.samples_out > 0:
            self.gain_changes += 1
            self._ramp(a, old, new)
        elif new != 1.0:
            a *= np.float32(new)
        # float32 rounding of gain * sample may land a hair above the target; never let it
        np.clip(a, -TARGET_PEAK, TARGET_PEAK, out=a)
        fade_in(a, self.samples_out)
        self.samples_out += a.size
        return a

    @staticmethod
    def _ramp(a: FloatArray, old: float, new: float) -> None:
        n = min(GAIN_RAMP_SAMPLES, a.size)
        g = np.full(a.size, new, dtype=np.float64)
        g[:n] = old + (new - old) * (np.arange(1, n + 1, dtype=np.float64) / n)
        mag = np.abs(a[:n]).astype(np.float64)
        with np.errstate(divide="ignore"):
            limit = np.where(mag > 0, TARGET_PEAK / np.maximum(mag, 1e-30), np.inf)
        g[:n] = np.minimum(g[:n], limit)
        a *= g.astype(np.float32)


def audio_payload(pcm: bytes, t_engine_out_us: int) -> bytes:
    """The audio Packet payload: 12-byte header (docs/wire.md#audio-payload) + PCM."""
    return encode_audio_header(t_engine_out_us) + pcm


def to_pcm16(samples: FloatArray) -> bytes:
    """float32 in [-1, 1] -> 16-bit little-endian PCM (clipped, rounded)."""
    a = np.clip(as_mono_f32(samples), -1.0, 1.0) * 32767.0
    return np.rint(a).astype("<i2").tobytes()
