"""Prometheus text exposition (format 0.0.4): the one renderer of the dock and the engines.

Rule 1: metric families in, text out; nothing here reads a clock, a socket or a
counter. The dock (``ttsdock.stats``) and the engines (``engines.runtime.metrics``)
build ``Family`` values from their own numbers; the cmd ports' ``METRICS`` and the
HTTP ``GET /metrics`` both answer ``render(families)``, so both carry the same
families byte for byte.
Rule 2: this file knows no metric of ours; names and label values are checked and
escaped here, so a caller cannot produce a line a Prometheus server rejects.

Why not ``prometheus_client``: its registry needs the optional ``http`` extra, and the
cmd ports' METRICS belongs to the core dock, which keeps its small dependency set. The
tests parse this output with ``prometheus_client.parser`` (the reference parser), and
``benchmarks/metrics_render.py`` compares the two renderers' speed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from svc.stats import percentile

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
NAME_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
TYPES = ("counter", "gauge", "summary", "untyped")

Labels = tuple[tuple[str, str], ...]


class MetricError(ValueError):
    """A metric or label name that the exposition format does not allow (a bug of ours)."""


@dataclass(frozen=True, slots=True)
class Sample:
    suffix: str  # "" or a summary's "_sum" / "_count"
    labels: Labels
    value: float | int


@dataclass(slots=True)
class Family:
    """One ``# TYPE`` block: a metric name, its type, its samples."""

    name: str
    type: str
    help: str = ""
    samples: list[Sample] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not NAME_RE.fullmatch(self.name):
            raise MetricError(f"bad metric name {self.name!r}")
        if self.type not in TYPES:
            raise MetricError(f"bad metric type {self.type!r}")

    def add(self, value: float | int, labels: Mapping[str, object] | None = None) -> Family:
        self.samples.append(Sample("", _labels(labels), value))
        return self


def counter(name: str, value: float | int, help_: str = "") -> Family:
    """A counter; ``name`` ends in ``_total`` by convention (the caller's choice)."""
    return Family(name, "counter", help_).add(value)


def gauge(name: str, value: float | int, help_: str = "") -> Family:
    return Family(name, "gauge", help_).add(value)


def labelled(
    name: str, type_: str, values: Mapping[str, float | int], label: str, help_: str = ""
) -> Family:
    """One family with one sample per label value (``{label="<key>"}``), in key order."""
    fam = Family(name, type_, help_)
    for key in sorted(values):
        fam.add(values[key], {label: key})
    return fam


def summary(
    name: str,
    quantiles: Mapping[float, float],
    total: float,
    count: int,
    help_: str = "",
) -> Family:
    """A summary: ``{quantile="q"}`` samples, then cumulative ``_sum`` and ``_count``."""
    fam = Family(name, "summary", help_)
    for q in sorted(quantiles):
        fam.samples.append(Sample("", (("quantile", f"{q:g}"),), quantiles[q]))
    fam.samples.append(Sample("_sum", (), total))
    fam.samples.append(Sample("_count", (), count))
    return fam


#: The quantiles (percent) of every latency summary, the dock's and the engines'.
LATENCY_QUANTILES = (50, 90, 99)


def latency_summary(
    name: str,
    recent: Iterable[float],
    total: float,
    count: int,
    *,
    per_second: float,
    help_: str = "",
) -> Family:
    """A latency as a summary in seconds: ``LATENCY_QUANTILES`` (nearest rank) of the
    ``recent`` samples (a bounded window), then ``total`` and ``count`` of every sample
    ever taken, which Prometheus requires never to go down. Samples and ``total`` are
    in units of ``1 / per_second`` s (1e6: microseconds, 1000: milliseconds); seconds
    are rounded to the microsecond."""
    values = sorted(recent)
    quantiles = {
        q / 100: round(percentile(values, q, presorted=True) / per_second, 6)
        for q in LATENCY_QUANTILES
    }
    return summary(name, quantiles, round(total / per_second, 6), count, help_)


def render(families: Iterable[Family]) -> str:
    """The exposition text: ``# HELP``/``# TYPE`` and samples per family; ends with ``\\n``.

    A name seen twice is merged into its first family (Prometheus rejects a repeated
    ``# TYPE``). Linear in the number of samples."""
    merged: dict[str, Family] = {}
    for fam in families:
        first = merged.get(fam.name)
        if first is None:
            merged[fam.name] = Family(fam.name, fam.type, fam.help, list(fam.samples))
        elif first.type != fam.type:
            raise MetricError(f"{fam.name} declared as {first.type} and {fam.type}")
        else:
            first.samples.extend(fam.samples)
    lines: list[str] = []
    for fam in merged.values():
        if fam.help:
            lines.append(f"# HELP {fam.name} {_escape_help(fam.help)}")
        lines.append(f"# TYPE {fam.name} {fam.type}")
        for s in fam.samples:
            lines.append(f"{fam.name}{s.suffix}{_render_labels(s.labels)} {fmt_value(s.value)}")
    return "\n".join(lines) + "\n"


def fmt_value(v: float | int) -> str:
    """Integers as integers; floats in their shortest exact form; ``+Inf``/``-Inf``/``NaN``."""
    if isinstance(v, bool):
        return str(int(v))
    if isinstance(v, int):
        return str(v)
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))


def _labels(labels: Mapping[str, object] | None) -> Labels:
    if not labels:
        return ()
    out: list[tuple[str, str]] = []
    for k, v in labels.items():
        if not LABEL_RE.fullmatch(k) or k.startswith("__"):
            raise MetricError(f"bad label name {k!r}")
        out.append((k, str(v)))
    return tuple(out)


def _render_labels(labels: Labels) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels) + "}"


def _escape_label(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n")
