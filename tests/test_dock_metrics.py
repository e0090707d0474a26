"""Dock METRICS: the hop-latency summary's _sum and _count are cumulative (Prometheus
requires them never to go down); its quantiles come from the ring of recent samples.
One ``percentile`` (svc.stats) serves the dock and the engines."""

from __future__ import annotations

import re

from engines.runtime.stats import LatencyWindow
from svc.stats import percentile
from ttsdock.stats import RESERVOIR, Stats


def summary(prom: str) -> tuple[dict[str, float], float, int]:
    q = {
        m[1]: float(m[2])
        for m in re.finditer(
            r'^ttsdock_hop_latency_seconds\{quantile="([^"]+)"\} (\S+)$', prom, re.M
        )
    }
    s = re.search(r"^ttsdock_hop_latency_seconds_sum (\S+)$", prom, re.M)
    c = re.search(r"^ttsdock_hop_latency_seconds_count (\S+)$", prom, re.M)
    assert s and c, prom
    return q, float(s[1]), int(c[1])


def test_sum_and_count_are_cumulative_past_the_ring() -> None:
    st = Stats()
    seen: list[tuple[float, int]] = []
    total = 0
    for batch in range(3):
        for i in range(RESERVOIR):
            us = 1000 if batch == 0 else 10 + i % 7
            st.add_hop(us)
            total += us
        _q, s, c = summary(st.prometheus({}))
        seen.append((s, c))
    assert [c for _s, c in seen] == [RESERVOIR, 2 * RESERVOIR, 3 * RESERVOIR]
    sums = [s for s, _c in seen]
    assert sums == sorted(sums) and sums[0] < sums[1] < sums[2]  # never goes down
    assert abs(sums[-1] - total / 1e6) < 1e-6
    # the quantiles describe the recent samples only (the 1000 us ones left the ring)
    q, _s, _c = summary(st.prometheus({}))
    assert set(q) == {"0.5", "0.9", "0.99"}
    assert all(v < 20e-6 for v in q.values()), q
    d = st.as_dict()
    assert d["hop_samples"] == 3 * RESERVOIR and d["hop_max_us"] == 1000


def test_empty_summary() -> None:
    q, s, c = summary(Stats().prometheus({}))
    assert (s, c) == (0.0, 0) and set(q.values()) == {0.0}


def test_shared_percentile() -> None:
    assert percentile([], 50) == 0
    assert percentile([3, 1, 2], 50) == 2
    assert percentile([1, 2, 3, 4], 100) == 4 and percentile([1, 2, 3, 4], 0) == 1
    assert percentile([1.5, 0.5], 50, presorted=False) == 0.5
    assert percentile((0.5, 1.5, 9.0), 99, presorted=True) == 9.0
    w = LatencyWindow(size=4)
    for ms in (100.0, 1.0, 2.0, 3.0, 4.0):
        w.add(ms)
    assert w.count == 5 and w.p(99) == 4.0 and w.p(50) == 2.0
