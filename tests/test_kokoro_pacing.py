"""Window pacing: the window rule, its simulation, and the start planner (pure arithmetic)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engines.kokoro.pacing import (
    BUSY_WINDOW_S,
    FRAME_STAGE_FIXED,
    FRAME_STAGE_SHARE,
    HEADROOM,
    HORIZON_LOAD,
    JITTER_S,
    MAX_SAFETY,
    RAMP_FLOOR,
    RAMP_STEP,
    SAFETY,
    Forecast,
    Pace,
    Surprise,
    first_gang_frames,
    frame_stage_fits,
    horizon_keeps_up,
    next_window_frames,
    plan_first_end,
    plan_first_gang,
    plan_ramp,
    ramp_choices,
    simulate,
)
from engines.kokoro.windows import FRAMES_PER_S

CTX, MIN, MAX = 10, 32, 200
INF = float("inf")


def test_window_is_ready_when_the_headroom_share_of_the_queue_has_played() -> None:
    pace = Pace.from_rtf(0.5)
    frames = next_window_frames(2.0, pace, CTX)
    # (frames + 2 ctx) decoded at 0.5 s per audio s take HEADROOM of the 2 s queued
    # less the jitter reserve
    assert abs(pace.decode_s(frames + 2 * CTX) - (HEADROOM * 2.0 - JITTER_S)) <= pace.frame_s
    shared = next_window_frames(2.0, Pace.from_rtf(0.5, shared=True), CTX)
    assert pace.decode_s(shared + 2 * CTX) <= BUSY_WINDOW_S + pace.frame_s
    assert next_window_frames(-1.0, pace, CTX) < 0  # an underrun: the caller clamps it


def test_a_window_alone_takes_the_whole_rest_only_when_that_is_ready_in_time() -> None:
    pace = Pace.from_rtf(1.0)  # 25 ms of decoding per frame
    ahead, ctx, least = 1.3, 2, 24
    budget = next_window_frames(ahead, pace, ctx)
    assert budget == 36  # (1.3 * 0.85 - 0.1) / 0.025 - 4
    # a rest of 39 leaves fewer than ``least``: the planner takes it whole, and that is
    # decoded before HEADROOM of the queue has played (the jitter reserve goes to it)
    assert next_window_frames(ahead, pace, ctx, 39, least) == budget
    # a rest of 53 taken whole would be late: leave ``least`` for a last window
    assert next_window_frames(ahead, pace, ctx, 53, least) == 53 - least
    # a rest that leaves at least ``least`` behind is not the planner's concern
    assert next_window_frames(ahead, pace, ctx, 70, least) == budget
    # a gang shares the rest evenly instead (Rule 3)
    gang = Pace(pace.frame_s, gang=2)
    assert next_window_frames(ahead, gang, ctx, 53, least) == 27


@pytest.mark.parametrize("rtf", [1.0, 1.1, 1.17])
@pytest.mark.parametrize("lead", [5, 8, 10])
def test_near_real_time_the_last_windows_keep_up_instead_of_taking_the_rest_whole(
    rtf: float, lead: int
) -> None:
    # measured in a 1-CPU quota: a 2.8 s sentence whose second window took the whole
    # 53-frame rest at a 35-frame budget and stuttered (0.15-0.29 s); the rule now
    # leaves a last window instead, and the same start plays through
    fc = simulate(
        114, 61, pace=Pace.from_rtf(rtf), context=2, min_frames=24, max_frames=200,
        lead_skip=lead, decode_from=5, ramp=12,
    )  # fmt: skip
    assert fc.gaps == 0 and fc.windows == 3


def test_the_whole_frame_stage_waits_until_the_queued_audio_pays_for_it() -> None:
    pace = Pace.from_rtf(0.4)
    n, ctx, least = 280, 2, 12
    cost = pace.decode_s(FRAME_STAGE_SHARE * n + FRAME_STAGE_FIXED)
    # just after a short first window: the next window would not be ready in time
    assert not frame_stage_fits(0.3, pace, n, ctx, 200, least)
    assert frame_stage_fits(2.0, pace, n, ctx, 200, least)
    # the least queue that pays for it leaves the next window its least frames
    ahead = min(
        a / 100 for a in range(0, 500) if frame_stage_fits(a / 100, pace, n, ctx, 200, least)
    )
    assert next_window_frames(ahead - cost, pace, ctx) >= least
    assert next_window_frames(ahead - 0.01 - cost, pace, ctx) < least
    # a longer sentence costs more; a few frames left need less after it
    assert not frame_stage_fits(ahead, pace, 2 * n, ctx, 200, least)
    assert frame_stage_fits(ahead - 0.05, pace, n, ctx, 4, least)


@settings(max_examples=200, deadline=None)
@given(
    a=st.floats(-1.0, 10.0),
    b=st.floats(-1.0, 10.0),
    rtf=st.floats(0.05, 3.0),
    n=st.integers(1, 2000),
    rest=st.integers(1, 2000),
)
def test_more_audio_queued_never_turns_the_whole_frame_stage_down(
    a: float, b: float, rtf: float, n: int, rest: int
) -> None:
    pace = Pace.from_rtf(rtf)
    lo, hi = min(a, b), max(a, b)
    if frame_stage_fits(lo, pace, n, 2, rest, 12):
        assert frame_stage_fits(hi, pace, n, 2, rest, 12)


def test_fast_decoding_starts_at_the_first_candidate_with_no_gap() -> None:
    end, fc = plan_first_end(
        200,
        [20, 24, 30, 40, 60],
        pace=Pace.from_rtf(0.2),
        context=CTX,
        min_frames=MIN,
        max_frames=MAX,
    )
    assert end == 20 and fc.gaps == 0 and fc.windows >= 2


def test_decoding_slower_than_real_time_decodes_most_of_the_sentence_before_it_starts() -> None:
    end, fc = plan_first_end(
        200,
        list(range(20, 200, 2)),
        pace=Pace.from_rtf(1.5),
        context=CTX,
        min_frames=MIN,
        max_frames=MAX,
    )
    # 1.5x slower than real time (1.8x with the safety factor): the rest must decode
    # while the first window plays, so the first window is over half the sentence
    assert 100 < end < 200 and fc.gaps == 0
    much_slower, fc = plan_first_end(
        200,
        list(range(20, 200, 2)),
        pace=Pace.from_rtf(20.0),
        context=CTX,
        min_frames=MIN,
        max_frames=MAX,
    )
    assert much_slower == 200 and fc.windows == 1 and fc.gaps == 0


def test_near_real_time_the_start_moves_later_and_then_plays_through() -> None:
    pace = Pace.from_rtf(0.8)
    cands = list(range(20, 300, 2))
    end, fc = plan_first_end(300, cands, pace=pace, context=CTX, min_frames=MIN, max_frames=MAX)
    assert 20 < end < 300 and fc.gaps == 0
    # the greedy rule from the default first window would stutter at the same speed
    greedy = simulate(
        300, 20, pace=Pace(pace.frame_s * SAFETY), context=CTX, min_frames=MIN, max_frames=MAX
    )
    assert greedy.gaps > 0


def test_the_margin_stays_while_decodes_run_as_estimated_and_grows_while_they_run_slower() -> None:
    steady = Surprise()
    for k in range(40):  # a steady box: a few per cent either side of the estimate
        steady.add(1.0, 1.05 if k % 2 else 0.95)
    assert steady.safety() == SAFETY
    swinging = Surprise()
    for k in range(12):  # a shared host: a third slower than estimated, often
        swinging.add(0.9, 1.2 if k % 3 else 0.85)
    assert 1.4 < swinging.safety() <= MAX_SAFETY
    faster = Surprise()
    for _ in range(20):  # decodes faster than their estimate never lower the margin
        faster.add(1.0, 0.5)
    assert faster.safety() == SAFETY
    for _ in range(40):  # the margin comes back down once decodes run as estimated
        swinging.add(1.0, 1.0)
    assert swinging.safety() == SAFETY


def test_the_margin_is_bounded_and_ignores_what_is_not_a_speed() -> None:
    s = Surprise()
    for bad in (float("nan"), float("inf"), -1.0):
        s.add(1.0, bad)
        s.add(bad, 1.0)
    s.add(0.0, 1.0)
    assert s.safety() == SAFETY
    for _ in range(30):
        s.add(0.1, 10.0)  # 100 times slower than estimated
    assert s.safety() == MAX_SAFETY


def test_the_larger_margin_keeps_a_sentence_gap_free_when_decoding_runs_slower_than_measured() -> (
    None
):
    # planned at the measured speed with the fixed margin, the sentence stutters when the
    # next seconds decode a third slower; with the margin of a box that has been that
    # much slower than estimated, it starts later and plays through at the slower speed
    measured = Pace.from_rtf(0.8)
    actual = Pace(measured.frame_s * 1.35)
    cands = list(range(20, 300, 2))
    kw = {"context": CTX, "min_frames": MIN, "max_frames": MAX}
    fixed, _ = plan_first_end(300, cands, pace=measured, **kw)  # type: ignore[arg-type]
    assert simulate(300, fixed, pace=actual, **kw).gaps > 0  # type: ignore[arg-type]
    swinging = Surprise()
    for _ in range(6):
        swinging.add(0.8, 0.8 * 1.35)
    margin = swinging.safety()
    later, fc = plan_first_end(300, cands, pace=measured, safety=margin, **kw)  # type: ignore[arg-type]
    assert fc.gaps == 0 and later > fixed
    assert simulate(300, later, pace=actual, **kw).gaps == 0  # type: ignore[arg-type]


def test_longest_bounds_the_first_window_and_reports_the_gaps_it_leaves() -> None:
    end, fc = plan_first_end(
        600,
        list(range(20, 600, 2)),
        pace=Pace.from_rtf(1.5),
        context=CTX,
        min_frames=MIN,
        max_frames=MAX,
        longest=MAX,
    )
    assert end == MAX and fc.gaps > 0 and fc.gap_s > 0


def test_audio_already_queued_lets_the_first_window_be_long_without_a_gap() -> None:
    pace = Pace.from_rtf(0.5)
    late = simulate(100, 100, pace=pace, context=CTX, min_frames=MIN, max_frames=MAX, ahead_s=0.1)
    assert late.gaps == 1  # 100 frames take 1.25 s, only 0.1 s queued
    ok = simulate(100, 100, pace=pace, context=CTX, min_frames=MIN, max_frames=MAX, ahead_s=5.0)
    assert ok.gaps == 0


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 800),
    rtf=st.floats(0.01, 4.0),
    first=st.integers(1, 800),
    lead=st.integers(0, 20),
)
def test_simulation_decodes_every_frame_and_counts_context(
    n: int, rtf: float, first: int, lead: int
) -> None:
    fc = simulate(
        n,
        first,
        pace=Pace.from_rtf(rtf),
        context=CTX,
        min_frames=MIN,
        max_frames=MAX,
        lead_skip=lead,
    )
    assert fc.decoded_frames >= n
    assert fc.decoded_frames <= n + 2 * CTX * fc.windows
    assert fc.gaps >= 0 and fc.gap_s >= 0
    assert (fc.gaps == 0) == (fc.gap_s == 0)


@settings(max_examples=100, deadline=None)
@given(n=st.integers(40, 800), rtf=st.floats(0.05, 3.0), k=st.floats(1.0, 3.0))
def test_the_plan_never_predicts_a_gap_and_slower_starts_no_earlier(
    n: int, rtf: float, k: float
) -> None:
    cands = list(range(20, n, 2))
    fast, _ = plan_first_end(
        n, cands, pace=Pace.from_rtf(rtf), context=CTX, min_frames=MIN, max_frames=MAX
    )
    slow, fc = plan_first_end(
        n, cands, pace=Pace.from_rtf(rtf * k), context=CTX, min_frames=MIN, max_frames=MAX
    )
    assert fc.gaps == 0  # the whole sentence in one window is always gap-free
    assert fast <= slow <= n or k < 1.05


def test_when_the_start_must_be_late_the_sentence_then_plays_through() -> None:
    # the previous sentence has 0.3 s left to play and decoding is slower than real time:
    # the earliest plan that only starts late, not a whole-sentence first window
    pace = Pace.from_rtf(1.5)
    cands = list(range(20, 160, 2))
    end, fc = plan_first_end(
        160, cands, pace=pace, context=CTX, min_frames=48, max_frames=MAX, ahead_s=0.3
    )
    whole = simulate(160, 160, pace=Pace(pace.frame_s * SAFETY), context=CTX, min_frames=48,
                     max_frames=MAX, ahead_s=0.3)  # fmt: skip
    assert fc.gaps == 1 and fc.inside == 0 and end < 160
    assert fc.gap_s < whole.gap_s


def test_frames_never_decoded_cost_nothing_and_start_the_sentence_sooner() -> None:
    pace = Pace.from_rtf(0.5)
    whole = simulate(200, 30, pace=pace, context=3, min_frames=24, max_frames=MAX, lead_skip=14)
    skipped = simulate(
        200, 30, pace=pace, context=3, min_frames=24, max_frames=MAX, lead_skip=14, decode_from=8
    )
    assert whole.decoded_frames - skipped.decoded_frames == 8 - 3  # less the left context
    assert skipped.start_s == pytest.approx(whole.start_s - pace.decode_s(5))


def test_a_ramp_lets_a_shorter_first_window_play_through() -> None:
    # decoding at 0.3 s per audio s: with later windows of at least 24 frames the first
    # must hold enough audio to cover a 24-frame decode; with a 12-frame ramp it need not
    pace = Pace.from_rtf(0.3)
    cands = list(range(20, 200))
    kw = {"pace": pace, "context": 2, "min_frames": 24, "max_frames": MAX, "lead_skip": 14}
    plain, fc_plain = plan_first_end(200, cands, **kw)  # type: ignore[arg-type]
    ramped, fc_ramped = plan_first_end(200, cands, ramp=12, **kw)  # type: ignore[arg-type]
    assert fc_plain.gaps == fc_ramped.gaps == 0
    assert ramped < plain
    assert fc_ramped.start_s < fc_plain.start_s
    # the planner's windows and the simulation's agree on the ramp
    safe = {**kw, "pace": Pace(pace.frame_s * SAFETY)}  # the planner's margin
    sim = simulate(200, ramped, ramp=12, **safe)  # type: ignore[arg-type]
    assert sim.gaps == 0 and sim.windows == fc_ramped.windows


def test_the_ramps_tried_go_down_from_the_shapes_to_the_floor() -> None:
    assert ramp_choices(12) == (12, 10, 8)
    assert ramp_choices(RAMP_FLOOR + 2 * RAMP_STEP + 1)[-1] >= RAMP_FLOOR
    assert ramp_choices(RAMP_FLOOR) == (RAMP_FLOOR,)  # nothing smaller to try
    assert ramp_choices(None) == (None,)  # windows with their own statistics: min_frames


#: a sentence of 224 frames starting as the engine's do: the leading pad's first 10
#: frames not decoded, 11 not heard; two windows at once, the first part 4 frames short
GANG_START = {
    "context": 2,
    "min_frames": 24,
    "max_frames": MAX,
    "lead_skip": 11,
    "decode_from": 10,
    "skew": 4,
}
GANG_CANDIDATES = list(range(14, 224))


def test_an_utterance_near_real_time_ramps_with_smaller_windows_and_starts_sooner() -> None:
    """Each of two windows at once at 1.0 compute s per audio s: with later windows of
    at least 12 frames the first must cover one's decode, with 8 it holds less."""
    gang = Pace.from_rtf(1.0, gang=2)
    kw = {**GANG_START, "pace": gang, "later": gang}
    end, ramp, fc = plan_ramp(224, GANG_CANDIDATES, ramp_choices(12), **kw)
    default_end, default = plan_first_end(224, GANG_CANDIDATES, ramp=12, **kw)  # type: ignore[arg-type]
    assert ramp is not None and ramp < 12
    assert end < default_end
    assert fc.start_s < default.start_s
    assert fc.gaps == default.gaps == 0
    assert fc.decoded_frames > default.decoded_frames  # the price: more context decoded
    # the planner's windows and the simulation agree on the chosen ramp, at its margin
    safe = Pace(gang.frame_s * SAFETY, gang=2)
    sim = simulate(224, end, ramp=12, start_ramp=ramp, **{**kw, "pace": safe, "later": safe})  # type: ignore[arg-type]
    assert sim.gaps == 0 and sim.windows == fc.windows


def test_the_start_ramp_lasts_its_steps_and_then_the_shapes_holds() -> None:
    """On a CPU where the queue stays short, windows kept at the smaller ramp all along
    decode more frames than those that return to the shape's after the start's steps."""
    gang = Pace.from_rtf(1.3, gang=2)
    kw = {**GANG_START, "pace": gang, "later": gang}
    start_only = simulate(345, 40, ramp=12, start_ramp=8, **kw)  # type: ignore[arg-type]
    all_along = simulate(345, 40, ramp=8, **kw)  # type: ignore[arg-type]
    shapes = simulate(345, 40, ramp=12, **kw)  # type: ignore[arg-type]
    assert all_along.decoded_frames > start_only.decoded_frames > shapes.decoded_frames
    assert all_along.windows > start_only.windows > shapes.windows
    # the start's steps alone differ: a sentence that ends within them is the same
    assert simulate(60, 30, ramp=8, **kw) == simulate(60, 30, ramp=12, start_ramp=8, **kw)  # type: ignore[arg-type]


def test_a_fast_cpu_keeps_the_shapes_ramp_and_plans_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import engines.kokoro.pacing as pacing

    plans: list[int | None] = []
    real = pacing.plan_first_end

    def counted(*args: object, **kw: object) -> tuple[int, pacing.Forecast]:
        plans.append(kw["ramp"])  # type: ignore[arg-type]
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(pacing, "plan_first_end", counted)
    gang = Pace.from_rtf(0.2, gang=2)
    cands = GANG_CANDIDATES[6:]  # the first window 10 frames at least
    end, ramp, _ = plan_ramp(224, cands, ramp_choices(12), **GANG_START, pace=gang)
    assert (end, ramp) == (cands[0], 12)
    assert plans == [12]  # the earliest candidate already: no smaller ramp tried
    with pytest.raises(ValueError):
        plan_ramp(224, GANG_CANDIDATES, (), **GANG_START, pace=gang)


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(30, 400),
    rtf=st.floats(0.05, 2.5),
    gang=st.integers(1, 3),
    ahead=st.one_of(st.none(), st.floats(0.0, 3.0)),
)
def test_a_smaller_ramp_is_taken_only_where_it_starts_sooner_with_no_more_gaps(
    n: int, rtf: float, gang: int, ahead: float | None
) -> None:
    pace = Pace.from_rtf(rtf, gang=gang)
    cands = list(range(14, n))
    kw = {**GANG_START, "pace": pace, "ahead_s": ahead}
    end, ramp, fc = plan_ramp(n, cands, ramp_choices(12), **kw)
    default_end, default = plan_first_end(n, cands, ramp=12, **kw)  # type: ignore[arg-type]
    if ramp == 12:
        assert (end, fc) == (default_end, default)
    else:
        assert ramp in ramp_choices(12)
        assert fc.gaps <= default.gaps
        assert fc.start_s < default.start_s


def test_a_gang_shares_the_rest_of_a_sentence_evenly_between_its_windows() -> None:
    gang = Pace.from_rtf(0.5, gang=2)
    assert next_window_frames(10.0, gang, CTX) == next_window_frames(10.0, Pace.from_rtf(0.5), CTX)
    assert next_window_frames(10.0, gang, CTX, remaining=81) == 41  # half, rounded up
    assert next_window_frames(10.0, Pace.from_rtf(0.5), CTX, remaining=81) > 41  # one at a time


def test_a_gang_on_two_cores_starts_sooner_and_plays_through_where_one_core_cannot() -> None:
    """One core decoding at 0.9 compute s per audio s cannot keep a sentence going once
    the windows' context is paid, so its start is late; two windows at once, each at
    1.1 (both cores busy), start with half the first window and then play through."""
    cands = list(range(10, 300, 2))
    kw = {"context": 2, "min_frames": 24, "max_frames": MAX, "ramp": 12}
    one_end, one = plan_first_end(300, cands, pace=Pace.from_rtf(0.9), **kw)  # type: ignore[arg-type]
    gang = Pace.from_rtf(1.1, gang=2)
    two_end, two = plan_first_end(300, cands, pace=gang, **kw)  # type: ignore[arg-type]
    assert two.gaps == 0
    assert two.start_s < 0.6 * one.start_s
    assert two_end < one_end
    # the first window's 100 frames, shared: the first audio leaves when the first 50 are
    # decoded (the sentence's start: context on the right only)
    first = simulate(300, 100, pace=gang, **kw)  # type: ignore[arg-type]
    assert first.start_s == pytest.approx(gang.decode_s(50 + 2))
    # the same first gang, then one window at a time at 0.9: a later window runs dry
    alone_later = simulate(300, two_end, pace=gang, later=Pace.from_rtf(0.9 * SAFETY), **kw)  # type: ignore[arg-type]
    assert alone_later.gaps > 0


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(30, 600),
    first=st.integers(1, 600),
    rtf=st.floats(0.05, 3.0),
    gang=st.integers(1, 4),
    ahead=st.one_of(st.none(), st.floats(0.0, 5.0)),
)
def test_the_simulation_decodes_every_frame_with_any_gang(
    n: int, first: int, rtf: float, gang: int, ahead: float | None
) -> None:
    fc = simulate(
        n,
        first,
        pace=Pace.from_rtf(rtf, gang=gang),
        context=2,
        min_frames=24,
        max_frames=MAX,
        ramp=12,
        ahead_s=ahead,
    )
    assert fc.windows >= 1 and fc.gaps >= fc.inside >= 0 and fc.gap_s >= 0
    assert fc.decoded_frames >= n  # every frame, context on top
    assert fc.start_s <= Pace.from_rtf(rtf).decode_s(min(n, first) + 2) + 1e-9


def test_a_first_window_shared_by_a_gang_puts_its_smallest_part_first() -> None:
    assert first_gang_frames(20, 2) == [10, 10]
    assert first_gang_frames(21, 2) == [10, 11]
    assert first_gang_frames(7, 3) == [2, 3, 2]
    assert first_gang_frames(2, 4) == [1, 1]  # at most one part per frame
    assert first_gang_frames(9, 1) == [9]
    for span in range(1, 60):
        for gang in range(1, 5):
            parts = first_gang_frames(span, gang)
            assert sum(parts) == span and parts[0] == min(parts) and max(parts) - min(parts) <= 1


def test_a_skewed_first_window_leaves_its_first_part_the_time_of_the_skew() -> None:
    """``skew``: the first part's share is of the span less the skew (its thread then
    runs the next windows' frame stage, synth ``_Prefetch``), the others take the rest;
    the first part is never empty, and the first audio comes that much sooner."""
    assert first_gang_frames(26, 2, skew=6) == [10, 16]
    assert first_gang_frames(26, 3, skew=5) == [7, 10, 9]
    assert first_gang_frames(4, 2, skew=40) == [1, 3]
    assert first_gang_frames(9, 1, skew=4) == [9]
    for span in range(1, 60):
        for gang in range(1, 5):
            for skew in range(0, 12):
                parts = first_gang_frames(span, gang, skew)
                assert sum(parts) == span and parts[0] == min(parts) >= 1
                assert parts[0] <= first_gang_frames(span, gang)[0]
    kw = {"context": 2, "min_frames": 24, "max_frames": MAX, "ramp": 12}
    pace = Pace.from_rtf(1.0, gang=2)
    even = simulate(300, 26, pace=pace, **kw)  # type: ignore[arg-type]
    skewed = simulate(300, 26, pace=pace, skew=6, **kw)  # type: ignore[arg-type]
    assert even.start_s == pytest.approx(pace.decode_s(13 + 2))
    assert skewed.start_s == pytest.approx(pace.decode_s(10 + 2))


def test_the_first_part_of_a_gang_must_be_heard_until_the_others_are_ready() -> None:
    """The first audio leaves with the first part; its speech (after the trimmed pad)
    must last until the gang's larger part is decoded, else that is a gap inside the
    sentence (the later windows decode almost at once here, so only that gap counts)."""
    kw = {
        "context": 2,
        "min_frames": 24,
        "max_frames": MAX,
        "ramp": 12,
        "lead_skip": 20,
        "decode_from": 14,
        "later": Pace.from_rtf(0.01, gang=2),
    }
    # 17 frames from frame 14 shared as 8 + 9; 20 frames of pad are trimmed, so the first
    # part is heard for 2 frames (50 ms): the second part's one frame more takes 27.5 ms
    # at 1.1 compute s per audio s, 75 ms at 3.0
    fast = simulate(300, 31, pace=Pace.from_rtf(1.1, gang=2), **kw)  # type: ignore[arg-type]
    slow = simulate(300, 31, pace=Pace.from_rtf(3.0, gang=2), **kw)  # type: ignore[arg-type]
    assert fast.start_s == pytest.approx(Pace.from_rtf(1.1).decode_s(8 + 4))
    assert slow.start_s == pytest.approx(Pace.from_rtf(3.0).decode_s(8 + 4))
    assert fast.gaps == 0
    assert slow.inside == slow.gaps == 1 and slow.gap_s == pytest.approx(0.075 - 0.05)
    # audio already queued ahead covers the whole first gang
    queued = simulate(300, 31, pace=Pace.from_rtf(3.0, gang=2), ahead_s=5.0, **kw)  # type: ignore[arg-type]
    assert queued.gaps == 0


def test_the_first_parts_thread_busy_after_it_delays_the_gang_not_the_first_audio() -> None:
    """Rule 10: the frame stage's run after the first part (``head_busy``) keeps the gang
    from being done until it ends, but the first audio still leaves with the first part;
    where the first window ends the sentence there is no such run."""
    pace = Pace.from_rtf(1.0, gang=2)
    kw = {**GANG_START, "pace": pace, "later": pace, "ramp": 12}
    free = simulate(224, 40, **kw)  # type: ignore[arg-type]
    busy = simulate(224, 40, head_busy=0.5, **kw)  # type: ignore[arg-type]
    assert busy.start_s == free.start_s
    assert busy.ready_s == pytest.approx(free.start_s + 0.5)
    assert busy.ready_s > free.ready_s
    whole = simulate(60, 60, head_busy=0.5, **kw)  # type: ignore[arg-type]
    assert whole == simulate(60, 60, **kw)  # type: ignore[arg-type]


#: a short sentence starting as the engine's do (decoding from frame 9, 13 frames of the
#: leading pad not heard) whose first gang's thread runs the frame stage for 8 frames'
#: time after its first part (the default skew)
SHORT_START = {
    "context": 2,
    "min_frames": 24,
    "max_frames": MAX,
    "lead_skip": 13,
    "decode_from": 9,
}


def _short(n: int, skews: tuple[int, ...], rtf: float = 0.833) -> tuple[int, int, Forecast]:
    pace = Pace.from_rtf(rtf, gang=2)
    kw = {**SHORT_START, "pace": pace, "later": pace, "head_busy": pace.decode_s(8)}
    end, _, skew, fc = plan_first_gang(n, list(range(17, n)), ramp_choices(12), skews, **kw)
    return end, skew, fc


def test_a_first_gang_that_would_take_a_short_sentence_whole_splits_closer_to_even() -> None:
    """Rule 10: with the default skew no first window of a 64-frame sentence plays
    through but the whole sentence as one gang (its first part, 8 frames short of half,
    is heard too briefly); half the skew starts 0.25 s sooner, still with no gap."""
    whole_end, whole_skew, whole = _short(64, (8,))
    assert whole_end == 64 and whole_skew == 8 and whole.gaps == 0
    end, skew, fc = _short(64, (8, 4, 0))
    assert end < 64 and skew in (4, 0)
    assert fc.gaps == 0 and fc.start_s <= whole.start_s - 0.25


def test_a_start_within_the_sentence_keeps_its_skew_and_plans_once_per_ramp(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import engines.kokoro.pacing as pacing

    skews: list[int] = []
    real = pacing.plan_ramp

    def counted(*args: Any, **kw: Any) -> tuple[int, int | None, Forecast]:
        skews.append(kw["skew"])
        return real(*args, **kw)

    monkeypatch.setattr(pacing, "plan_ramp", counted)
    end, skew, _ = _short(200, (8, 4, 0))
    assert end < 200 and skew == 8
    assert skews == [8]  # the default skew's start is within the sentence: no other tried
    with pytest.raises(ValueError):
        plan_first_gang(200, list(range(17, 200)), ramp_choices(12), (), **SHORT_START)


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(30, 300),
    rtf=st.floats(0.1, 2.0),
    skew=st.integers(0, 12),
    ahead=st.one_of(st.none(), st.floats(0.0, 3.0)),
)
def test_another_skew_is_taken_only_where_it_starts_sooner_with_no_more_gaps(
    n: int, rtf: float, skew: int, ahead: float | None
) -> None:
    pace = Pace.from_rtf(rtf, gang=2)
    kw = {**SHORT_START, "pace": pace, "later": pace, "ahead_s": ahead}
    kw["head_busy"] = pace.decode_s(skew)
    cands = list(range(17, n))
    end, ramp, chosen, fc = plan_first_gang(n, cands, ramp_choices(12), (skew, skew // 2, 0), **kw)
    d_end, d_ramp, default = plan_ramp(n, cands, ramp_choices(12), skew=skew, **kw)
    if chosen == skew:
        assert (end, ramp, fc) == (d_end, d_ramp, default)
    else:
        assert d_end >= n  # only where the default took the whole sentence
        assert fc.gaps <= default.gaps and fc.start_s < default.start_s


def test_the_share_rule_is_waived_while_the_others_end_before_this_utterance() -> None:
    # three utterances on two cores at 0.67 core s per s of speech: together 2.0 cores,
    # more than the cores keep in real time while all three speak
    cost = 0.67
    assert 3 * cost > 2
    # the two others have 2.8 and 3.0 s left, this one 5.0 s: over those 5 s they need
    # 10.8 s x 0.67 = 7.2 core s of 9 (HORIZON_LOAD x 2 cores x 5 s)
    assert horizon_keeps_up(5.0, [(2.8, 0.0), (3.0, 0.0)], cost, 2)
    # all three at their start: 15 s x 0.67 = 10 core s > 9
    assert not horizon_keeps_up(5.0, [(5.0, 0.0), (5.0, 0.0)], cost, 2)
    # the measured case: the others 4.4 and 4.7 s left, but 1.9 and 2.4 s ahead of their
    # listeners: by the time this one's 4.6 s have played they play 2.7 and 2.2 s more
    assert not horizon_keeps_up(4.6, [(4.4, 0.0), (4.7, 0.0)], cost, 2)
    assert horizon_keeps_up(4.6, [(4.4, 1.9), (4.7, 2.4)], cost, 2)
    # one of unknown length counts as speaking until this one has played
    assert horizon_keeps_up(5.0, [(4.0, 0.0), (3.0, 0.0)], cost, 2)
    assert not horizon_keeps_up(5.0, [(4.0, 0.0), (INF, 0.0)], cost, 2)
    assert not horizon_keeps_up(INF, [(0.5, 0.0)], cost, 2)  # this one's length unknown
    assert not horizon_keeps_up(0.0, [], cost, 2)
    # the bound: exactly HORIZON_LOAD of the cores over the horizon
    left = 4.0
    each = (HORIZON_LOAD * 2 * left / cost - left) / 2  # (3.4 s: inside the horizon)
    assert each < left
    assert horizon_keeps_up(left, [(each * 0.999, 0.0)] * 2, cost, 2)
    assert not horizon_keeps_up(left, [(each * 1.001, 0.0)] * 2, cost, 2)
    # audio this one has queued moves the horizon: the others' speech by then is due too
    assert not horizon_keeps_up(left, [(INF, 0.0)] * 2, cost, 2, ahead_s=0.0)
    assert horizon_keeps_up(left, [(each * 0.999, 0.0)] * 2, cost, 2, ahead_s=1.0)


@settings(max_examples=300, deadline=None)
@given(
    left=st.floats(0.1, 30.0),
    ahead=st.floats(0.0, 10.0),
    others=st.lists(
        st.tuples(st.one_of(st.floats(0.0, 60.0), st.just(INF)), st.floats(0.0, 10.0)),
        max_size=6,
    ),
    more=st.floats(0.0, 60.0),
    cost=st.floats(0.05, 3.0),
    cpus=st.integers(1, 16),
)
def test_more_speech_left_or_less_queued_never_waives_the_share_rule(
    left: float,
    ahead: float,
    others: list[tuple[float, float]],
    more: float,
    cost: float,
    cpus: int,
) -> None:
    kept = horizon_keeps_up(left, others, cost, cpus, ahead)
    # another utterance with more speech left, or less queued, or one more utterance,
    # waives no more
    if others:
        (o_left, o_queued), rest = others[0], others[1:]
        longer = [(o_left + more, o_queued), *rest]
        assert not horizon_keeps_up(left, longer, cost, cpus, ahead) or kept
        drier = [(o_left, max(0.0, o_queued - more)), *rest]
        assert not horizon_keeps_up(left, drier, cost, cpus, ahead) or kept
    assert not horizon_keeps_up(left, [*others, (more, 0.0)], cost, cpus, ahead) or kept
    # where nothing else is known (lengths unknown, nothing queued, this one too) the
    # rule stands whenever it applies: more than the cores keep in real time,
    # (n + 1) x cost > cpus (audio this one has queued may pay for its share)
    n = len(others)
    if (n + 1) * cost > cpus:
        assert not horizon_keeps_up(left, [(INF, 0.0)] * n, cost, cpus)


def _beside_another(
    freed: Pace | None = None, freed_at: float = INF, **first: Any
) -> tuple[int, Forecast]:
    """A 5 s sentence started beside another utterance on two cores: its windows at one
    core's crowded speed (0.626 compute s per audio s), the gang's 0.6 a core; ``first``:
    the first window's ``pace`` and Rule 9's arguments, where they differ."""
    lead = 6
    candidates = [*range(lead + 4, lead + 12), *range(lead + 12, lead + 36, 2)]
    candidates += list(range(lead + 36, 200, 4))
    one = Pace.from_rtf(0.626)
    return plan_first_end(
        200,
        candidates,
        **{"pace": one, **first},
        later=one,
        context=2,
        min_frames=24,
        max_frames=200,
        lead_skip=4,
        decode_from=lead,
        ramp=12,
        freed=freed,
        freed_at=freed_at,
    )


def test_a_start_beside_another_counts_on_the_cores_that_come_back() -> None:
    """Rule 8: the other utterance's speech decoded within a second, the windows after it
    run as a gang, and the start needs a shorter first window than on one core all along;
    that plan counts on the gang (on one core all along it would run dry)."""
    gang = Pace.from_rtf(0.6, gang=2)
    end_one, alone = _beside_another()
    end_back, back = _beside_another(gang, 1.0)
    assert end_back < end_one
    assert back.gaps == 0 and back.start_s < alone.start_s
    one = Pace.from_rtf(0.626 * SAFETY)
    dry = simulate(
        200, end_back, pace=one, context=2, min_frames=24, max_frames=200, decode_from=6, ramp=12
    )
    assert dry.gaps > 0
    # the later they come back, the later the start, up to the plan without them
    ends = [_beside_another(gang, at)[0] for at in (0.0, 1.0, 3.0, 30.0)]
    assert ends == sorted(ends) and ends[-1] <= end_one


@given(
    n=st.integers(30, 300),
    first=st.integers(4, 60),
    rtf=st.floats(0.2, 1.5),
    gang=st.integers(1, 3),
    at=st.floats(0.0, 10.0),
)
@settings(max_examples=150, deadline=None)
def test_cores_that_never_come_back_or_no_faster_change_nothing(
    n: int, first: int, rtf: float, gang: int, at: float
) -> None:
    """Rule 8's speed from ``freed_at`` on: never reached, or the same as before, the
    simulation is the one without it."""
    pace = Pace.from_rtf(rtf, gang=gang)

    def run(freed: Pace | None = None, freed_at: float = INF) -> Forecast:
        return simulate(
            n,
            first,
            pace=pace,
            context=2,
            min_frames=24,
            max_frames=200,
            decode_from=2,
            ramp=12,
            freed=freed,
            freed_at=freed_at,
        )

    plain = run()
    assert run(Pace.from_rtf(0.1, gang=2)) == plain
    assert run(pace, at) == plain


def _claiming(lag: float | None) -> tuple[int, Forecast]:
    """``_beside_another`` (the other's speech decoded 1 s later, then a gang) with the
    first window a gang on a core claimed from the other, free ``lag`` s after the start
    (Rule 9; None: one window on one core)."""
    gang = Pace.from_rtf(0.6, gang=2)
    if lag is None:
        return _beside_another(gang, 1.0)
    return _beside_another(gang, 1.0, pace=gang, lag=lag, freed_after_first=True)


def test_a_start_that_claims_a_core_for_its_first_gang_starts_sooner() -> None:
    """Rule 9: with a core of the other's from 0.1 s on, the first window is a gang and
    the first audio comes sooner than with one window on one core; the later that core
    comes free, the later the start."""
    end_one, one = _claiming(None)
    _, now = _claiming(0.1)
    assert now.gaps == 0 and now.start_s < one.start_s
    starts = [_claiming(lag)[1].start_s for lag in (0.0, 0.2, 0.5, 1.0)]
    assert starts == sorted(starts)
    assert end_one > 0


@given(
    n=st.integers(30, 300),
    first=st.integers(4, 60),
    rtf=st.floats(0.2, 1.5),
    gang=st.integers(2, 3),
    lag=st.floats(0.0, 3.0),
)
@settings(max_examples=150, deadline=None)
def test_a_claimed_core_delays_the_gang_not_its_first_part(
    n: int, first: int, rtf: float, gang: int, lag: float
) -> None:
    """Rule 9's ``lag``: 0 is the gang as before; a positive one leaves the first audio
    where it was (the first part runs on the unit's own core), and one past the first
    part's audio predicts a gap; ``freed_after_first`` moves the cores' return by the
    first part's decode."""
    pace = Pace.from_rtf(rtf, gang=gang)

    def run(lag: float = 0.0, **kw: Any) -> Forecast:
        return simulate(
            n,
            first,
            pace=pace,
            later=Pace.from_rtf(rtf),
            context=2,
            min_frames=24,
            max_frames=200,
            decode_from=2,
            ramp=12,
            lag=lag,
            **kw,
        )

    plain = run()
    assert run(0.0) == plain
    late = run(lag)
    assert late.start_s == plain.start_s
    assert plain.ready_s >= plain.start_s and late.ready_s >= min(lag, plain.ready_s)
    if lag > plain.start_s + min(first, n) / FRAMES_PER_S:
        assert late.gaps >= 1
    freed = Pace.from_rtf(rtf / 4, gang=gang)
    shifted = run(freed=freed, freed_at=lag, freed_after_first=True)
    assert shifted == run(freed=freed, freed_at=lag + plain.start_s)
