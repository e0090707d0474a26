"""Real-time playback arithmetic of one utterance: queued-ahead audio and underruns.

Rule 1: everything about "where would a real-time listener be now" lives here: the
listener's clock, the audio produced and sent, and the underruns (gaps) it would hear.
Rule 2: this file does no I/O and reads no clock of its own: every method takes
``now`` (seconds, one monotonic clock) except ``ahead_s()``, the ``PlaybackClock``
view, which asks the clock it was built with.

The model. The listener starts the utterance when its first packet is sent, or when
the call's previous utterance has played out if that is later (``not_before``), and
plays at exactly real time. When the listener was still playing the call's previous
utterance (``not_before`` > 0) and the first packet comes after that ran out, the
wait is an underrun too (a gap between two sentences of one answer). A packet sent
at ``now`` is late when the listener has already played everything sent before it
(``now > start + sent_s``): the gap ``now - (start + sent_s)`` is an underrun
(counted when over ``UNDERRUN_MIN_S``), and the listener's clock shifts by the gap
(it resumes with that packet). So ``start + sent_s`` is always the time the listener
runs dry of what it has.

Thread-safety: ``produced`` may be called from a synthesis thread, ``sent`` from
the event loop, ``ahead_s`` from anywhere; one lock guards the few floats.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator

import numpy as np

from engines.runtime.synth import SAMPLE_RATE, CallState

#: Gaps at or below this are jitter, not an audible underrun (still shift the clock).
UNDERRUN_MIN_S = 0.002


class PlaybackMeter:
    """One utterance's playback clock (implements ``synth.PlaybackClock``)."""

    __slots__ = (
        "_lock",
        "clock",
        "gap_s_predicted",
        "gaps_predicted",
        "not_before",
        "produced_s",
        "sent_s",
        "start",
        "underrun_s",
        "underruns",
    )

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, not_before: float = 0.0
    ) -> None:
        self.clock = clock
        #: the call's previous utterance plays until then (0.0: the listener is idle)
        self.not_before = not_before
        self.start: float | None = None  # listener's start (shifted by every gap)
        self.produced_s = 0.0  # audio handed over by the synthesiser
        self.sent_s = 0.0  # audio written to the socket
        self.underruns = 0
        self.underrun_s = 0.0
        self.gaps_predicted = 0  # the synthesiser's forecast (``predict``)
        self.gap_s_predicted = 0.0
        self._lock = threading.Lock()

    @property
    def started(self) -> bool:
        return self.start is not None

    def produced(self, samples: int) -> None:
        """``samples`` more audio left the synthesiser (not necessarily sent yet)."""
        with self._lock:
            self.produced_s += samples / SAMPLE_RATE

    def sent(self, samples: int, now: float) -> float:
        """A packet of ``samples`` was written at ``now``; returns its gap in s (0: on time).

        A packet that was never reported through ``produced`` counts as produced now.
        """
        dur = samples / SAMPLE_RATE
        with self._lock:
            if self.start is None:
                self.start = max(now, self.not_before)
                gap = now - self.not_before if self.not_before > 0 else 0.0
            else:
                gap = now - (self.start + self.sent_s)
                if gap > 0:
                    self.start += gap
            if gap > UNDERRUN_MIN_S:
                self.underruns += 1
                self.underrun_s += gap
            self.sent_s += dur
            if self.produced_s < self.sent_s:
                self.produced_s = self.sent_s
            return gap if gap > UNDERRUN_MIN_S else 0.0

    def dry_at(self, now: float) -> float:
        """When the listener would run out of the audio produced so far (``now`` or
        ``not_before`` as the start while nothing has been sent yet)."""
        with self._lock:
            start = self.start if self.start is not None else max(now, self.not_before)
            return start + self.produced_s

    def sent_until(self) -> float:
        """When the listener runs dry of what was sent (0.0 before the first packet)."""
        with self._lock:
            return 0.0 if self.start is None else self.start + self.sent_s

    def ahead_at(self, now: float) -> float:
        """Audio produced but not yet played at ``now``, in s (negative: underrun): the
        time until the listener runs dry (it includes the rest of the call's previous
        utterance while the listener is still playing that one)."""
        return self.dry_at(now) - now

    def predict(self, gaps: int, gap_s: float) -> None:
        """The synthesiser forecasts ``gaps`` more underruns (``gap_s`` in all) for this
        utterance (logged beside the real ones; it changes nothing)."""
        with self._lock:
            self.gaps_predicted += max(0, gaps)
            self.gap_s_predicted += max(0.0, gap_s)

    def ahead_s(self) -> float:
        """``PlaybackClock``: ``ahead_at`` the clock's current time."""
        return self.ahead_at(self.clock())


def play_as_produced(
    state: CallState,
    chunks: Callable[[], Iterable[np.ndarray]],
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[np.ndarray]:
    """Run a synthesis for a listener that plays each chunk the moment it is produced (an
    offline synthesis: cmd-port TEST_SYNTH, SYNTH_WAV, BENCHMARK): ``state.playback`` is a
    ``PlaybackMeter`` for the duration, and ``chunks()`` (which starts the synthesis) is
    called once it is in place."""
    meter = PlaybackMeter(clock)
    state.playback = meter
    try:
        for chunk in chunks():
            meter.sent(int(np.asarray(chunk).size), clock())
            yield chunk
    finally:
        if state.playback is meter:
            state.playback = None
