"""The deadline queue and the playback arithmetic (sans-I/O, no threads, no clocks)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engines.runtime.playback import UNDERRUN_MIN_S, PlaybackMeter
from engines.runtime.schedule import (
    RECALL_MARGIN_S,
    RECALL_WAIT_S,
    DeadlineQueue,
    RunningUnit,
    StepEstimate,
    deadline_for,
    recall_victim,
)
from engines.runtime.synth import SAMPLE_RATE, PlaybackClock

# -- DeadlineQueue ---------------------------------------------------------------------


class Item:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


def test_earliest_deadline_first_and_fifo_among_equals() -> None:
    q: DeadlineQueue[Item] = DeadlineQueue()
    a, b, c, d = Item("a"), Item("b"), Item("c"), Item("d")
    q.push(a, 5.0, now=0.0)
    q.push(b, 1.0, now=0.0)
    q.push(c, 5.0, now=0.0)
    q.push(d, 3.0, now=0.0)
    order = [q.pop(10.0) for _ in range(4)]
    assert [got[0] for got in order if got] == [b, d, a, c]
    assert q.pop(10.0) is None and len(q) == 0


def test_parked_item_waits_for_its_ready_time_and_urgent_new_work_overtakes() -> None:
    q: DeadlineQueue[Item] = DeadlineQueue()
    far, new = Item("far-ahead window"), Item("new utterance")
    q.push(far, deadline=8.0, now=0.0, ready_at=5.0)  # 3 s of audio queued beyond the cap
    assert q.pop(1.0) is None and q.parked(1.0) == 1
    assert q.next_ready_at(1.0) == 5.0
    got = q.pop(1.0, parked_too=True)  # shutting down: everything gets closed
    assert got is not None and got[0] is far and got[1] == 0.0
    q.push(far, deadline=8.0, now=0.0, ready_at=5.0)
    q.push(new, deadline=9.0, now=2.0)  # due later, but ready now
    got = q.pop(2.5)
    assert got is not None and got[0] is new and got[1] == pytest.approx(0.5)
    got = q.pop(6.0)
    assert got is not None and got[0] is far and got[1] == pytest.approx(1.0)  # ready at 5


def test_expedite_puts_cancelled_work_first_and_remove_forgets() -> None:
    q: DeadlineQueue[Item] = DeadlineQueue()
    a, b, c = Item("a"), Item("b"), Item("c")
    q.push(a, 1.0, now=0.0)
    q.push(b, 2.0, now=0.0, ready_at=100.0)
    q.push(c, 3.0, now=0.0)
    assert q.expedite(b, now=0.0)  # parked and late in order: first now
    assert not q.expedite(Item("stranger"), now=0.0)
    assert q.remove(c) and not q.remove(c) and c not in q
    got = q.pop(0.0)
    assert got is not None and got[0] is b
    got = q.pop(0.0)
    assert got is not None and got[0] is a


entries = st.lists(
    st.tuples(
        st.floats(-1e3, 1e3, allow_nan=False, allow_subnormal=False),  # deadline
        st.floats(-1e3, 1e3, allow_nan=False, allow_subnormal=False)
        | st.just(-math.inf),  # ready_at
    ),
    max_size=30,
)


@given(entries, st.floats(-1e3, 1e3, allow_nan=False, allow_subnormal=False))
def test_pop_order_is_sorted_by_deadline_among_ready_items(
    es: list[tuple[float, float]], now: float
) -> None:
    q: DeadlineQueue[Item] = DeadlineQueue()
    items = [Item(str(i)) for i in range(len(es))]
    for it, (dl, ready) in zip(items, es, strict=True):
        q.push(it, dl, now=-2e3, ready_at=ready)
    popped = []
    while True:
        first = q.first_deadline(now)  # what pop is about to return, not taking it
        if (got := q.pop(now)) is None:
            assert first is None
            break
        assert first == es[int(got[0].name)][0]
        popped.append(got[0])
        assert got[1] >= 0
    ready = [(dl, i) for i, (dl, r) in enumerate(es) if r <= now]
    assert [int(p.name) for p in popped] == [i for _, i in sorted(ready)]
    assert len(q) == len(es) - len(ready) == q.parked(now)
    nxt = q.next_ready_at(now)
    assert (nxt is None) == (len(q) == 0)
    if nxt is not None:
        assert nxt > now


def test_deadline_rule() -> None:
    # the listener runs dry at 10 s, the next unit takes 0.4 s, at most 3 s ahead
    assert deadline_for(10.0, 0.4, 3.0) == (pytest.approx(9.6), 7.0)


# -- recalling a running unit for a new utterance's start ------------------------------


def unit(
    started: float, expected: float, queued: float, *, first: bool = False, recalled: bool = False
) -> RunningUnit:
    """A unit at ``now`` = 10.0 whose listener has ``queued`` s of audio."""
    return RunningUnit(started, expected, 10.0 + queued, first, recalled)


def test_a_start_recalls_the_unit_whose_listener_can_spare_it_that_started_last() -> None:
    first = 0.3  # a first unit's expected compute
    # two units of 0.4 s, 0.3 s to go at least: both listeners have 3 s queued
    a, b = unit(9.9, 0.4, 3.0), unit(9.95, 0.4, 3.0)
    assert recall_victim([a, b], 10.0, first) == 1  # the least work lost
    # b's listener has less than the start, b's unit twice and the margin
    b_short = unit(9.95, 0.4, first + 0.8 + RECALL_MARGIN_S - 0.01)
    assert recall_victim([a, b_short], 10.0, first) == 0
    assert recall_victim([b_short], 10.0, first) is None
    # a first unit is never recalled
    assert recall_victim([a, unit(9.95, 0.4, 3.0, first=True)], 10.0, first) == 0
    assert recall_victim([unit(9.95, 0.4, 3.0, first=True)], 10.0, first) is None
    # a worker frees within RECALL_WAIT_S: nothing is recalled
    ending = unit(9.0, 1.0 + RECALL_WAIT_S / 2, 3.0)
    assert recall_victim([ending, b], 10.0, first) is None
    # a unit more than half done by its estimate is not recalled: more work would be
    # lost than waiting for it costs
    assert recall_victim([unit(9.7, 0.5, 3.0)], 10.0, first) is None
    assert recall_victim([unit(9.75, 0.5, 3.0)], 10.0, first) == 0
    # a unit past its expected end may run on: it does not count (nor is it recalled)
    overrun = unit(9.0, 0.5, 3.0)
    assert recall_victim([overrun, a], 10.0, first) == 1
    assert recall_victim([overrun], 10.0, first) is None
    # one at a time: while one is being recalled, no other
    assert recall_victim([unit(9.9, 0.4, 3.0, recalled=True), b], 10.0, first) is None
    assert recall_victim([], 10.0, first) is None


@given(
    st.lists(
        st.tuples(
            st.floats(0.0, 10.0, allow_subnormal=False),  # started
            st.floats(0.0, 2.0, allow_subnormal=False),  # expected compute
            st.floats(-1.0, 5.0, allow_subnormal=False),  # audio queued
            st.booleans(),  # a first unit
            st.booleans(),  # recalled
        ),
        max_size=6,
    ),
    # (no subnormals: a library in the suite's process may flush them to zero)
    st.floats(0.0, 1.0, allow_subnormal=False),
)
def test_a_recalled_unit_always_has_audio_to_spare_and_is_never_a_first_unit(
    units: list[tuple[float, float, float, bool, bool]], first: float
) -> None:
    running = [unit(s, e, q, first=f, recalled=r) for s, e, q, f, r in units]
    k = recall_victim(running, 10.0, first)
    if k is None:
        return
    v = running[k]
    assert not v.first and not any(r.recalled for r in running)
    assert v.dry_at - 10.0 >= first + 2 * v.expected_s + RECALL_MARGIN_S
    assert 10.0 - v.started <= v.started + v.expected_s - 10.0  # at most half done
    assert not any(0.0 <= r.started + r.expected_s - 10.0 <= RECALL_WAIT_S for r in running)


def test_step_estimate_is_an_ema_that_ignores_nonsense() -> None:
    e = StepEstimate()
    e.add(1.0)
    assert e.value == 1.0 and e.n == 1
    e.add(0.0)
    assert e.value == pytest.approx(0.7)
    e.add(float("nan"))
    e.add(-1.0)
    assert e.n == 2


# -- PlaybackMeter ---------------------------------------------------------------------


def sec(s: float) -> int:
    return round(s * SAMPLE_RATE)


def test_packets_ahead_of_playback_are_no_underrun() -> None:
    m = PlaybackMeter(clock=lambda: 0.7)
    assert isinstance(m, PlaybackClock)
    assert m.sent(sec(0.2), 0.0) == 0.0 and m.sent(sec(0.2), 0.0) == 0.0  # first unit
    assert m.sent(sec(0.2), 0.3) == 0.0  # 0.1 s of audio still queued
    assert m.underruns == 0 and m.sent_until() == pytest.approx(0.6)
    assert m.ahead_s() == pytest.approx(-0.1)  # at 0.7 the listener ran dry 0.1 s ago


def test_a_late_packet_is_an_underrun_and_shifts_the_listener() -> None:
    m = PlaybackMeter()
    m.sent(sec(0.5), 10.0)
    assert m.sent(sec(0.5), 10.8) == pytest.approx(0.3)  # dry at 10.5, arrived 10.8
    assert m.underruns == 1 and m.underrun_s == pytest.approx(0.3)
    assert m.sent_until() == pytest.approx(11.3)  # resumed with that packet
    assert m.sent(sec(0.2), 11.0) == 0.0  # measured from the shifted clock
    assert m.underruns == 1


def test_jitter_below_the_threshold_is_not_counted() -> None:
    m = PlaybackMeter()
    m.sent(sec(0.2), 0.0)
    assert m.sent(sec(0.2), 0.2 + UNDERRUN_MIN_S / 2) == 0.0
    assert m.underruns == 0


def test_next_utterance_starts_after_the_previous_one_and_a_late_start_is_a_gap() -> None:
    on_time = PlaybackMeter(not_before=5.0)
    assert on_time.sent(sec(1.0), 4.0) == 0.0  # previous sentence still playing
    assert on_time.sent_until() == pytest.approx(6.0)
    late = PlaybackMeter(not_before=5.0)
    assert late.sent(sec(1.0), 5.4) == pytest.approx(0.4)
    assert late.underruns == 1
    idle = PlaybackMeter()  # the listener was idle when the text came: that is TTFA
    assert idle.sent(sec(1.0), 99.0) == 0.0


def test_produced_audio_counts_before_it_is_sent() -> None:
    m = PlaybackMeter(not_before=2.0)
    m.produced(sec(1.5))
    assert m.ahead_at(1.0) == pytest.approx(2.5)  # 1 s of the previous one + 1.5 s
    assert m.dry_at(1.0) == pytest.approx(3.5)
    m.sent(sec(1.0), 1.2)
    m.sent(sec(0.5), 1.3)
    assert m.dry_at(4.0) == pytest.approx(3.5)
    assert m.ahead_at(4.0) == pytest.approx(-0.5)


@given(
    st.lists(
        st.tuples(st.floats(0, 2.0, allow_nan=False, allow_subnormal=False), st.integers(1, 4800)),
        min_size=1,
        max_size=50,
    )
)
def test_underruns_add_up_to_the_time_the_listener_waited(
    packets: list[tuple[float, int]],
) -> None:
    """Replaying sends in time order: the listener never plays audio it has not got, and
    its total wait is exactly the last play-out time minus the first packet time minus
    the audio sent."""
    m = PlaybackMeter()
    t = 0.0
    first = packets[0][0]
    total = waited = 0.0
    for k, (dt, n) in enumerate(packets):
        t += dt
        dry = m.sent_until()
        gap = m.sent(n, t)
        assert gap >= 0
        if k:
            waited += max(0.0, t - dry)
        total += n / SAMPLE_RATE
        assert m.sent_until() >= t + n / SAMPLE_RATE - 1e-9  # never plays what it lacks
    assert m.sent_until() == pytest.approx(first + total + waited)
    assert waited - len(packets) * UNDERRUN_MIN_S - 1e-9 <= m.underrun_s <= waited + 1e-9
