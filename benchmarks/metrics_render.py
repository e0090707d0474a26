"""Render time of the engine's METRICS: our ``svc.metrics.render`` vs ``prometheus_client``
(``generate_latest`` over a custom collector yielding the same families).

    python benchmarks/metrics_render.py [--rounds 2000] [--calls 20]

Prints microseconds per render for each, and checks that ``prometheus_client.parser``
reads our output back to the same samples as its own.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from svc.metrics import Family, counter, gauge, render, summary  # noqa: E402


def families(calls: int) -> list[Family]:
    fams = [counter(f"ttsdock_engine_c{i}_total", i * 7) for i in range(16)]
    fams += [gauge(f"ttsdock_engine_g{i}", i) for i in range(8)]
    fams += [
        summary(f"ttsdock_engine_s{i}_seconds", {0.5: 0.01, 0.9: 0.02, 0.99: 0.05}, 12.5, 400)
        for i in range(5)
    ]
    ahead = Family("ttsdock_engine_call_ahead_seconds", "gauge")
    for c in range(calls):
        ahead.add(0.25, {"call_id": c})
    return [*fams, ahead]


def client_collector(fams: list[Family]) -> Any:
    from prometheus_client.metrics_core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        SummaryMetricFamily,
    )

    class Collector:
        def collect(self) -> Any:
            for f in fams:
                if f.type == "counter":
                    yield CounterMetricFamily(f.name[: -len("_total")], "", f.samples[0].value)
                elif f.type == "summary":
                    m = SummaryMetricFamily(f.name, "", count_value=400, sum_value=12.5)
                    for s in f.samples[:3]:
                        m.add_sample(f.name, dict(s.labels), float(s.value))
                    yield m
                else:
                    g = GaugeMetricFamily(f.name, "", labels=[k for k, _ in f.samples[0].labels])
                    for s in f.samples:
                        g.add_metric([v for _, v in s.labels], float(s.value))
                    yield g

    return Collector()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--calls", type=int, default=20)
    args = ap.parse_args()
    fams = families(args.calls)
    t0 = time.perf_counter()
    for _ in range(args.rounds):
        ours = render(families(args.calls))
    t_ours = (time.perf_counter() - t0) / args.rounds * 1e6
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    reg = CollectorRegistry()
    reg.register(client_collector(fams))
    t0 = time.perf_counter()
    for _ in range(args.rounds):
        theirs = generate_latest(reg).decode()
    t_theirs = (time.perf_counter() - t0) / args.rounds * 1e6

    def samples(text: str) -> set[tuple[str, tuple[tuple[str, str], ...], float]]:
        return {
            (s.name, tuple(sorted(s.labels.items())), float(s.value))
            for f in text_string_to_metric_families(text)
            for s in f.samples
            if not s.name.endswith("_created")
        }

    same = samples(ours) == samples(theirs)
    n = sum(len(f.samples) for f in fams)
    print(
        f"{len(fams)} families, {n} samples: svc.metrics.render {t_ours:.0f} us "
        f"(building the families included), prometheus_client.generate_latest "
        f"{t_theirs:.0f} us; same samples when parsed back: {same}"
    )


if __name__ == "__main__":
    main()
