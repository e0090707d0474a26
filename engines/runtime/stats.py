"""Counters and latency windows of the engine runtime (cmd ``STATS``).

Rule 1: numbers only; everything here is touched from the event loop thread.
Rule 2: this file does not know how they are printed beyond ``render_stats``.
"""

from __future__ import annotations

from collections import deque

from svc.stats import percentile

WINDOW = 1000  # latency samples kept per metric (the most recent ones)


class LatencyWindow:
    """The last ``WINDOW`` samples of one latency, in milliseconds."""

    __slots__ = ("count", "total_ms", "values")

    def __init__(self, size: int = WINDOW) -> None:
        self.values: deque[float] = deque(maxlen=size)
        self.count = 0
        self.total_ms = 0.0  # of every sample ever added (METRICS ``_sum``)

    def add(self, ms: float) -> None:
        self.values.append(ms)
        self.count += 1
        self.total_ms += ms

    def p(self, q: float) -> float:
        return float(percentile(self.values, q))


class RuntimeStats:
    """Engine-wide counters; names follow ``<noun>_<verb past>`` (STYLE.md 3)."""

    def __init__(self) -> None:
        self.calls_started = 0
        self.calls_ended = 0
        self.texts_received = 0
        self.texts_dropped = 0
        self.utterances_started = 0
        self.utterances_completed = 0
        self.utterances_cancelled = 0
        self.utterances_failed = 0
        self.utterances_truncated = 0
        self.packets_sent = 0
        self.packets_suppressed = 0  # produced but gated by a barge-in / CALL_END
        self.packets_unsent = 0  # produced while no dock link existed
        self.samples_sent = 0
        self.bargeins = 0
        self.docks = 0
        self.dock_losses = 0
        self.hello_rejections = 0
        self.frames_malformed = 0
        self.pings_answered = 0
        self.ttfa = LatencyWindow()  # text received -> first audio packet written
        self.bargein_mute = LatencyWindow()  # SPEECH_ACTIVE read -> call's audio gated
        self.bargein_stop = LatencyWindow()  # SPEECH_ACTIVE read -> synthesis thread ended
        self.queue_wait = LatencyWindow()  # text received -> synthesis started
        self.sched_wait = LatencyWindow()  # a unit of work ready -> a pool worker took it
        self.underruns = 0  # packets sent after the listener had run dry (playback.py)
        self.underrun_ms = 0.0  # total length of those gaps


def fmt_ms(x: float) -> str:
    return f"{x:.3f}"


def render_latency(name: str, w: LatencyWindow) -> list[str]:
    return [
        f"{name}_n={w.count}",
        f"{name}_p50_ms={fmt_ms(w.p(50))}",
        f"{name}_p99_ms={fmt_ms(w.p(99))}",
        f"{name}_max_ms={fmt_ms(max(w.values, default=0.0))}",
    ]
