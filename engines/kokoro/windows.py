"""Decoder windows: where one sentence's aligned frames are cut for streamed decoding.

Rule 1: pure functions of frame counts, energies and word-boundary frames; no
model, no clocks. The synthesiser asks for each window with a frame budget
that it derives from how much audio is queued ahead of playback.
Rule 2: a window is decoded with ``context`` frames on each side (discarded)
and joined to its neighbour with a short equal-gain crossfade centred on the
cut, and cuts fall in a pause (a word-boundary frame whose energy is nearer the
sentence's silence than its speech) when one lies within ``search`` frames of the
allowed span, else on a word boundary (frames of a space or punctuation token),
at the quietest such frame. The two windows' renderings of the
crossfade differ (each window's instance norms take their own statistics): in a
pause the difference is silence; between two words spoken together it can
change a word (measured: a first cut in "your order" was heard as "you would"). That keeps the
generator's window-local instance-norm statistics from changing a word in the
middle (measured: cuts at the quietest frame anywhere split "doctor" at its
closure and the recogniser heard "dog do"; at word boundaries it did not).

With the voice's instance-norm statistics (``norms``, the engine's default) the two
renderings agree but for the decoder's own noise, and ``FIXED_STATS_SHAPE`` below
applies: little context, a short first window, cuts that need no pause, and the
leading pad's silent start and the silence after the last word left undecoded
(``tail``: the last window ends a few frames after the last frame of speech energy;
the synthesiser checks its audio and decodes to the end when that was wrong); the
figures in this docstring are
``OWN_STATS_SHAPE``'s.

The first window is short (``first_frames``: about 0.3-0.55 s of speech after
the leading pad) so the first audio leaves early; later windows follow the
budget, never below ``min_frames`` (a window costs ``2 * context`` extra frames,
so small ones waste compute; ``ramp`` lowers that bound for windows that decode
like the sentence, so that the first one can be short) and never above
``max_frames`` (a long window holds a synthesis worker that other calls may
need), and the rest of the sentence is one window when less than ``min_frames``
would be left.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FRAME_SAMPLES = 600  # 25 ms at 24 kHz: one aligned frame of the decoder
FRAMES_PER_S = 40
CONTEXT_FRAMES = 10  # decoded on each side of a window and discarded
CROSSFADE_SAMPLES = 480  # 20 ms equal-gain crossfade centred on each cut
FIRST_FRAMES = (12, 22)  # first window: cut this many frames after the leading pad
MIN_FRAMES = 48  # later windows: at least 1.2 s
MAX_FRAMES = 200  # and at most 5 s
SEARCH_FRAMES = 12  # a cut may move this far from the budget to reach a boundary
#: With the voice's instance-norm statistics (``norms``) a window decodes as the whole
#: sentence does, given the generator's receptive field: 2 frames of context measured
#: as good as 10 (0.76 vs 0.74 dB from the whole decode; 0 frames: 4.2 dB), so windows
#: need little context, and the first one can be short without costing words.
FIXED_CONTEXT_FRAMES = 2
FIXED_FIRST_FRAMES = (4, 8)
FIXED_MIN_FRAMES = 24
#: ... except while the budget is small (the first windows after the first): a window
#: then keeps at least this many, so that the first window can be short
FIXED_RAMP_FRAMES = 12
#: ... and a cut needs no pause: it may move only this far to reach one
FIXED_SEARCH_FRAMES = 2
#: ... and the silent start of the leading pad need not be decoded: the model renders
#: nothing in its first ~8 frames and starts the first sound 0.2-5 frames before the pad
#: ends (README "Edge silence"), never more than 0.6 frames before the first frame whose
#: predicted energy is speech (140 sentences, 5 voices), so the kept audio starts this
#: many frames before that frame (``first_speech``) ...
FIXED_ONSET_FRAMES = 2
#: ... and at least this many before the pad ends (a fixed 6 before the pad ends cut
#: nothing either, but decoded up to 4 silent frames more for the first audio)
FIXED_LEAD_FRAMES = 3
#: ... and the trailing silence need not be decoded either: decoding stops this many
#: frames after the last frame whose predicted energy is speech (nearer the sentence's
#: median than its silence). Measured over 105 sentences of 80-360 frames, 5 voices:
#: the audible speech (the trimmer's -42 dB) ended at most 0.4 frames after that
#: frame, and the model's own trailing silence is 20-31 frames (0.5-0.8 s)
FIXED_TAIL_FRAMES = 4


@dataclass(frozen=True)
class WindowShape:
    """Context frames, first-window range and smallest later window of a sentence."""

    context: int
    first: tuple[int, int]
    min_frames: int
    search: int = SEARCH_FRAMES
    #: frames of the leading pad decoded before it ends (None: all of it) ...
    lead: int | None = None
    #: ... at least, and this many before the first frame of speech energy (None: no more)
    onset: int | None = None
    #: the first window may end on any frame (windows that decode like the sentence);
    #: else only at its earliest end or a word boundary
    cut_anywhere: bool = False
    #: smallest window while the budget is small (None: ``min_frames``); the last
    #: window still takes the rest when less than ``min_frames`` would be left
    ramp: int | None = None
    #: frames decoded after the last frame of speech energy (None: to the end)
    tail: int | None = None

    def skip(self, lead_frames: int, speech_from: int | None = None) -> int:
        """Frames at the sentence's start that are never decoded: the leading pad's
        (``lead_frames``) but ``lead``, and none from ``onset`` frames before its first
        frame of speech energy (``speech_from``, ``first_speech``) on."""
        if self.lead is None:
            return 0
        skip = lead_frames - self.lead
        if self.onset is not None:  # (no speech energy: all of the pad)
            skip = min(skip, (speech_from or 0) - self.onset)
        return max(0, skip)


#: Windows whose instance norms take their own statistics, and with the voice's.
OWN_STATS_SHAPE = WindowShape(CONTEXT_FRAMES, FIRST_FRAMES, MIN_FRAMES)
FIXED_STATS_SHAPE = WindowShape(
    FIXED_CONTEXT_FRAMES,
    FIXED_FIRST_FRAMES,
    FIXED_MIN_FRAMES,
    FIXED_SEARCH_FRAMES,
    FIXED_LEAD_FRAMES,
    FIXED_ONSET_FRAMES,
    cut_anywhere=True,
    ramp=FIXED_RAMP_FRAMES,
    tail=FIXED_TAIL_FRAMES,
)


def ramp_frames(ramp: int | None, min_frames: int) -> int:
    """The smallest window a ``ramp`` lets a planner keep (None: ``min_frames``; never
    more than ``min_frames`` nor less than 1): ``WindowPlanner`` and ``pacing.simulate``."""
    return min_frames if ramp is None else max(1, min(ramp, min_frames))


@dataclass(frozen=True)
class Window:
    """Frames ``[start, end)`` are kept; ``[ctx_start, ctx_end)`` are decoded."""

    index: int
    start: int
    end: int
    ctx_start: int
    ctx_end: int
    last: bool

    @property
    def frames(self) -> int:
        return self.end - self.start

    @property
    def decoded_frames(self) -> int:
        return self.ctx_end - self.ctx_start


def boundary_frames(
    durations: Sequence[int] | npt.NDArray[np.int64],
    tokens: Sequence[int],
    boundary_ids: Iterable[int],
) -> list[int]:
    """Frames that lie inside a space or punctuation token of ``tokens``.

    ``durations`` are frames per position of ``[pad, *tokens, pad]``. A cut at
    frame ``f`` ends one window before ``f`` and starts the next at ``f``.
    """
    ids = frozenset(boundary_ids)
    d = np.asarray(durations, dtype=np.int64).reshape(-1)
    if len(d) != len(tokens) + 2:
        raise ValueError(f"{len(d)} durations for {len(tokens)} tokens (+2 pads)")
    starts = np.concatenate([[0], np.cumsum(np.maximum(d, 0))])
    out: list[int] = []
    for i, tok in enumerate(tokens):
        if tok in ids:
            a, b = int(starts[i + 1]), int(starts[i + 2])
            out.extend(range(a, b))
    return out


def quiet_level(energy: npt.NDArray[np.float64]) -> float:
    """The energy under which a frame is a pause: nearer the sentence's silence (its
    quietest frame) than its speech (the median frame)."""
    finite = energy[np.isfinite(energy)]
    return float((finite.min() + np.median(finite)) / 2) if len(finite) else -np.inf


def first_speech(energy: Sequence[float] | npt.NDArray[np.float32]) -> int | None:
    """The first frame whose ``energy`` is speech (above ``quiet_level``); None if none."""
    e = np.asarray(energy, dtype=np.float64).reshape(-1)
    loud = np.nonzero(np.isfinite(e) & (e > quiet_level(e)))[0]
    return int(loud[0]) if loud.size else None


def speech_stop(energy: npt.NDArray[np.float64], quiet: float, tail: int) -> int:
    """Where decoding may stop: ``tail`` frames after the last frame whose ``energy``
    is above ``quiet`` (the sentence's end when none is, or when that is further)."""
    n = len(energy)
    loud = np.nonzero(np.isfinite(energy) & (energy > quiet))[0]
    if loud.size == 0:
        return n
    return max(1, min(n, int(loud[-1]) + 1 + tail))


class WindowPlanner:
    """Hands out consecutive decoder windows of one sentence; see the module docstring."""

    def __init__(
        self,
        n_frames: int,
        energy: Sequence[float] | npt.NDArray[np.float32],
        boundaries: Iterable[int],
        *,
        lead_frames: int = 0,
        first_frames: tuple[int, int] = FIRST_FRAMES,
        min_frames: int = MIN_FRAMES,
        max_frames: int = MAX_FRAMES,
        context: int = CONTEXT_FRAMES,
        search: int = SEARCH_FRAMES,
        skip: int = 0,
        cut_anywhere: bool = False,
        ramp: int | None = None,
        tail: int | None = None,
    ) -> None:
        if n_frames < 1:
            raise ValueError(f"a sentence has at least one frame, got {n_frames}")
        if not 1 <= first_frames[0] <= first_frames[1]:
            raise ValueError(f"bad first window range {first_frames}")
        if not 1 <= min_frames <= max_frames:
            raise ValueError(f"need 1 <= min_frames ({min_frames}) <= max_frames ({max_frames})")
        if context < 0 or search < 0 or (tail is not None and tail < 0):
            raise ValueError("context, search and tail must be >= 0")
        #: the sentence's frames; ``n``: those decoded (``tail``: its trailing silence
        #: is not), so the windows end there and the last one's context may go beyond
        self.total = n_frames
        self.n = n_frames
        e = np.asarray(energy, dtype=np.float64).reshape(-1)
        if len(e) < n_frames:
            e = np.concatenate([e, np.full(n_frames - len(e), np.inf)])
        self.energy = e[:n_frames]
        self.boundaries = sorted({b for b in boundaries if 0 < b < n_frames})
        self.quiet = quiet_level(self.energy)
        self.lead = max(0, min(lead_frames, n_frames))
        if tail is not None:  # (no speech after the leading pad: decode it all)
            stop = speech_stop(self.energy, self.quiet, tail)
            self.n = stop if stop > self.lead else n_frames
        self.first_frames = first_frames
        self.min_frames = min_frames
        self.max_frames = max_frames
        self.context = context
        self.search = search
        if not 0 <= skip <= self.lead:
            raise ValueError(f"may skip 0..{self.lead} frames of the leading pad, not {skip}")
        self.pos = skip  # frames before ``skip`` are never decoded (silent leading pad)
        self.count = 0
        self.cut_anywhere = cut_anywhere
        #: a window after the first keeps at least this many frames (the last one: all
        #: the rest when less than ``min_frames`` would be left)
        self.set_ramp(ramp)

    def set_ramp(self, ramp: int | None) -> None:
        """The smallest window after the first from now on (the start planner's choice,
        ``pacing`` Rule 7); None: ``min_frames``."""
        self.ramp = ramp_frames(ramp, self.min_frames)

    @property
    def cut_tail(self) -> int:
        """Frames at the sentence's end that are not decoded (its trailing silence)."""
        return self.total - self.n

    @property
    def done(self) -> bool:
        return self.pos >= self.n

    @property
    def remaining(self) -> int:
        return self.n - self.pos

    def _cut(self, lo: int, hi: int, limits: tuple[int, int] | None = None) -> int:
        """The cut near ``[lo, hi]``: a pause (a word-boundary frame nearer silence than
        speech) within ``search`` frames of it (and within ``limits``, the window's
        smallest and largest allowed end), else the quietest word-boundary frame in
        it, else the quietest frame in it."""
        lo = max(lo, self.pos + 1)
        hi = min(hi, self.n - 1)
        if hi < lo:
            return min(max(lo, self.pos + 1), self.n)
        low, high = limits if limits is not None else (lo, hi)
        low = max(low, lo - self.search, self.pos + 1)
        high = min(high, hi + self.search, self.n - 1)
        near = [b for b in self.boundaries if low <= b <= high and self.energy[b] < self.quiet]
        if near:  # a pause: the quietest one (ties: the earliest)
            return min(near, key=lambda b: (self.energy[b], b))
        cands = [b for b in self.boundaries if lo <= b <= hi]
        if cands:
            return min(cands, key=lambda b: (self.energy[b], b))
        span = self.energy[lo : hi + 1]
        return lo + int(np.argmin(span))

    def _emit(self, end: int) -> Window:
        start = self.pos
        last = end >= self.n
        end = min(end, self.n)
        w = Window(
            index=self.count,
            start=start,
            end=end,
            ctx_start=max(0, start - self.context),
            ctx_end=min(self.total, end + self.context),
            last=last,
        )
        self.pos = end
        self.count += 1
        return w

    def past_end(self) -> Window:
        """The frames after the decoded end to the sentence's end (its trailing silence,
        where the last window still speaks after all), as one window more: its context
        before the cut as any window has, and the last."""
        w = Window(
            index=self.count,
            start=self.n,
            end=self.total,
            ctx_start=max(0, self.n - self.context),
            ctx_end=self.total,
            last=True,
        )
        self.count += 1
        return w

    def first_candidates(self) -> list[int]:
        """Ends the first window may have, earliest first (the start planner's choices):
        the default range's earliest end, then every word boundary after it; with
        ``cut_anywhere`` every frame after it, sparser with distance (1 frame apart
        for the first 8, 2 to 32 frames, then 4). Never past the frames decoded: a
        sentence shorter than the first window has the one end, its last frame."""
        lo = self.lead + self.first_frames[0]
        if lo >= self.n:  # a first window longer than the sentence: all of it
            return [self.n]
        if not self.cut_anywhere:
            return [lo, *(b for b in self.boundaries if lo < b < self.n)]
        ends = [*range(lo, lo + 8), *range(lo + 8, lo + 32, 2), *range(lo + 32, self.n, 4)]
        return [e for e in ends if e < self.n]

    def next(
        self,
        budget: int | None = None,
        *,
        first_at: int | None = None,
        first_by: int | None = None,
        rest: int | None = None,
    ) -> Window | None:
        """The next window; ``budget`` frames of audio wanted (None: as large as allowed).

        ``first_at``: the first window ends no earlier than this frame (the start
        planner's choice on a slow CPU; default: the ``first_frames`` range);
        ``first_by``: nor later than this one (the first part of a first window that a
        gang shares: it alone delays the first audio).
        ``rest``: the smallest window that may be left after this one (default
        ``min_frames``; at least ``ramp``): windows decoded at once, each on its own
        core, are better even than one of them taking the rest."""
        if self.done:
            return None
        least = self.min_frames if rest is None else max(self.ramp, min(rest, self.min_frames))
        if self.count == 0:
            lo, hi = self.lead + self.first_frames[0], self.lead + self.first_frames[1]
            if first_at is not None and first_at > lo:
                lo, hi = first_at, first_at + (hi - lo)
            if first_by is not None:
                hi = max(self.pos + 1, first_by)
                lo = min(lo, hi)
            if self.n - lo < least:  # short sentence: the first window is all of it
                return self._emit(self.n)
            latest = self.n - least if first_by is None else min(hi, self.n - least)
            return self._emit(self._cut(lo, hi, (lo, latest)))
        want = self.max_frames if budget is None else budget
        want = max(self.ramp, min(want, self.max_frames))
        if self.remaining - want < least:
            if self.remaining <= self.max_frames:
                return self._emit(self.n)
            want = self.remaining - least
        lo = self.pos + max(self.ramp, want - self.search)
        hi = self.pos + min(self.max_frames, want + self.search)
        hi = min(hi, self.n - least)
        limits = (
            self.pos + self.ramp,
            min(self.pos + self.max_frames, self.n - least),
        )
        return self._emit(self._cut(lo, hi, limits))


def window_piece(audio: npt.NDArray[np.float32], w: Window, fade: int) -> npt.NDArray[np.float32]:
    """The samples of ``w`` to hand to the joiner, from its decoded audio.

    Keeps frames ``[start, end)`` plus ``fade // 2`` samples on each inner side,
    so that consecutive pieces overlap by exactly ``fade`` samples around the cut.
    """
    half = fade // 2
    base = w.ctx_start * FRAME_SAMPLES
    lo = w.start * FRAME_SAMPLES - (half if w.start > 0 else 0)
    hi = w.end * FRAME_SAMPLES + (half if not w.last else 0)
    lo = max(lo, base)
    hi = min(hi, base + len(audio))
    return audio[lo - base : hi - base]
