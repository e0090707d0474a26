"""Small statistics shared by the dock and the engines (``STATS`` / ``METRICS`` replies)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TypeVar

N = TypeVar("N", int, float)


def percentile(values: Iterable[N], q: float, *, presorted: bool = False) -> N | int:
    """Nearest-rank percentile (``q`` in 0..100) of ``values``; 0 for no values.

    ``presorted=True`` promises an ascending sequence (no copy, no sort), for callers
    taking several percentiles of one sample.
    """
    s: Sequence[N] = values if presorted and isinstance(values, Sequence) else sorted(values)
    if not s:
        return 0
    k = max(0, min(len(s) - 1, math.ceil(q / 100.0 * len(s)) - 1))
    return s[k]
