"""Counters and hop latency of the dock, rendered for the cmd port.

Rule 1: everything the STATS and METRICS commands report lives here, as plain
integer attributes (the hot path only increments them) plus a bounded ring of
hop-latency samples. Percentiles come from the ring (the most recent samples);
the count and sum of every hop ever measured are kept apart, cumulative, since
Prometheus requires a summary's ``_sum`` and ``_count`` never to go down.
Rule 2: this file reads no clock and knows no sockets.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field

from svc.metrics import LATENCY_QUANTILES, Family, counter, gauge, labelled, latency_summary, render
from svc.stats import percentile

RESERVOIR = 8192  # most recent hop samples kept for percentiles (bounded)
PERCENTILES = LATENCY_QUANTILES  # STATS hop_p<N>_us, like METRICS' quantiles


@dataclass(slots=True)
class Stats:
    text_frames_in: int = 0  # LLaMA -> dock data packets
    text_bytes_in: int = 0
    text_frames_to_engine: int = 0
    text_bytes_to_engine: int = 0
    mgmt_frames_in: int = 0  # LLaMA -> dock mgmt frames
    mgmt_frames_to_oap: int = 0
    mgmt_frames_to_engine: int = 0
    audio_frames_in: int = 0  # engine -> dock audio packets
    audio_bytes_in: int = 0
    audio_frames_out: int = 0  # dock -> OAP audio packets (handed to OAP's transport)
    audio_bytes_out: int = 0  # payload bytes, the same measure as audio_bytes_in
    audio_oversize: int = 0  # audio packets over 4800 samples (forwarded, as the reference)
    engine_read_pauses: int = 0  # times the active engine's reading was paused (back-pressure)
    text_held: int = 0
    text_delivered_from_hold: int = 0
    swaps: int = 0
    engines_docked: int = 0
    engines_rejected: int = 0
    keepalive_timeouts: int = 0
    flushes_sent: int = 0
    flushes_answered: int = 0
    flushes_unanswered: int = 0
    oap_reconnects: int = 0
    llama_connects: int = 0
    calls_ended: int = 0
    drops: Counter[str] = field(default_factory=Counter)
    hop_us: deque[int] = field(default_factory=lambda: deque(maxlen=RESERVOIR))
    hop_count: int = 0  # every hop ever measured (cumulative)
    hop_sum_us: int = 0  # their total (cumulative)
    hop_max_us: int = 0

    def add_hop(self, us: int) -> None:
        self.hop_us.append(us)
        self.hop_count += 1
        self.hop_sum_us += us
        if us > self.hop_max_us:
            self.hop_max_us = us

    def hop_summary(self) -> dict[str, int]:
        values = sorted(self.hop_us)
        out = {f"hop_p{p}_us": percentile(values, p, presorted=True) for p in PERCENTILES}
        out["hop_max_us"] = self.hop_max_us
        out["hop_samples"] = self.hop_count
        return out

    def as_dict(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for name in self.__slots__:
            value = getattr(self, name)
            if isinstance(value, int):
                out[name] = value
        out["drops_total"] = sum(self.drops.values())
        for reason, n in sorted(self.drops.items()):
            out[f"drop_{reason}"] = n
        out.update(self.hop_summary())
        return out

    def line(self, extra: dict[str, int | str] | None = None) -> str:
        """STATS reply: one line of ``key=value`` pairs."""
        items: dict[str, int | str] = dict(extra or {})
        items.update(self.as_dict())
        return " ".join(f"{k}={v}" for k, v in items.items())

    def prometheus(self, gauges: dict[str, int]) -> str:
        """METRICS reply: Prometheus text exposition format (multi-line, ends with a newline)."""
        return render(self.families(gauges))

    def families(self, gauges: dict[str, int]) -> list[Family]:
        """The dock's metric families (``svc.metrics``): cmd ``METRICS`` and HTTP
        ``/metrics`` render these."""
        fams: list[Family] = []
        for name, value in self.as_dict().items():
            if name.startswith(("drop_", "hop_", "drops_total")):
                continue
            fams.append(counter(f"ttsdock_{name}_total", value))
        fams.append(labelled("ttsdock_frames_dropped_total", "counter", dict(self.drops), "reason"))
        fams.append(
            latency_summary(
                "ttsdock_hop_latency_seconds",
                self.hop_us,
                self.hop_sum_us,
                self.hop_count,
                per_second=1e6,
            )
        )
        for name, value in gauges.items():
            fams.append(gauge(f"ttsdock_{name}", value))
        return fams
