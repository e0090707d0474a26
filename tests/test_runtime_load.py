"""The engine's load figures (``engines.runtime.load``): utilisation, capacity, headroom."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engines.runtime.load import (
    CALL_DEMAND_PRIOR,
    MIN_CORE_S,
    TARGET_UTILISATION,
    WINDOW_S,
    LoadMeter,
)


def test_before_any_work_the_capacity_is_the_engines_estimate() -> None:
    meter = LoadMeter(cpus=2)
    snap = meter.snapshot(0.0, estimate=3.0)
    assert snap.capacity == 3.0 and snap.utilisation == 0.0 and snap.calls == 0
    assert snap.headroom_calls == pytest.approx(3.0 * TARGET_UTILISATION / CALL_DEMAND_PRIOR)
    assert meter.snapshot(0.0).headroom_calls is None  # no estimate: unknown


def test_measured_capacity_replaces_the_estimate_but_never_exceeds_it() -> None:
    meter = LoadMeter(cpus=2)
    t = 0.0
    while meter.snapshot(t).capacity == 0.0:  # one call, 0.5 core-s per 1 s of audio
        t += 1.0
        meter.unit(t, 0.5, 1.0, call_id=1)
    assert t >= MIN_CORE_S / 0.5
    # measured alone: 2 cores x 2 audio s per core-s
    assert meter.snapshot(t).capacity == pytest.approx(4.0)
    assert meter.snapshot(t, estimate=10.0).capacity == pytest.approx(4.0)
    # the estimate knows the cores share execution units (crowded): it bounds the figure
    assert meter.snapshot(t, estimate=2.5).capacity == pytest.approx(2.5)


@given(
    units=st.lists(
        st.tuples(
            st.floats(0.0, 5.0, allow_subnormal=False),
            st.floats(0.0, 2.0, allow_subnormal=False),
            st.floats(0.0, 3.0, allow_subnormal=False),
            st.integers(1, 4),
        ),
        max_size=40,
    ),
    estimate=st.one_of(st.none(), st.floats(0.1, 20.0, allow_subnormal=False)),
)
def test_the_figures_stay_in_range(
    units: list[tuple[float, float, float, int]], estimate: float | None
) -> None:
    meter = LoadMeter(cpus=2)
    t = 0.0
    for dt, core_s, audio_s, call in units:
        t += dt
        meter.unit(t, core_s, audio_s, call)
    snap = meter.snapshot(t + WINDOW_S / 2, estimate=estimate)
    assert 0.0 <= snap.utilisation <= 1.0
    assert snap.capacity >= 0.0
    if estimate is not None:
        assert snap.capacity <= estimate
    assert snap.headroom_calls is None or snap.headroom_calls >= 0.0
