"""The engine's metric families (cmd ``METRICS`` and HTTP ``GET /metrics``).

Rule 1: this file turns the runtime's numbers (``RuntimeStats``, the calls, the
inference scheduler) into ``svc.metrics`` families; ``svc.metrics.render`` prints
them, the same renderer as the dock's.
Rule 2: it reads, never changes; everything here runs on the event loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from engines.runtime.stats import LatencyWindow, RuntimeStats
from engines.runtime.synth import SAMPLE_RATE, PlanInfo
from svc.metrics import Family, counter, gauge, latency_summary

if TYPE_CHECKING:
    from engines.runtime.calls import CallManager

PREFIX = "ttsdock_engine_"
CALLS_LISTED = 64  # calls with their own call_ahead_seconds sample

#: RuntimeStats counters exported as ``ttsdock_engine_<name>_total``.
METRIC_COUNTERS = (
    "calls_started",
    "calls_ended",
    "texts_received",
    "texts_dropped",
    "utterances_started",
    "utterances_completed",
    "utterances_cancelled",
    "utterances_failed",
    "utterances_truncated",
    "packets_sent",
    "packets_suppressed",
    "packets_unsent",
    "bargeins",
    "underruns",
)

#: More families from parts of the engine that are optional (the protocol servers).
MetricSource = Callable[[], list[Family]]


def window_summary(name: str, w: LatencyWindow) -> Family:
    """A latency window (milliseconds) as a summary in seconds: recent quantiles,
    cumulative sum and count (``svc.metrics.latency_summary``)."""
    return latency_summary(name, w.values, w.total_ms, w.count, per_second=1000)


def engine_families(
    stats: RuntimeStats, calls: CallManager, plan: PlanInfo | None = None
) -> list[Family]:
    st, p = stats, PREFIX
    # getattr: the counters are listed by name (``METRIC_COUNTERS``), not probed
    fams = [counter(f"{p}{name}_total", getattr(st, name)) for name in METRIC_COUNTERS]
    fams.append(counter(f"{p}underrun_seconds_total", round(st.underrun_ms / 1000, 6)))
    fams.append(counter(f"{p}audio_seconds_sent_total", round(st.samples_sent / SAMPLE_RATE, 6)))
    for name, window in (
        ("ttfa_seconds", st.ttfa),
        ("queue_wait_seconds", st.queue_wait),
        ("sched_wait_seconds", st.sched_wait),
        ("bargein_mute_seconds", st.bargein_mute),
    ):
        fams.append(window_summary(p + name, window))
    table = calls.snapshot(CALLS_LISTED)
    syn = calls.synthesis()
    gauges: dict[str, float] = {
        "calls_active": table.active,
        "utterances_in_progress": syn.running,
        "utterances_waiting": syn.waiting,
    }
    if syn.workers is not None:
        assert syn.queued is not None and syn.parked is not None
        assert syn.busy is not None and syn.open_jobs is not None
        gauges |= {
            "sched_open": syn.open_jobs,
            "synth_workers": syn.workers,
            "sched_queued": syn.queued,
            "sched_parked": syn.parked,
            "sched_busy": syn.busy,
        }
    load = calls.load_snapshot()  # load.py: utilisation, capacity, demand, headroom
    gauges |= {
        "utilisation_ratio": round(load.utilisation, 6),
        "capacity_audio_seconds_per_second": round(load.capacity, 6),
        "demand_audio_seconds_per_second": round(load.demand, 6),
        "call_demand_audio_seconds_per_second": round(load.call_demand, 6),
    }
    if load.headroom_calls is not None:
        gauges["headroom_calls"] = round(load.headroom_calls, 6)
    fams += [gauge(p + name, value) for name, value in gauges.items()]
    if syn.recalled is not None:  # pool Rule 4: recalls asked for a start, ever
        fams.append(counter(f"{p}sched_recalled_total", syn.recalled))
    if plan is not None:
        fams.append(
            Family(f"{p}plan_info", "gauge").add(1, {"plan": plan.name, "source": plan.source})
        )
        rtf = Family(f"{p}plan_rtf", "gauge")
        for n, r in sorted(plan.rtf.items()):
            rtf.add(round(r, 4), {"threads": n})
        fams.append(rtf)
    ahead = Family(f"{p}call_ahead_seconds", "gauge")
    for c in table.calls:
        ahead.add(round(c.ahead_s, 3), {"call_id": c.call_id})
    fams.append(ahead)
    return fams
