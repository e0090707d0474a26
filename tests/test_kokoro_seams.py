"""The joins of ``KokoroSynthesizer`` itself: its output at every seam, and the context
it decoded.

These tests run the engine (the real model, the real ONNX backend) with windows
forced small, so one sentence has several joins, and record every decode call
through a wrapper around the backend (frames ``[start, end)`` and the audio it
returned). Nothing of the window pipeline is rebuilt here: the joins are found
from the recorded decode calls (the middle of the overlap of two consecutive
windows) and checked against the lengths of the pieces the engine yielded, so
the tests do not depend on how the engine sizes its windows.

- The output at a join (README "Kokoro pipeline", Seams): the step between
  samples at the cut stays within the 99th percentile of the steps inside the
  windows, or within the two windows' own steps there where the speech itself
  is that steep (a cut lands on such a sample about once in a hundred); the
  crossfade is never steeper than either window's own rendering of that span;
  and it is a crossfade: in the middle of the fade the output lies between the
  two renderings, neither one alone.
- The context: consecutive windows overlap by twice the configured context,
  except where the sentence's start or end leaves less room.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from kokoro_helpers import NORMS_WAIT_S, shared_models_dir

from engines.kokoro import windows
from engines.kokoro.backend import OnnxBackend, Prosody
from engines.kokoro.models import KOKORO_INT8_NAME
from engines.kokoro.synth import KokoroConfig, KokoroSynthesizer
from engines.kokoro.windows import CONTEXT_FRAMES, CROSSFADE_SAMPLES, FRAME_SAMPLES
from engines.runtime.playback import play_as_produced
from engines.runtime.synth import CallState, CancelToken, FloatArray

pytestmark = pytest.mark.slow

SEAM_TEXT = (
    "Your package will arrive on Thursday between nine and noon, "
    "and the driver will call you when he is close."
)
#: Small windows, so that the sentence (about 4.5 s, 180 frames) has several joins.
FIRST_WINDOW = (6, 10)
MIN_WINDOW = 16
MAX_WINDOW = 28
#: The decode speed the windows are planned for, pinned so that the cuts land on the
#: same frames on every machine (13 joins, three of them where the speech is steep).
PLANNED_RTF = 0.5
HALF = CROSSFADE_SAMPLES // 2  # the fade is centred on the cut


@dataclass(frozen=True)
class Decode:
    """One decode call of the engine: frames ``[start, end)`` of sentence ``unit``."""

    unit: int
    start: int
    end: int
    n_frames: int
    audio: FloatArray = field(repr=False)


class RecordingBackend(OnnxBackend):
    """The real ONNX backend; remembers every decode call and the audio it returned."""

    def __init__(self, model: Path) -> None:
        super().__init__(model, threads=1)
        self.decodes: list[Decode] = []
        self._units: dict[int, int] = {}

    def prosody(
        self, tokens: Sequence[int], style: FloatArray, speed: float, cancel: CancelToken
    ) -> Prosody:
        p = super().prosody(tokens, style, speed, cancel)
        # keyed by its arrays: the engine hands the windows a copy with the voice's norms
        self._units[id(p.f0)] = len(self._units)
        return p

    def decode(
        self,
        prosody: Prosody,
        start: int,
        end: int,
        style: FloatArray,
        cancel: CancelToken,
        ahead: int = 0,
    ) -> FloatArray:
        audio = super().decode(prosody, start, end, style, cancel, ahead)
        unit = self._units.get(id(prosody.f0), -1)
        self.decodes.append(Decode(unit, start, end, prosody.n_frames, audio.copy()))
        return audio


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KokoroSynthesizer]:
    models = shared_models_dir(tmp_path_factory)
    synth = KokoroSynthesizer(
        KokoroConfig(
            models_dir=models,
            prompt_cache_mb=0,
            lang="en",
            first_window=FIRST_WINDOW,
            min_window=MIN_WINDOW,
            max_window=MAX_WINDOW,
            window_context=CONTEXT_FRAMES,
            assume_rtf=PLANNED_RTF,
        ),
        backend=RecordingBackend(models / "kokoro" / KOKORO_INT8_NAME),
    )
    synth.load()
    assert synth.split
    assert synth.wait_for_voice_norms(NORMS_WAIT_S), "no measurement runs beside the test's decodes"
    yield synth
    synth.close()


@dataclass(frozen=True)
class Run:
    """One sentence through the engine: what it yielded and what it decoded."""

    pieces: list[FloatArray]
    decodes: list[Decode]
    joins: list[int]  # frame of each cut, derived from the decode calls
    end: int  # the last kept frame + 1 (the trailing silence after it is not decoded)


@pytest.fixture(scope="module")
def run(engine: KokoroSynthesizer) -> Run:
    return run_sentence(engine, SEAM_TEXT)


def run_sentence(engine: KokoroSynthesizer, text: str) -> Run:
    backend = engine._backend
    assert isinstance(backend, RecordingBackend)
    backend.decodes.clear()
    backend._units.clear()
    state = CallState(call_id=7)
    pieces = list(play_as_produced(state, lambda: engine.synthesize(text, state, CancelToken())))
    decodes = list(backend.decodes)
    assert {d.unit for d in decodes} == {0}, "the test sentence is one unit"
    assert len(decodes) >= 4, f"small windows give several joins: {decodes}"
    assert len(pieces) == len(decodes), "one piece per decoded window"
    n = decodes[0].n_frames
    # (the trailing silence after the last word is not decoded: windows.FIXED_TAIL_FRAMES)
    assert decodes[0].start == 0 and n - 40 <= decodes[-1].end <= n
    # The cut between two windows is the middle of their overlap (each window is
    # decoded with the same context on both sides of the cut, where the sentence
    # allows); the edges of the sentence shift it, handled by ``cut_of``.
    joins = [cut_of(a, b, n) for a, b in itertools.pairwise(decodes)]
    last = decodes[-1].end
    return Run(pieces, decodes, joins, last if last == n else last - CONTEXT_FRAMES)


def cut_of(a: Decode, b: Decode, n: int) -> int:
    """The cut between consecutive windows ``a`` and ``b`` (frames), from their overlap.

    With context ``c`` the cut ``j`` gives ``a.end = min(n, j + c)`` and
    ``b.start = max(0, j - c)``; a side clipped by the sentence's edge is
    recovered from the other side.
    """
    if a.end < n and b.start > 0:
        return (a.end + b.start) // 2
    if a.end < n:
        return a.end - CONTEXT_FRAMES
    return b.start + CONTEXT_FRAMES


def test_each_window_is_decoded_with_the_configured_context(
    engine: KokoroSynthesizer, run: Run
) -> None:
    check_context(engine, run)


def check_context(engine: KokoroSynthesizer, run: Run) -> None:
    n = run.decodes[0].n_frames
    c = engine.config.window_context
    assert c > 0
    full = 0
    for (a, b), j in zip(itertools.pairwise(run.decodes), run.joins, strict=True):
        assert 0 < j < n
        want_right = min(c, n - j)  # a's context after the cut
        want_left = min(c, j)  # b's context before the cut
        assert a.end - j == want_right, (a, b, j, run.decodes)
        assert j - b.start == want_left, (a, b, j, run.decodes)
        full += want_right == want_left == c
    assert full >= 2, "at least two joins with the whole context on both sides"
    # The pieces the engine yielded are the kept frames between the cuts: the
    # middle pieces exactly (the first and last are trimmed of edge silence).
    cuts = [0, *run.joins, run.end]
    for k in range(1, len(run.pieces) - 1):
        assert len(run.pieces[k]) == (cuts[k + 1] - cuts[k]) * FRAME_SAMPLES, k


def offset_of(y: FloatArray, run: Run, cuts: list[int]) -> int:
    """``off`` such that sample ``s`` of the sentence is ``y[s - off]`` (the engine trims
    the leading silence): found where ``y`` is window 1's own rendering, sample for
    sample, away from its fades."""
    d = run.decodes[1]
    lo, hi = (
        cuts[1] * FRAME_SAMPLES + CROSSFADE_SAMPLES,
        cuts[2] * FRAME_SAMPLES - CROSSFADE_SAMPLES,
    )
    assert hi - lo >= 1000, "window 1 is long enough to find it in the output"
    own = d.audio[lo - d.start * FRAME_SAMPLES : hi - d.start * FRAME_SAMPLES]
    starts = np.nonzero(np.abs(y - own[0]) <= 1e-6)[0]  # candidates for sample ``lo``
    found = [
        lo - int(i)
        for i in starts
        if i + len(own) <= len(y) and np.allclose(y[i : i + len(own)], own, rtol=0, atol=1e-6)
    ]
    assert len(found) == 1, f"window 1 appears in the output once, not {found[:5]}"
    return found[0]


def test_the_engine_output_at_every_join_is_seamless(run: Run) -> None:
    """At every join the output's sample step stays within the 99th percentile of the
    steps inside the windows (or within the windows' own steps there), the crossfade
    is never steeper than either window's own rendering of that span, and it blends
    the two renderings."""
    check_seamless(run)


def check_seamless(run: Run) -> None:
    y = np.concatenate(run.pieces)
    cuts = [0, *run.joins, run.end]

    def rendering(k: int, lo: int, hi: int) -> FloatArray:
        """Window ``k``'s own rendering of samples ``[lo, hi)`` of the sentence."""
        d = run.decodes[k]
        base = d.start * FRAME_SAMPLES
        assert base <= lo and hi <= d.end * FRAME_SAMPLES
        return d.audio[lo - base : hi - base]

    inside = np.concatenate(
        [
            np.abs(np.diff(rendering(k, cuts[k] * FRAME_SAMPLES, cuts[k + 1] * FRAME_SAMPLES)))
            for k in range(len(run.decodes))
        ]
    )
    p99 = float(np.percentile(inside, 99))
    off = offset_of(y, run, cuts)
    blended = 0
    for k, j in enumerate(run.joins):
        cut = j * FRAME_SAMPLES
        at = cut - off
        step = abs(float(y[at] - y[at - 1]))
        region = y[at - HALF : at + HALF]
        own_a = rendering(k, cut - HALF, cut + HALF)
        own_b = rendering(k + 1, cut - HALF, cut + HALF)
        # where the speech itself is steeper than p99 at the cut, so are the renderings
        steep = max(abs(float(np.diff(own[HALF - 1 : HALF + 1])[0])) for own in (own_a, own_b))
        assert step <= max(p99, steep * 1.05), (
            f"join {k} at frame {j}: step {step:.4f} > p99 {p99:.4f}, own {steep:.4f}"
        )
        slope = float(np.abs(np.diff(region)).max())
        own = max(float(np.abs(np.diff(own_a)).max()), float(np.abs(np.diff(own_b)).max()))
        assert slope <= own * 1.05 + 1e-4, f"join {k} at frame {j}: {slope:.4f} > {own:.4f}"
        # A crossfade: the output lies between the two renderings throughout the
        # fade, and in its middle it is neither rendering alone.
        lo, hi = np.minimum(own_a, own_b), np.maximum(own_a, own_b)
        assert np.all(region >= lo - 1e-5) and np.all(region <= hi + 1e-5), f"join {k}"
        mid = slice(HALF // 2, HALF + HALF // 2)
        differ = np.abs(own_a[mid] - own_b[mid]) > 1e-3
        if np.count_nonzero(differ) >= 16:
            off_a = np.abs(region[mid] - own_a[mid])[differ]
            off_b = np.abs(region[mid] - own_b[mid])[differ]
            gap = np.abs(own_a[mid] - own_b[mid])[differ]
            # mid-fade, neither rendering weighs less than about a sixth
            assert float(np.median(np.minimum(off_a, off_b) / gap)) >= 0.15, f"join {k}"
            blended += 1
    assert blended >= 1, "the renderings differ at some join (else nothing was tested)"


#: How far before its predicted end the test cuts the sentence's decoding: into the
#: last word ("close"), so the last window still speaks where it ends.
EARLY_STOP_FRAMES = 30


def test_speech_past_the_predicted_end_is_decoded_as_one_window_more(
    engine: KokoroSynthesizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the last window still speaks at its end (the predicted energy fell silent
    too early), the frames after it are decoded as one window more, joined as any two
    windows are (its context before the cut, a seamless join), not by decoding the
    last window again to the sentence's end."""
    real = windows.speech_stop
    stops: list[int] = []

    def early(energy: FloatArray, quiet: float, tail: int) -> int:
        stops.append(max(1, real(energy, quiet, tail) - EARLY_STOP_FRAMES))
        return stops[-1]

    monkeypatch.setattr(windows, "speech_stop", early)
    run = run_sentence(engine, SEAM_TEXT)
    n = run.decodes[0].n_frames
    assert len(stops) == 1
    assert run.joins[-1] == stops[0], "the window before the added one ends where it stopped"
    assert run.decodes[-1].end == n, "the added window goes to the sentence's end"
    assert len({d.start for d in run.decodes}) == len(run.decodes), "no window decoded twice"
    check_context(engine, run)
    check_seamless(run)
