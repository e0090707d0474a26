"""Decoder windows: first window short and at a word boundary, budgets, coverage, pieces."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engines.kokoro.windows import (
    FIXED_STATS_SHAPE,
    FRAME_SAMPLES,
    OWN_STATS_SHAPE,
    Window,
    WindowPlanner,
    boundary_frames,
    first_speech,
    speech_stop,
    window_piece,
)


def all_windows(p: WindowPlanner, budget: int | None = None) -> list[Window]:
    out = []
    while (w := p.next(budget)) is not None:
        out.append(w)
    return out


def test_boundary_frames_are_the_frames_of_space_and_mark_tokens() -> None:
    # [pad, a, ' ', b, '.', pad] with durations 3, 2, 1, 4, 2, 5
    frames = boundary_frames([3, 2, 1, 4, 2, 5], [50, 16, 51, 4], {16, 4})
    assert frames == [5, 10, 11]
    with pytest.raises(ValueError):
        boundary_frames([1, 2], [50], {16})


def test_first_window_ends_at_the_quietest_boundary_after_the_lead() -> None:
    energy = np.ones(200)
    energy[25] = 0.5
    energy[30] = 0.1  # quieter, but not a word boundary
    p = WindowPlanner(200, energy, [20, 25, 60], lead_frames=5, first_frames=(16, 26))
    first = p.next()
    assert first is not None and (first.start, first.end) == (0, 25)
    assert first.ctx_start == 0 and first.ctx_end == 25 + p.context


def test_without_a_boundary_in_range_the_quietest_frame_is_taken() -> None:
    energy = np.ones(200)
    energy[22] = 0.0
    p = WindowPlanner(200, energy, [], lead_frames=2, first_frames=(16, 26))
    first = p.next()
    assert first is not None and first.end == 22


def test_short_sentence_is_one_window() -> None:
    p = WindowPlanner(40, np.ones(40), [20], lead_frames=10, min_frames=32)
    (only,) = all_windows(p)
    assert (only.start, only.end, only.last) == (0, 40, True)
    assert (only.ctx_start, only.ctx_end) == (0, 40)


def test_later_windows_follow_the_budget_within_bounds() -> None:
    n = 600
    bounds = list(range(5, n, 7))
    p = WindowPlanner(n, np.ones(n), bounds, min_frames=32, max_frames=200, search=6)
    p.next()
    small = p.next(budget=1)
    assert small is not None and 32 <= small.frames <= 32 + 6
    big = p.next(budget=10_000)
    assert big is not None and big.frames <= 200
    mid = p.next(budget=80)
    assert mid is not None and abs(mid.frames - 80) <= 6


def test_no_tiny_last_window() -> None:
    p = WindowPlanner(100, np.ones(100), list(range(1, 100)), min_frames=32, max_frames=200)
    p.next()
    w = p.next(budget=60)
    assert w is not None and w.last and w.end == 100  # 60 would leave < 32 frames behind


@given(
    n=st.integers(1, 1500),
    lead=st.integers(0, 30),
    budgets=st.lists(st.one_of(st.none(), st.integers(-50, 400)), min_size=1, max_size=60),
    bounds=st.lists(st.integers(0, 1600), max_size=80),
    context=st.integers(0, 20),
    ramp=st.one_of(st.none(), st.integers(1, 60)),
)
def test_windows_tile_the_sentence_in_order_within_limits(
    n: int, lead: int, budgets: list[int | None], bounds: list[int], context: int, ramp: int | None
) -> None:
    energy = np.random.default_rng(n).random(n)
    p = WindowPlanner(n, energy, bounds, lead_frames=lead, context=context, ramp=ramp)
    windows: list[Window] = []
    i = 0
    while (w := p.next(budgets[i % len(budgets)])) is not None:
        windows.append(w)
        i += 1
        assert i <= n + 1
    assert windows[0].start == 0 and windows[-1].end == n and windows[-1].last
    assert all(not w.last for w in windows[:-1])
    for a, b in itertools.pairwise(windows):
        assert a.end == b.start and a.frames >= 1
    for w in windows:
        assert w.ctx_start == max(0, w.start - context) and w.ctx_end == min(n, w.end + context)
        if 0 < w.index and not w.last:
            assert p.ramp <= w.frames <= p.max_frames
            assert p.ramp == (p.min_frames if ramp is None else min(ramp, p.min_frames))
        if w.last and w.index > 1:  # never a tiny last window, even while ramping
            assert w.frames >= p.min_frames or w.frames == n - windows[-2].end


@given(
    n=st.integers(1, 400),
    lead=st.integers(0, 60),
    first=st.tuples(st.integers(1, 300), st.integers(0, 300)),
    bounds=st.lists(st.integers(0, 400), max_size=40),
    anywhere=st.booleans(),
    tail=st.one_of(st.none(), st.integers(0, 10)),
    pick=st.integers(0, 10_000),
)
def test_the_first_window_may_end_at_any_candidate(
    n: int,
    lead: int,
    first: tuple[int, int],
    bounds: list[int],
    anywhere: bool,
    tail: int | None,
    pick: int,
) -> None:
    # whatever the sentence and the first window's range (--first-window), the start
    # planner has a choice, and every choice is a window inside the decoded frames
    energy = np.random.default_rng(n).random(n)
    lo, hi = first[0], first[0] + first[1]
    p = WindowPlanner(
        n, energy, bounds, lead_frames=lead, first_frames=(lo, hi), cut_anywhere=anywhere, tail=tail
    )
    ends = p.first_candidates()
    assert ends and ends == sorted(set(ends)) and p.pos < ends[0] and ends[-1] <= p.n
    w = p.next(first_at=ends[pick % len(ends)])
    assert w is not None and w.start == 0 and 0 < w.end <= p.n


def test_pieces_overlap_by_the_fade_around_each_cut() -> None:
    n = 100
    audio_all = np.arange(n * FRAME_SAMPLES, dtype=np.float32)
    p = WindowPlanner(n, np.ones(n), [30, 70], lead_frames=0, min_frames=20, context=8)
    fade = 480
    pieces = []
    for w in all_windows(p, budget=40):
        decoded = audio_all[w.ctx_start * FRAME_SAMPLES : w.ctx_end * FRAME_SAMPLES]
        pieces.append((w, window_piece(decoded, w, fade)))
    # each piece holds exactly its frames plus half the fade on every inner side
    for w, piece in pieces:
        lo = w.start * FRAME_SAMPLES - (fade // 2 if w.start else 0)
        hi = w.end * FRAME_SAMPLES + (fade // 2 if not w.last else 0)
        np.testing.assert_array_equal(piece, audio_all[lo:hi])
    total = sum(len(pc) for _, pc in pieces) - fade * (len(pieces) - 1)
    assert total == n * FRAME_SAMPLES


def test_bad_planner_arguments() -> None:
    with pytest.raises(ValueError):
        WindowPlanner(0, [], [])
    with pytest.raises(ValueError):
        WindowPlanner(10, np.ones(10), [], first_frames=(5, 2))
    with pytest.raises(ValueError):
        WindowPlanner(10, np.ones(10), [], min_frames=50, max_frames=20)


def test_the_silent_start_of_the_leading_pad_can_be_left_undecoded() -> None:
    p = WindowPlanner(200, np.ones(200), [30, 60], lead_frames=14, context=3, skip=8)
    ws = all_windows(p)
    assert (ws[0].start, ws[0].ctx_start) == (8, 5), "decoded from the skip, less its context"
    assert ws[-1].end == 200 and all(a.end == b.start for a, b in itertools.pairwise(ws))
    for bad in (-1, 15):
        with pytest.raises(ValueError):
            WindowPlanner(200, np.ones(200), [], lead_frames=14, skip=bad)


def test_while_the_budget_is_small_windows_ramp_below_the_smallest_but_the_last_does_not() -> None:
    n = 300
    p = WindowPlanner(n, np.ones(n), [], min_frames=24, max_frames=400, search=0, ramp=12)
    p.next()
    small = p.next(budget=1)
    assert small is not None and small.frames == 12  # the ramp, not min_frames
    p.next(budget=p.remaining - 30)
    rest = p.next(budget=1)  # a 12-frame window would leave 18 (< 24): all 30 instead
    assert rest is not None and rest.last and rest.frames == 30


def test_windows_decoded_at_once_may_leave_a_window_as_small_as_the_ramp() -> None:
    n = 300
    p = WindowPlanner(n, np.ones(n), [], min_frames=24, max_frames=400, search=0, ramp=12)
    p.next()
    p.next(budget=p.remaining - 40)
    # a gang of two shares the last 40 frames: 20 each, though 20 is under min_frames
    a = p.next(budget=20, rest=p.ramp)
    b = p.next(budget=20, rest=p.ramp)
    assert a is not None and b is not None and (a.frames, b.frames) == (20, 20) and b.last
    q = WindowPlanner(n, np.ones(n), [], min_frames=24, max_frames=400, search=0, ramp=12)
    q.next()
    q.next(budget=q.remaining - 40)
    w = q.next(budget=30, rest=1)  # 10 left: never below the ramp, so all 40
    assert w is not None and w.frames == 40 and w.last


def test_first_window_candidates_every_frame_when_cuts_need_no_boundary() -> None:
    n = 200
    bounds = [40, 90]
    lead = 10
    at_words = WindowPlanner(n, np.ones(n), bounds, lead_frames=lead, first_frames=(4, 8))
    assert at_words.first_candidates() == [14, 40, 90]
    anywhere = WindowPlanner(
        n, np.ones(n), bounds, lead_frames=lead, first_frames=(4, 8), cut_anywhere=True
    )
    ends = anywhere.first_candidates()
    assert ends[:8] == list(range(14, 22))  # every frame near the start
    assert ends == sorted(set(ends)) and ends[-1] < n
    gaps = [b - a for a, b in itertools.pairwise(ends)]
    assert max(gaps) <= 4 and gaps == sorted(gaps)  # sparser with distance, never sparse


@pytest.mark.parametrize("anywhere", [False, True])
def test_a_sentence_shorter_than_the_first_window_is_one_window(anywhere: bool) -> None:
    # --first-window 100,120 and a 60-frame sentence (40 after its tail is cut)
    energy = np.concatenate([np.ones(40), np.zeros(20)])
    p = WindowPlanner(
        60, energy, [30], lead_frames=5, first_frames=(100, 120), cut_anywhere=anywhere, tail=0
    )
    assert p.n == 40 and p.first_candidates() == [40]
    w = p.next(first_at=p.first_candidates()[0])
    assert w is not None and (w.start, w.end, w.last) == (0, 40, True)
    assert p.next() is None


def test_the_trailing_silence_is_not_decoded_but_the_last_window_has_its_context() -> None:
    n = 200
    energy = np.full(n, 6.0)
    energy[:12] = -9.0  # the leading pad
    energy[150:] = -9.0  # the last phoneme's decay, the final mark and the pad
    p = WindowPlanner(n, energy, [], lead_frames=12, context=2, tail=4)
    assert (p.n, p.total, p.cut_tail) == (154, 200, 46)
    ws = all_windows(p)
    assert ws[-1].last and ws[-1].end == 154 and ws[-1].ctx_end == 156
    assert all(a.end == b.start for a, b in itertools.pairwise(ws))
    assert WindowPlanner(n, energy, [], lead_frames=12).n == n  # no tail: all frames


def test_a_sentence_without_speech_energy_after_its_lead_is_decoded_whole() -> None:
    quiet_then_loud = np.concatenate([np.full(10, 5.0), np.full(90, -9.0)])
    assert speech_stop(quiet_then_loud, 0.0, 4) == 14
    p = WindowPlanner(100, quiet_then_loud, [], lead_frames=20, tail=4)
    assert p.n == 100, "the stop would fall inside the leading pad"
    assert speech_stop(np.full(50, -9.0), 0.0, 4) == 50  # no loud frame at all
    assert speech_stop(np.full(50, 5.0), 0.0, 4) == 50  # loud to the end


@given(
    n=st.integers(2, 400),
    tail=st.integers(0, 30),
    seed=st.integers(0, 2**16),
    budget=st.one_of(st.none(), st.integers(1, 300)),
)
def test_windows_end_at_the_speech_stop_and_never_after_the_sentence(
    n: int, tail: int, seed: int, budget: int | None
) -> None:
    energy = np.random.default_rng(seed).normal(size=n)
    p = WindowPlanner(n, energy, [], lead_frames=min(5, n - 1), tail=tail)
    ws = all_windows(p, budget)
    assert ws[0].start == 0 and ws[-1].end == p.n <= n and ws[-1].last
    assert all(w.ctx_end <= n for w in ws)
    quiet = p.quiet
    loud = [i for i in range(n) if energy[i] > quiet]
    if loud and loud[-1] + 1 + tail > p.lead:  # every frame of speech energy is decoded
        assert p.n == min(n, loud[-1] + 1 + tail)


def test_the_first_part_of_a_shared_first_window_ends_where_it_is_told() -> None:
    """A gang's first part (``first_by``) never ends later than asked, even with a pause
    just after, and a pause before it within reach is not taken either: it alone
    delays the first audio, and the plan counted its frames."""
    n = 200
    energy = np.ones(n)
    energy[[17, 20, 23]] = 0.0  # pauses around the wanted end
    for lead, skip, at in ((10, 4, 19), (10, 4, 21), (13, 7, 15)):
        p = WindowPlanner(
            n,
            energy,
            [17, 20, 23],
            lead_frames=lead,
            first_frames=(4, 8),
            search=2,
            skip=skip,
            cut_anywhere=True,
            ramp=8,
        )
        w = p.next(first_at=at, first_by=at, rest=p.ramp)
        assert w is not None and (w.start, w.end) == (skip, at)
        free = WindowPlanner(
            n, energy, [17, 20, 23], lead_frames=lead, first_frames=(4, 8), search=2, skip=skip
        )
        v = free.next(first_at=at, rest=8)
        assert v is not None and v.end >= at  # without it the cut may move later


def test_the_kept_audio_starts_a_little_before_the_first_frame_of_speech_energy() -> None:
    shape = FIXED_STATS_SHAPE
    assert shape.lead is not None and shape.onset is not None
    energy = np.full(120, -9.0)
    energy[20:] = 8.0  # the pad ends at 22; speech energy from frame 20
    assert first_speech(energy) == 20
    assert shape.skip(22, first_speech(energy)) == 20 - shape.onset
    energy[16:20] = 8.0  # an earlier onset: decoded from earlier, past the pad's fixed lead
    assert shape.skip(22, first_speech(energy)) == 16 - shape.onset
    energy[:] = -9.0
    energy[40:] = 8.0  # speech energy only after the pad: still the pad's last frames
    assert shape.skip(22, first_speech(energy)) == 22 - shape.lead
    assert first_speech(np.zeros(50)) is None
    assert shape.skip(22, None) == 0, "no speech energy: all of the pad is decoded"
    assert OWN_STATS_SHAPE.skip(22, 20) == 0, "own statistics: the pad is decoded whole"
