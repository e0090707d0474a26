"""Pacing of one sentence's decoder windows: how large each window is, and when speech starts.

Rule 1: pure arithmetic on frame counts and measured speeds; no model, no clocks,
no threads. The synthesiser feeds it the decode speed it measured and the audio
queued ahead of playback (the runtime's playback clock); ``synth`` and the
start planner below share ``next_window_frames``, so the plan simulates exactly
the rule the engine then follows.
Rule 2: a window is sized so that it is decoded by the time ``HEADROOM`` of the
audio queued ahead (less ``JITTER_S``) has played; every window costs
``2 * context`` frames extra.
Rule 3: a ``gang`` of windows is decoded at once, one per core (``Pace.gang``): each
is sized by that rule at the speed of one core while the others are busy too, and
the next gang starts when all are ready; when the rest of the sentence fits in one
gang it is shared evenly between its windows (less wall time than one full window
and a short one). A first window decoded by a gang is shared too
(``first_gang_frames``), its first part the smallest: the first audio leaves as soon
as that part is decoded, and the others must be ready before its audio has played
(``simulate``: ``pace`` with a ``gang``).

Rule 4: the start planner's margin follows the machine: ``SAFETY`` times the measured
speed where decodes run as estimated, more while they run slower than estimated
(``Surprise``): on a host whose speed swings by a third within seconds, a sentence
planned at 1.2 times the last speed stuttered when the next seconds ran slower still.

Rule 5: the frame stage's run over the whole sentence (``synth``: the windows after
the first take the sentence's own statistics there) waits until the audio queued
ahead pays for it: the next window must still keep ``least`` frames by Rule 2 after
it (``frame_stage_fits``), and the next window is sized with the queue less that
estimate (``frame_stage_s``: the plan follows the speed it is given, measured or
pinned, not the clock of a run it planned); on a CPU near real time it may never
come, and the windows keep running the frame stage on their own frames.

Rule 6: the cores' share rule (``synth``: while the utterances in progress need more
cores than there are, each counts on its share of them, and a start is planned late)
holds over the speech still to come, not at one instant: it is waived while the speech
every utterance in progress must have decoded by the time this one's has played fits
in ``HORIZON_LOAD`` of the cores until then (``horizon_keeps_up``: another's audio
queued ahead of its listener, and its speech past that time, are not due). Three
calls on two cores at a speed where three need 2.0 cores planned starts at 1.6-1.8 s
(first audio 1.2-1.3 s) while the two others were half done, or 1.9-2.4 s ahead of
their listeners.

Rule 7: an utterance alone may start with smaller windows (``plan_ramp``): the windows
right after the first keep at least the shape's ``ramp`` frames, and on a CPU near
real time the first window must then hold the audio that covers a ramp window's decode
(two windows at once, each at one core's crowded speed, 4 frames of context each). With
a smaller ramp (down to ``RAMP_FLOOR``) for the first ``START_RAMP_STEPS`` steps after
it, it holds less, and the first audio leaves sooner, for a few more context frames
decoded: the start planner takes the ramp whose plan plays through with the earliest
first audio, and only for an utterance with no other in progress (whose cores would
pay for that context). After those steps the shape's ramp holds again.

Rule 8: the cores come back. A start planned while other utterances are in progress
counts on one core's crowded speed for its windows, and on a CPU near real time that
needs a long first window (26-36 frames, first audio 450-830 ms, beside a second call
on two cores). But those utterances are decoded well before they have played: once the
speech they have left is decoded (``freed_at``, compute s from the start, each on a core
of its own), this one's windows run as when alone (``freed``: a gang, one per core), and
the simulation says so; the engine's windows then take those cores as they come free.

Rule 9: a start beside other utterances may take a core of theirs for its first window
(the runtime pool's Rule 6: a start claims the cores their units hold, and their later
units leave them to it while their listeners have audio to spare). Its first window is
then a gang all the same, one part on the core it was granted and the others from when
a core is expected free (``lag``), and the others' speech left is decoded from the end
of its first part on (``freed_after_first``); the windows after the first are paced as
any start's beside others (one core, Rules 6 and 8).

Rule 10: a first gang's split follows its plan. Its first part is short of an even
share by the frame stage's run for the windows after it (``skew``, Rule 3), which its
thread runs once that part is decoded, so that the gang's threads end together
(``simulate``: that run is ``head_busy`` on the first part's thread). But a short first
part plays out soon, and where the simulation then finds no start but the whole
sentence as one gang (about 1.5-2 s of speech on a CPU near real time: first audio
planned at 550-930 ms where a split closer to even starts at 400-600), the planner
tries that split with less skew (half, none) and takes the soonest start
(``plan_first_gang``).

Why plan the start. On a fast CPU the first window can be short (about 0.3-0.55 s
of speech) and each later window grows with the audio queued ahead. On a slow
CPU (decode speed near or above real time once the context frames are counted)
that greedy rule shrinks into small windows whose context overhead makes it
slower still, and the listener hears a gap in every sentence. So after the
prosody pass the start planner simulates the greedy rule for the whole sentence
with the measured speed (times a safety factor) and picks the smallest first
window for which no gap is predicted: on a slow CPU the sentence starts a
little later and then plays through; on a fast one nothing changes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from engines.kokoro.windows import FRAMES_PER_S, ramp_frames

#: Plan the next window to be ready when this share of the queued audio, less
#: ``JITTER_S``, has played. Not much lower: on a CPU near real time a lower share
#: shrinks every window below the last, and the context frames then cost more than
#: the windows win.
HEADROOM = 0.85
JITTER_S = 0.1  # scheduling and measurement noise kept in reserve (s)
#: The start planner assumes decoding this much slower than measured, at least ...
SAFETY = 1.2
#: ... and more where the machine's speed varies (a shared cloud host, a noisy
#: neighbour): 1 + this many times the recent decodes' mean excess over the estimate they
#: ran against (``Surprise``; on a steady box 0.02-0.08, so ``SAFETY`` holds) ...
SURPRISE_WEIGHT = 2.0
#: ... up to this much (beyond it the start would come too late to matter).
MAX_SAFETY = 2.0
#: Weight of the newest decode in ``Surprise``: a burst of slow decodes raises the
#: margin within a window or two and it decays over about ten steady ones.
SURPRISE_ALPHA = 0.2
#: While other utterances are in progress, one window's decode is kept to about this
#: long, so the scheduler can interleave other calls' windows (a unit runs to its end,
#: unless the runtime's pool recalls it for a new call's start, which it does only
#: while its listener has audio to spare); ``synth`` keeps windows after the first to it
#: too while another call may start.
BUSY_WINDOW_S = 0.4
#: The frame stage run over a whole sentence costs about this share of decoding its
#: frames, plus ``FRAME_STAGE_FIXED`` decoded frames' worth (measured, int8, one thread,
#: AMD EPYC: 8 ms plus 0.45 ms a frame, against 10.8 ms a decoded frame; rounded up).
FRAME_STAGE_SHARE = 0.06
FRAME_STAGE_FIXED = 2.0


#: Rule 7: the smallest ramp the start planner may choose, and its step down from the
#: shape's (at 1.0 compute s per audio s on each of two cores, a start ramp of 8 frames
#: against 12 moved the first part's decode from 15 to 13 frames and decoded 3 % more
#: frames over a 5.6 s sentence; below 8 the context is a third of each window)
RAMP_FLOOR = 8
RAMP_STEP = 2
#: ... for this many steps after the first window (a gang, or a window decoded alone),
#: then the shape's: windows of 8-10 frames decode 40-50 % more than they keep, and an
#: utterance that kept to them on a CPU slowing down under it never caught up (6
#: underruns, 390 ms, in a 5.6 s sentence at 1.3 compute s per audio s on each core)
START_RAMP_STEPS = 2

#: Rule 6: the share rule is waived while the speech left of the utterances in progress
#: needs at most this share of the cores until this one's has played (a unit runs to
#: its end, bar a recall for a new call's start, so the cores are never all usable).
HORIZON_LOAD = 0.9


@dataclass(frozen=True)
class Pace:
    """Decode speed of this utterance's windows: compute seconds per decoded frame, for
    the share of the machine it can count on, whether other calls share it, and how
    many windows are decoded at once (``gang``, one per core: ``frame_s`` is then one
    core's speed while all of them decode)."""

    frame_s: float
    shared: bool = False
    gang: int = 1

    @classmethod
    def from_rtf(cls, rtf: float, shared: bool = False, gang: int = 1) -> Pace:
        """From compute seconds per decoded audio second."""
        return cls(max(rtf, 1e-4) / FRAMES_PER_S, shared, max(1, gang))

    def decode_s(self, frames: float) -> float:
        return frames * self.frame_s


class Surprise:
    """How much slower than their estimate the recent decodes ran: an exponential moving
    average (from 0) of ``max(0, actual / estimate - 1)`` per decode; one faster than
    its estimate adds 0. ``safety`` is the start planner's margin from it (Rule 4)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def add(self, estimate: float, actual: float) -> None:
        """One decode that ran at ``actual`` compute s per audio s where ``estimate``
        was expected (a nonpositive estimate or a nonfinite or negative actual is
        ignored)."""
        if not (estimate > 0 and math.isfinite(estimate)) or not (
            actual >= 0 and math.isfinite(actual)
        ):
            return
        excess = max(0.0, actual / estimate - 1.0)
        self.value = (1 - SURPRISE_ALPHA) * self.value + SURPRISE_ALPHA * excess

    def safety(self) -> float:
        """``SAFETY``, or more while decodes run slower than estimated, up to ``MAX_SAFETY``."""
        return min(MAX_SAFETY, max(SAFETY, 1.0 + SURPRISE_WEIGHT * self.value))


def busy_window_frames(pace: Pace, context: int) -> float:
    """Frames a window keeps whose decode, with its ``context`` on each side, takes about
    ``BUSY_WINDOW_S`` at ``pace`` (a unit another call's may have to wait for)."""
    return BUSY_WINDOW_S / pace.frame_s - 2 * context


def next_window_frames(
    ahead_s: float,
    pace: Pace,
    context: int,
    remaining: int | None = None,
    least: int | None = None,
) -> int:
    """Frames the next window may keep so that it is ready before ``HEADROOM`` of the
    ``ahead_s`` queued audio, less ``JITTER_S``, has played (may be <= 0: the caller
    clamps it). With a ``gang``, each of its windows (Rule 3): no more than an even
    share of the ``remaining`` frames.

    ``least``: the smallest window the planner leaves behind (``WindowPlanner.next``
    takes all the ``remaining`` frames rather than leave fewer). A window decoded alone
    takes that whole rest only when it is ready before ``HEADROOM`` of the queued audio
    has played (the ``JITTER_S`` reserve may go to it); else it leaves ``least`` frames
    for a last window (a rest of 53 frames taken whole by a 35-frame budget stuttered
    for 0.15-0.29 s on a CPU near real time)."""
    frames = (ahead_s * HEADROOM - JITTER_S) / pace.frame_s - 2 * context
    if pace.shared:
        frames = min(frames, busy_window_frames(pace, context))
    if pace.gang > 1 and remaining is not None:
        frames = min(frames, math.ceil(remaining / pace.gang))
    elif remaining is not None and least is not None and frames < remaining < frames + least:
        whole_rest_by = ahead_s * HEADROOM / pace.frame_s - 2 * context
        if remaining > whole_rest_by:
            frames = remaining - least
    return int(frames)


def horizon_keeps_up(
    left_s: float,
    others: Sequence[tuple[float, float]],
    cost: float,
    cpus: int,
    ahead_s: float = 0.0,
) -> bool:
    """Rule 6: whether the utterances in progress all keep up until this one's speech
    has played (its ``left_s`` seconds still to decode, after the ``ahead_s`` queued):
    this one's speech left and what each of the ``others`` (speech left to decode,
    ``math.inf`` where unknown; audio queued ahead of its listener) plays by then
    beyond its queue, at ``cost`` core seconds per second of speech, need at most
    ``HORIZON_LOAD`` of the ``cpus`` cores until then. False when this one's length is
    unknown."""
    if not (left_s > 0 and math.isfinite(left_s)) or cpus < 1 or not cost > 0:
        return False
    horizon = max(0.0, ahead_s) + left_s
    due = left_s
    for left, queued in others:
        due += max(0.0, min(left, horizon - max(0.0, queued)))
    return due * cost <= HORIZON_LOAD * cpus * horizon


def frame_stage_s(pace: Pace, n_frames: int) -> float:
    """The frame stage's run over a whole sentence of ``n_frames``, estimated at ``pace``
    (compute s): what the windows after it plan it to take (Rule 5)."""
    return pace.decode_s(FRAME_STAGE_SHARE * n_frames + FRAME_STAGE_FIXED)


def frame_stage_fits(
    ahead_s: float, pace: Pace, n_frames: int, context: int, remaining: int, least: int
) -> bool:
    """Whether the frame stage can run over the whole sentence of ``n_frames`` now, with
    ``ahead_s`` of audio queued, and the next window still keep ``least`` frames (the
    ``remaining`` ones if fewer) by Rule 2 (Rule 5)."""
    cost = frame_stage_s(pace, n_frames)
    return next_window_frames(ahead_s - cost, pace, context) >= min(least, remaining)


def first_gang_frames(span: int, gang: int, skew: int = 0) -> list[int]:
    """The frames of each window of a first window of ``span`` frames decoded by a
    ``gang`` (Rule 3): shared evenly, the first part never the larger (it alone delays
    the first audio), at most one part per frame. ``skew``: the first part's share is
    of ``span - skew`` frames, the others take the rest (the thread that decodes the
    first part then works that long on something else: the next windows' frame stage,
    synth ``_Prefetch``)."""
    parts = max(1, min(gang, span))
    head = span if parts == 1 else max(1, (span - max(0, skew)) // parts)
    rest = span - head
    out = [head]
    for k in range(parts - 1, 0, -1):
        share = math.ceil(rest / k)
        out.append(share)
        rest -= share
    return out


@dataclass(frozen=True)
class Forecast:
    """What the simulation of one sentence's windows predicts."""

    start_s: float  # compute before the first audio (after the prosody pass)
    gaps: int  # windows predicted to arrive after the audio before them has played
    gap_s: float  # their total length
    windows: int
    decoded_frames: int
    inside: int = 0  # of ``gaps``, those after the sentence's first audio (a stutter)
    ready_s: float = 0.0  # compute until the whole first window (every part) is decoded


def simulate(
    n_frames: int,
    first_end: int,
    *,
    pace: Pace,
    context: int,
    min_frames: int,
    max_frames: int,
    lead_skip: int = 0,
    ahead_s: float | None = None,
    decode_from: int = 0,
    ramp: int | None = None,
    later: Pace | None = None,
    skew: int = 0,
    start_ramp: int | None = None,
    freed: Pace | None = None,
    freed_at: float = math.inf,
    lag: float = 0.0,
    freed_after_first: bool = False,
    head_busy: float = 0.0,
) -> Forecast:
    """Simulate the engine's window rule over a sentence of ``n_frames``.

    ``first_end``: where the first window ends; ``lead_skip``: frames at the start that
    are not played (the trimmed leading pad); ``decode_from``: where the first window
    starts (frames before it are never decoded); ``ramp``: the smallest window after the
    first (``WindowPlanner``; None: ``min_frames``); ``ahead_s``: audio already queued
    ahead of the listener when the first window starts decoding (None: the listener
    waits for this sentence, so its start is not a gap); ``pace``: the first window's
    speed, ``later`` the others' (default: the same; with a ``gang``, Rule 3, its
    first window shared by ``first_gang_frames`` with ``skew``); ``start_ramp``: the
    smallest window of the first ``START_RAMP_STEPS`` steps after the first window
    instead of ``ramp`` (Rule 7; None: ``ramp``); ``freed``: the speed of the steps
    that begin from ``freed_at`` s on (Rule 8: the cores the others held come back;
    with ``freed_after_first``, s from the end of the first part's decode: Rule 9);
    ``lag``: s after the first window's start at which a gang's parts after its first
    begin (Rule 9: the core they take comes free then); ``head_busy``: compute s the
    first part's thread works after it before the gang is done (Rule 10: the frame
    stage's run for the windows after it; none where the first window ends the
    sentence).
    """
    step = pace if later is None else later
    first_end = max(1, min(first_end, n_frames))
    first_decoded = min(n_frames, first_end + context) - max(0, decode_from - context)
    decoded = first_decoded
    t = t_all = pace.decode_s(decoded)
    head = first_end - decode_from  # frames of the part that comes first
    if pace.gang > 1 and first_end - decode_from > 1:
        # the first window's frames shared by a gang, decoded at once: its first part is
        # played as soon as it is ready, the others must be ready before it has played
        parts = first_gang_frames(first_end - decode_from, pace.gang, skew)
        each, lo = [], decode_from
        for frames in parts:  # each part decoded with its context (none past the edges)
            each.append(min(n_frames, lo + frames + context) - max(0, lo - context))
            lo += frames
        decoded = sum(each)
        head = parts[0]
        t = pace.decode_s(each[0])
        busy = head_busy if first_end < n_frames else 0.0
        t_all = max(t + busy, lag + pace.decode_s(max(each[1:]))) if len(each) > 1 else t
    gaps, gap_s = 0, 0.0
    if ahead_s is None:
        play_end = t  # the listener starts with the first window
    else:
        play_end = ahead_s
        if t > play_end:
            gaps, gap_s, play_end = 1, t - play_end, t
    t_first = t
    if freed_after_first:
        freed_at += t_first
    start_gaps = gaps
    # the first part's audio (less the trimmed leading pad), then the rest of the window
    heard = max(0, decode_from + head - lead_skip)
    play_end += heard / FRAMES_PER_S
    if t_all > play_end:
        gaps += 1
        gap_s += t_all - play_end
        play_end = t_all
    t = ready = t_all
    play_end += (max(0, first_end - lead_skip) - heard) / FRAMES_PER_S
    pos, windows = first_end, 1
    after = ramp_frames(ramp, min_frames)  # from the ``START_RAMP_STEPS``-th step on
    smallest = after if start_ramp is None else ramp_frames(start_ramp, min_frames)
    steps = 0
    while pos < n_frames:
        if freed is not None and t >= freed_at:
            step = freed
        per = next_window_frames(play_end - t, step, context, n_frames - pos, min_frames)
        slowest = 0  # the gang's windows are ready when its largest one is
        kept = 0
        for _ in range(step.gang):
            if pos >= n_frames:
                break
            want = max(smallest, min(per, max_frames))
            remaining = n_frames - pos
            least = smallest if step.gang > 1 else min_frames  # ``WindowPlanner.next``
            if remaining - want < least:
                want = remaining if remaining <= max_frames else remaining - least
            end = pos + want
            frames = min(n_frames, end + context) - max(0, pos - context)
            slowest = max(slowest, frames)
            decoded += frames
            kept += want
            pos = end
            windows += 1
        steps += 1
        if steps >= START_RAMP_STEPS:
            smallest = after
        t += step.decode_s(slowest)
        if t > play_end:
            gaps += 1
            gap_s += t - play_end
            play_end = t
        play_end += kept / FRAMES_PER_S
    return Forecast(
        start_s=t_first,
        gaps=gaps,
        gap_s=gap_s,
        inside=gaps - start_gaps,
        windows=windows,
        decoded_frames=decoded,
        ready_s=ready,
    )


def plan_first_end(
    n_frames: int,
    candidates: Sequence[int],
    *,
    pace: Pace,
    context: int,
    min_frames: int,
    max_frames: int,
    lead_skip: int = 0,
    ahead_s: float | None = None,
    longest: int | None = None,
    decode_from: int = 0,
    ramp: int | None = None,
    later: Pace | None = None,
    safety: float = SAFETY,
    skew: int = 0,
    start_ramp: int | None = None,
    freed: Pace | None = None,
    freed_at: float = math.inf,
    lag: float = 0.0,
    freed_after_first: bool = False,
    head_busy: float = 0.0,
) -> tuple[int, Forecast]:
    """The earliest first-window end among ``candidates`` (ascending frame positions)
    for which the simulation, at ``safety`` times the measured speed (``SAFETY``, or
    ``Surprise.safety`` on a machine whose speed varies), predicts no gap;
    else the whole sentence (or ``longest`` frames when the first window may not
    exceed that). When audio is already queued and no plan is gap-free, the earliest
    plan whose only gap is before the sentence's first audio (it starts late, then
    plays through) comes before a longer first window. The gaps predicted for the
    choice come with it. ``later``: the speed of the windows after the first,
    ``skew`` the share of a gang's first window, ``start_ramp`` the smallest window
    of the steps right after it, ``freed`` the speed from ``freed_at`` on, ``lag`` and
    ``freed_after_first`` (Rule 9) and ``head_busy`` (Rule 10) as in ``simulate``
    (``freed_at``, ``lag`` and ``head_busy`` too are stretched by ``safety``)."""

    def slower(p: Pace) -> Pace:
        return Pace(p.frame_s * safety, p.shared, p.gang)

    safe = slower(pace)
    safe_later = None if later is None else slower(later)
    safe_freed = None if freed is None else slower(freed)

    def run(end: int) -> Forecast:
        return simulate(
            n_frames,
            end,
            pace=safe,
            context=context,
            min_frames=min_frames,
            max_frames=max_frames,
            lead_skip=lead_skip,
            ahead_s=ahead_s,
            decode_from=decode_from,
            ramp=ramp,
            later=safe_later,
            skew=skew,
            start_ramp=start_ramp,
            freed=safe_freed,
            freed_at=freed_at * safety,
            lag=lag * safety,
            freed_after_first=freed_after_first,
            head_busy=head_busy * safety,
        )

    limit = n_frames if longest is None else min(n_frames, longest)
    late_start: tuple[int, Forecast] | None = None  # the earliest plan that only starts late
    for end in candidates:
        if end >= limit or n_frames - end < min_frames:  # else the rest is one window
            break
        fc = run(end)
        if fc.gaps == 0:
            return end, fc
        if late_start is None and fc.inside == 0:
            late_start = (end, fc)
    if late_start is not None:
        return late_start
    return limit, run(limit)


def ramp_choices(ramp: int | None) -> tuple[int | None, ...]:
    """The ramps the start planner tries for an utterance alone (Rule 7), the shape's
    first: it, then smaller by ``RAMP_STEP`` down to ``RAMP_FLOOR``; only the shape's
    where it has none (windows with their own statistics, whose context is large) or
    it is no larger than the floor."""
    if ramp is None or ramp <= RAMP_FLOOR:
        return (ramp,)
    return (ramp, *range(ramp - RAMP_STEP, RAMP_FLOOR - 1, -RAMP_STEP))


def plan_ramp(
    n_frames: int,
    candidates: Sequence[int],
    ramps: Sequence[int | None],
    **plan: Any,
) -> tuple[int, int | None, Forecast]:
    """Rule 7: ``plan_first_end`` (given the rest of its arguments in ``plan``) with each
    of ``ramps`` (the shape's first), and the one whose first audio comes soonest:
    ``(first window's end, ramp, forecast)``. A smaller ramp is taken only where its
    plan starts sooner than every larger one's with no more gaps; none is tried where
    the first plan already ends at the earliest candidate."""
    if not ramps:
        raise ValueError("no ramp to plan with")
    end, forecast = plan_first_end(n_frames, candidates, ramp=ramps[0], **plan)
    best = (end, ramps[0], forecast)
    if not candidates or end <= candidates[0]:
        return best
    for ramp in ramps[1:]:
        end, forecast = plan_first_end(n_frames, candidates, ramp=ramps[0], start_ramp=ramp, **plan)
        if forecast.gaps <= best[2].gaps and forecast.start_s < best[2].start_s:
            best = (end, ramp, forecast)
    return best


def plan_first_gang(
    n_frames: int,
    candidates: Sequence[int],
    ramps: Sequence[int | None],
    skews: Sequence[int],
    **plan: Any,
) -> tuple[int, int | None, int, Forecast]:
    """Rule 10: ``plan_ramp`` (given the rest of its arguments in ``plan``) with a first
    gang's ``skews[0]`` and, where that plan's first window takes the whole sentence (up
    to ``longest``), with each of the others too, the one whose first audio comes
    soonest with no more gaps: ``(first window's end, ramp, skew, forecast)``."""
    if not skews:
        raise ValueError("no skew to plan with")
    end, ramp, forecast = plan_ramp(n_frames, candidates, ramps, skew=skews[0], **plan)
    best = (end, ramp, skews[0], forecast)
    longest = plan.get("longest")
    limit = n_frames if longest is None else min(n_frames, longest)
    if end < limit:
        return best
    for skew in skews[1:]:
        end, ramp, forecast = plan_ramp(n_frames, candidates, ramps, skew=skew, **plan)
        if forecast.gaps <= best[3].gaps and forecast.start_s < best[3].start_s:
            best = (end, ramp, skew, forecast)
    return best
