"""Sample-level helpers: silence trimming and the equal-power crossfade joiner.

Rule 1: numpy only, no model, no clocks.
Rule 2: the joiner holds back exactly ``fade`` samples, so what it emits never
changes afterwards and the first phrase's audio leaves at once.
"""

from __future__ import annotations

import numpy as np

from engines.runtime.synth import FloatArray

# docs/wire.md#kokoro-front-end: joins use a 192-sample equal-power crossfade
CROSSFADE_SAMPLES = 192
FRAME = 240  # 10 ms at 24 kHz
SILENCE_DB = -42.0  # frames this far below the loudest frame count as silence
SILENCE_FLOOR = 1e-3  # absolute RMS under which a frame is silence


def speech_bounds(audio: FloatArray) -> tuple[int, int] | None:
    """(first, last+1) sample of the span that is not silence; None if all is silence."""
    n = len(audio) // FRAME
    if n == 0:
        return (0, len(audio)) if len(audio) and float(np.max(np.abs(audio))) > 0 else None
    frames = audio[: n * FRAME].reshape(n, FRAME).astype(np.float64)
    rms = np.sqrt(np.mean(frames * frames, axis=1))
    top = float(rms.max())
    threshold = max(top * 10 ** (SILENCE_DB / 20), SILENCE_FLOOR)
    loud = np.nonzero(rms > threshold)[0]
    if loud.size == 0:
        return None
    end = len(audio) if loud[-1] == n - 1 else int(loud[-1] + 1) * FRAME
    return int(loud[0]) * FRAME, end


def trim(audio: FloatArray, lead: int, tail: int) -> FloatArray:
    """Keep at most ``lead`` samples before and ``tail`` samples after the speech span."""
    bounds = speech_bounds(audio)
    if bounds is None:
        return audio[:0]
    start, end = bounds
    return audio[max(0, start - lead) : min(len(audio), end + tail)]


def trim_lead(audio: FloatArray, lead: int) -> FloatArray:
    """Keep at most ``lead`` samples before the speech span (nothing if all is silence)."""
    bounds = speech_bounds(audio)
    if bounds is None:
        return audio[:0]
    return audio[max(0, bounds[0] - lead) :]


def fit_tail(audio: FloatArray, tail: int, fade: int = FRAME) -> FloatArray:
    """Exactly ``tail`` samples after the speech span: trimmed as ``trim_tail``, or, when
    ``audio`` ends sooner (its silence was not rendered), faded out over its last
    ``fade`` samples and padded with zeros (nothing if all is silence)."""
    bounds = speech_bounds(audio)
    if bounds is None:
        return audio[:0]
    end = bounds[1]
    if len(audio) >= end + tail:
        return audio[: end + tail]
    out = np.zeros(end + tail, dtype=np.float32)
    out[: len(audio)] = audio
    k = min(fade, len(audio) - end)
    if k > 0:
        out[len(audio) - k : len(audio)] *= np.linspace(1.0, 0.0, k, dtype=np.float32)
    return out


def trim_tail(audio: FloatArray, tail: int) -> FloatArray:
    """Keep at most ``tail`` samples after the speech span (nothing if all is silence)."""
    bounds = speech_bounds(audio)
    if bounds is None:
        return audio[:0]
    return audio[: min(len(audio), bounds[1] + tail)]


def equal_power(n: int) -> tuple[FloatArray, FloatArray]:
    t = (np.arange(n, dtype=np.float32) + 0.5) / max(n, 1)
    return np.cos(t * np.pi / 2).astype(np.float32), np.sin(t * np.pi / 2).astype(np.float32)


def equal_gain_curves(n: int) -> tuple[FloatArray, FloatArray]:
    """Fades that sum to 1: for joining two renderings of the same audio (correlated)."""
    fo, fi = equal_power(n)
    return (fo * fo).astype(np.float32), (fi * fi).astype(np.float32)


class Joiner:
    """Joins pieces of audio with a crossfade while streaming.

    Equal-power (default) for pieces that were rendered separately (phrases,
    sentence units: uncorrelated at the join); ``equal_gain`` for decoder
    windows, whose overlap renders the same frames twice (correlated: an
    equal-power fade would add up to +3 dB in the middle of the join).
    """

    def __init__(self, fade: int = CROSSFADE_SAMPLES, *, equal_gain: bool = False) -> None:
        self.fade = fade
        self.curves = equal_gain_curves if equal_gain else equal_power
        self.tail: FloatArray | None = None

    def push(self, audio: FloatArray) -> FloatArray:
        """Add the next phrase; return the samples that are final now."""
        audio = np.asarray(audio, dtype=np.float32)
        if self.tail is None:
            ready = audio
        else:
            held = self.tail
            n = min(len(held), len(audio))
            fo, fi = self.curves(n)
            cross = held[len(held) - n :] * fo + audio[:n] * fi
            ready = np.concatenate([held[: len(held) - n], cross, audio[n:]])
        keep = min(self.fade, len(ready))
        self.tail = ready[len(ready) - keep :].copy()
        return ready[: len(ready) - keep]

    def finish(self) -> FloatArray:
        """The held-back tail, faded out so the utterance ends without a click."""
        if self.tail is None or len(self.tail) == 0:
            return np.zeros(0, np.float32)
        fo, _ = equal_power(len(self.tail))
        out = self.tail * fo
        self.tail = None
        return out.astype(np.float32)
