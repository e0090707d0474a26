"""The split Kokoro graph with the real model: exact stages, cache, seams, fallback."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
import pytest
import structlog
from kokoro_helpers import (
    EN_SENTENCE,
    assert_seamless_windows,
    rms,
    speak,
    spy,
)
from onnx import TensorProto, helper

from engines.kokoro import windows
from engines.kokoro.audio import speech_bounds
from engines.kokoro.backend import OnnxBackend
from engines.kokoro.convert.validate import spectral_distance
from engines.kokoro.graph_split import GraphSplitError, split_model, split_sources
from engines.kokoro.models import KOKORO_INT8_NAME
from engines.kokoro.synth import FINAL_TAIL_KEEP_S, FRAME_AHEAD, KokoroConfig, KokoroSynthesizer
from engines.kokoro.windows import (
    FRAME_SAMPLES,
)
from engines.runtime.audio import normalize_whole
from engines.runtime.playback import PlaybackMeter
from engines.runtime.synth import CallState, CancelToken, UnitGrant, set_unit_grant, unit_grant

pytestmark = pytest.mark.slow

SEAM_TEXT = (
    "Your package will arrive on Thursday between nine and noon, "
    "and the driver will call you when he is close."
)


def tokens_of(synth: KokoroSynthesizer, text: str) -> list[int]:
    space = synth.frontend.vocab.space
    assert space is not None
    out: list[int] = []
    for w in synth.phonemize(text).words:
        if out:
            out.append(space)
        out.extend(w.tokens)
    return out


def test_split_stages_give_the_whole_graph_bit_for_bit(
    kokoro_synth: KokoroSynthesizer, kokoro_models_dir: Path
) -> None:
    model = kokoro_models_dir / "kokoro" / KOKORO_INT8_NAME
    split = spy(kokoro_synth)
    assert split.split and not split.capped  # the split graph keeps the model's edge silence
    whole = OnnxBackend(model, edge_cap=False, split=False)
    whole.load()
    try:
        assert not whole.split
        tokens = tokens_of(kokoro_synth, EN_SENTENCE)
        style = kokoro_synth._voices["jf_alpha"][len(tokens) - 1]
        a = split.infer(tokens, style, 1.0, CancelToken())
        b = whole.infer(tokens, style, 1.0, CancelToken())
        prosody = split.prosody(tokens, style, 1.0, CancelToken())
    finally:
        whole.close()
    assert len(a) == len(b) == prosody.n_frames * FRAME_SAMPLES
    np.testing.assert_array_equal(a, b)
    assert prosody.durations.sum() == prosody.n_frames
    assert len(prosody.durations) == len(tokens) + 2
    assert prosody.phase.shape[:2] == (1, 2 * prosody.n_frames)


def test_split_files_are_cached_checked_and_rebuilt(kokoro_models_dir: Path) -> None:
    model = kokoro_models_dir / "kokoro" / KOKORO_INT8_NAME
    first = split_sources(model)
    assert first is not None and isinstance(first.prosody, str)
    decoder = Path(str(first.decoder))
    stamp = model.with_name(model.name + ".split.stamp")
    assert stamp.is_file() and decoder.is_file()
    before = decoder.stat().st_mtime_ns
    again = split_sources(model)
    assert again == first and decoder.stat().st_mtime_ns == before  # reused, not rebuilt
    data = bytearray(decoder.read_bytes())
    data[len(data) // 2] ^= 0xFF  # corrupt one byte: the checksum catches it
    decoder.write_bytes(bytes(data))
    rebuilt = split_sources(model)
    assert rebuilt is not None
    fresh = OnnxBackend(model)
    fresh.load()
    assert fresh.split
    fresh.close()
    assert b"".join([Path(str(rebuilt.decoder)).read_bytes()]) != bytes(data)


def test_window_joins_are_seamless(kokoro_synth: KokoroSynthesizer) -> None:
    """At every join the step between samples stays within the windows' own 99th
    percentile, and the crossfade never makes a steeper slope than either window had."""
    backend = spy(kokoro_synth)
    tokens = tokens_of(kokoro_synth, SEAM_TEXT)
    style = kokoro_synth._voices["jf_alpha"][len(tokens) - 1]
    assert_seamless_windows(kokoro_synth, backend, tokens, style)


def test_streamed_sentence_matches_whole_sentence_length_and_level(
    kokoro_synth: KokoroSynthesizer, kokoro_models_dir: Path
) -> None:
    streamed = np.concatenate(speak(kokoro_synth, SEAM_TEXT, CallState(call_id=21)))
    whole = KokoroSynthesizer(
        KokoroConfig(models_dir=kokoro_models_dir, prompt_cache_mb=0, split=False, edge_cap=False)
    )
    whole.load()
    try:
        ref = np.concatenate(speak(whole, SEAM_TEXT, CallState(call_id=21)))
    finally:
        whole.close()
    assert 0.9 <= len(streamed) / len(ref) <= 1.1
    # at the level a caller hears: the runtime scales every utterance to the reference
    # 0.90 peak. Before that, the voice's instance-norm statistics (README "Kokoro
    # pipeline") make a sentence 0.8-1.3x the RMS of its whole rendering, by how much of
    # it is speech; after it, 0.86-1.05x (each window's own statistics: 0.80-1.10x)
    heard, ref_heard = normalize_whole(streamed), normalize_whole(ref)
    assert 0.8 <= rms(heard) / rms(ref_heard) <= 1.25


def sentence_frames(synth: KokoroSynthesizer, text: str) -> int:
    backend = synth._backend
    assert isinstance(backend, OnnxBackend)
    tokens = tokens_of(synth, text)
    style = synth._voices["jf_alpha"][len(tokens) - 1]
    return backend.prosody(tokens, style, 1.0, CancelToken()).n_frames


def test_the_trailing_silence_is_not_decoded_but_kept_as_silence(
    kokoro_synth: KokoroSynthesizer,
) -> None:
    backend = spy(kokoro_synth)
    backend.clear()
    kokoro_synth._cache.clear()  # decoded now, not the prompt cache's copy
    audio = np.concatenate(speak(kokoro_synth, SEAM_TEXT, CallState(call_id=22)))
    n = sentence_frames(kokoro_synth, SEAM_TEXT)
    last_decoded = max(end for _, end in backend.windows)
    # the model renders 0.5-0.8 s of silence after the last word (windows.FIXED_TAIL_FRAMES)
    assert n - last_decoded >= 10, (n, backend.windows)
    bounds = speech_bounds(audio)
    assert bounds is not None
    keep = int(FINAL_TAIL_KEEP_S * 24000)
    # (the trimmer measured the last window alone: its -42 dB may fall a little later)
    assert abs(len(audio) - bounds[1] - keep) <= FRAME_SAMPLES, "the pause is kept, as zeros"
    assert not audio[bounds[1] + keep // 2 :].any()


def test_speech_where_the_energy_predicted_silence_is_decoded_to_the_end(
    kokoro_synth: KokoroSynthesizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = spy(kokoro_synth)
    kokoro_synth._cache.clear()  # decoded now, not the prompt cache's copy
    reference = np.concatenate(speak(kokoro_synth, SEAM_TEXT, CallState(call_id=23)))

    def in_a_word(energy: npt.NDArray[np.float64], quiet: float, tail: int) -> int:
        third = len(energy) // 3  # the loudest frame of the middle third: a vowel
        return third + int(np.argmax(energy[third : 2 * third])) + 1

    monkeypatch.setattr(windows, "speech_stop", in_a_word)
    backend.clear()
    kokoro_synth._cache.clear()
    audio = np.concatenate(speak(kokoro_synth, SEAM_TEXT, CallState(call_id=23)))
    n = sentence_frames(kokoro_synth, SEAM_TEXT)
    assert max(end for _, end in backend.windows) == n, "the last window went to the end"
    got, want = speech_bounds(audio), speech_bounds(reference)
    assert got is not None and want is not None
    assert abs((got[1] - got[0]) - (want[1] - want[0])) <= 2 * FRAME_SAMPLES, "no word lost"


def speak_on_cores(
    synth: KokoroSynthesizer,
    text: str,
    cores: int,
    call_id: int,
    on_chunk: Callable[[], object] = lambda: None,
    hold: Callable[[int], None] | None = None,
) -> list[npt.NDArray[np.float32]]:
    """``speak_at`` (a virtual clock at the pinned speed) with every unit granted
    ``cores`` while the utterance is alone, as the runtime's pool does; ``on_chunk``
    runs as each chunk arrives; ``hold``: the pool's count of helper cores."""
    state = CallState(call_id=call_id)
    now = [0.0]
    meter = PlaybackMeter(lambda: now[0])
    state.playback = meter
    gen = synth.synthesize(text, state, CancelToken())
    out: list[npt.NDArray[np.float32]] = []
    try:
        while True:
            set_unit_grant(UnitGrant(cores=cores, cpus=cores, others=0, hold=hold))
            try:
                chunk = next(gen)
            except StopIteration:
                break
            on_chunk()
            now[0] += 0.3 * len(chunk) / 24000
            meter.sent(len(chunk), now[0])
            out.append(chunk)
    finally:
        set_unit_grant(None)
    return out


def test_windows_decoded_at_once_on_several_cores_join_in_order(
    kokoro_synth: KokoroSynthesizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gang of windows (``pacing`` Rule 3) is decoded at the same time in two threads,
    and the sentence comes out in order: as heard with one window at a time."""
    backend = spy(kokoro_synth)
    kokoro_synth._cache.clear()
    serial = np.concatenate(speak_on_cores(kokoro_synth, SEAM_TEXT, 2, call_id=24))
    calls: list[tuple[int, float, float, int]] = []
    decode = backend.decode

    def timed(prosody: Any, start: int, end: int, *args: Any) -> npt.NDArray[np.float32]:
        t0 = time.perf_counter()
        try:
            return decode(prosody, start, end, *args)
        finally:
            calls.append((threading.get_ident(), t0, time.perf_counter(), start))

    monkeypatch.setattr(backend, "decode", timed)
    # the serial phases before a gang's decodes run on all the gang's cores
    serial_phases: list[tuple[str, int, int]] = []  # (stage, cores granted, frames ahead)
    prosody, prepare = backend.prosody, backend.prepare

    def spied_prosody(*args: Any) -> Any:
        serial_phases.append(("prosody", unit_grant().cores, 0))
        return prosody(*args)

    def spied_prepare(
        p: Any, start: int, end: int, style: Any, cancel: Any, ahead: int = 0
    ) -> None:
        serial_phases.append(("frame", unit_grant().cores, ahead))
        prepare(p, start, end, style, cancel, ahead)

    monkeypatch.setattr(backend, "prosody", spied_prosody)
    # on a box where one window on both cores measures slower than on one (this one, on
    # some days) a unit keeps to one core; a gang's prosody pass still takes both
    narrow = lambda: set_unit_grant(replace(unit_grant(), cores=1))  # noqa: E731
    monkeypatch.setattr(kokoro_synth, "_narrow_if_wide_is_slower", narrow)
    monkeypatch.setattr(backend, "prepare", spied_prepare)
    monkeypatch.setattr(kokoro_synth.config, "parallel_windows", 2)
    kokoro_synth._cache.clear()
    before = kokoro_synth.stats()["windows_parallel"]
    gang = np.concatenate(speak_on_cores(kokoro_synth, SEAM_TEXT, 2, call_id=24))
    assert kokoro_synth.stats()["windows_parallel"] - before >= 4
    assert serial_phases[0] == ("prosody", 2, 0), serial_phases
    # a sentence's first gang runs the frame stage on its own frames (nothing else
    # delays the first audio), right after its prosody pass, on all its cores; a later
    # gang on all its cores ahead too (unless the gang before ran it beside its windows,
    # on one core: ``_Prefetch``)
    on_all = {p for p in serial_phases if p[1] == 2}
    assert on_all == {("prosody", 2, 0), ("frame", 2, 0), ("frame", 2, FRAME_AHEAD)}, serial_phases
    assert all(p == ("frame", 1, FRAME_AHEAD) for p in serial_phases if p[1] == 1), serial_phases
    assert all(
        (p == ("frame", 2, 0)) == (serial_phases[k - 1][0] == "prosody")
        for k, p in enumerate(serial_phases)
        if p[0] == "frame"
    ), serial_phases
    threads = {c[0] for c in calls}
    assert len(threads) == 2, "a gang's windows run in two threads"
    overlaps = [
        (a, b) for a, b in itertools.pairwise(sorted(calls, key=lambda c: c[3])) if b[1] < a[2]
    ]
    assert overlaps, "and at the same time"
    assert abs(len(gang) - len(serial)) <= 2 * FRAME_SAMPLES
    n = min(len(gang), len(serial))
    # another window plan renders the same sentence (the decoder's noise differs per run):
    # about 1 dB; a gang joined out of order is not the same sentence
    assert spectral_distance(serial[:n], gang[:n]) < 2.0


def test_a_gangs_helper_threads_hold_their_cores_with_the_pool(
    kokoro_synth: KokoroSynthesizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each window of a gang decoded in a helper thread is counted with the runtime's pool
    while it decodes (``UnitGrant.hold``, pool Rule 5: it may run on after its unit has
    yielded the gang's first window), and every core held is given back."""
    backend = spy(kokoro_synth)
    gangs_of_two(kokoro_synth, monkeypatch)
    lock = threading.Lock()
    held = [0]
    seen: list[tuple[bool, int]] = []  # (decoded in a helper thread, cores held meanwhile)
    main = threading.get_ident()

    def hold(cores: int) -> None:
        with lock:
            held[0] += cores

    decode = backend.decode

    def spied_decode(*args: Any) -> Any:
        with lock:
            seen.append((threading.get_ident() != main, held[0]))
        return decode(*args)

    monkeypatch.setattr(backend, "decode", spied_decode)
    kokoro_synth._cache.clear()
    speak_on_cores(kokoro_synth, SEAM_TEXT, 2, call_id=29, hold=hold)
    helpers = [cores for helper, cores in seen if helper]
    assert helpers, "the gangs decode windows in helper threads"
    assert all(cores >= 1 for cores in helpers), seen
    assert held[0] == 0, "every core held is given back"


def gangs_of_two(synth: KokoroSynthesizer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two windows at once while the utterance is alone, each on one core (as on a box
    where one window on both cores measures slower)."""
    monkeypatch.setattr(synth.config, "parallel_windows", 2)
    narrow = lambda: set_unit_grant(replace(unit_grant(), cores=1))  # noqa: E731
    monkeypatch.setattr(synth, "_narrow_if_wide_is_slower", narrow)


def test_a_gangs_next_frame_stage_runs_beside_its_windows(
    kokoro_synth: KokoroSynthesizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gang's next windows' frame stage runs on one core in one of its threads once
    that thread's window is decoded (``synth._Prefetch``), not on all the cores before
    the next gang: after the sentence's first gang, every run of the frame stage is on
    one core, and the windows of each later gang lie inside the span it ran. The
    sentence is the one heard without it."""
    backend = spy(kokoro_synth)
    gangs_of_two(kokoro_synth, monkeypatch)
    # the run's cost as if measured (the window plan then depends on no clock)
    monkeypatch.setattr(kokoro_synth, "_prefetch_frames", lambda pace, frames: 3)
    runs: list[tuple[int, int, int]] = []  # frame-stage runs: (cores, start, end)
    decodes: list[tuple[int, int]] = []  # windows decoded: (start, end) with context
    frame, decode = backend._frame, backend.decode

    def spied_frame(prosody: Any, start: int, end: int, *args: Any, **kw: Any) -> Any:
        runs.append((unit_grant().cores, start, end))
        return frame(prosody, start, end, *args, **kw)

    def spied_decode(prosody: Any, start: int, end: int, *args: Any) -> Any:
        decodes.append((start, end))
        return decode(prosody, start, end, *args)

    monkeypatch.setattr(backend, "_frame", spied_frame)
    monkeypatch.setattr(backend, "decode", spied_decode)
    kokoro_synth._cache.clear()
    before = kokoro_synth.stats()["frame_stage_prefetches"]
    ahead = np.concatenate(speak_on_cores(kokoro_synth, SEAM_TEXT, 2, call_id=27))
    assert kokoro_synth.stats()["frame_stage_prefetches"] - before >= 1
    assert runs[0][0] == 2, runs  # the first gang's, on both cores
    # then the next windows', on one core, until one over the whole sentence (its own
    # statistics: pacing Rule 5)
    whole = [r for r in runs if r[1] == 0 and r != runs[0]]
    ahead_runs = [r for r in runs[1:] if r not in whole]
    assert ahead_runs and all(cores == 1 for cores, _, _ in ahead_runs), runs
    assert all(any(lo <= a and b <= hi for _, lo, hi in runs) for a, b in decodes), (
        runs,
        decodes,
    )

    monkeypatch.setattr(kokoro_synth, "_frame_stage_prefetch", lambda *a: None)
    kokoro_synth._cache.clear()
    runs.clear()
    before_run = np.concatenate(speak_on_cores(kokoro_synth, SEAM_TEXT, 2, call_id=27))
    assert any(cores == 2 and lo > 0 for cores, lo, _ in runs), runs  # the gangs' own
    assert abs(len(ahead) - len(before_run)) <= 2 * FRAME_SAMPLES
    n = min(len(ahead), len(before_run))
    # the same window plan (the decoder's noise differs per run): a misplaced span is
    # another sentence
    assert spectral_distance(before_run[:n], ahead[:n]) < 2.0


def test_a_gangs_last_window_is_shorter_by_the_frame_stage_it_runs_after(
    kokoro_synth: KokoroSynthesizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the next gang's frame stage is due, a gang asks its last window for fewer
    frames than its others, by what that run costs (``_prefetch_frames``): the thread
    done first runs it, and the gang's cores end together; else its windows are asked
    for the same."""
    gangs_of_two(kokoro_synth, monkeypatch)
    monkeypatch.setattr(kokoro_synth, "_prefetch_frames", lambda pace, frames: 5)
    asked: list[list[int | None]] = []  # per later gang: the frames asked of each window
    asking: list[int | None] | None = None
    plain_next, plain_gang = windows.WindowPlanner.next, kokoro_synth._next_gang

    def spied_next(self: windows.WindowPlanner, budget: int | None = None, **kw: Any) -> Any:
        if asking is not None:
            asking.append(budget)
        return plain_next(self, budget, **kw)

    def spied_gang(*args: Any, **kw: Any) -> Any:
        nonlocal asking
        asking = []
        try:
            return plain_gang(*args, **kw)
        finally:
            asked.append(asking)
            asking = None

    firsts: list[tuple[int, list[int]]] = []  # the first gang: (skew, its windows' frames)
    plain_first = kokoro_synth._first_gang

    def spied_first(planner: Any, first_at: Any, gang: int, skew: int = 0) -> Any:
        out = plain_first(planner, first_at, gang, skew)
        firsts.append((skew, [w.frames for w in out]))
        return out

    monkeypatch.setattr(windows.WindowPlanner, "next", spied_next)
    monkeypatch.setattr(kokoro_synth, "_next_gang", spied_gang)
    monkeypatch.setattr(kokoro_synth, "_first_gang", spied_first)
    kokoro_synth._cache.clear()
    speak_on_cores(kokoro_synth, SEAM_TEXT, 2, call_id=28)
    pairs = [a for a in asked if len(a) == 2]
    assert pairs, asked
    shorter = [(a, b) for a, b in pairs if a != b]
    assert shorter, asked
    assert all(a is not None and b == max(1, a - 5) for a, b in shorter), asked
    # the sentence's first gang: its first part (whose thread runs the frame stage once it
    # is decoded) short of an even share by as much
    [(skew, parts)] = firsts
    assert skew == 5 and len(parts) == 2 and parts[1] - parts[0] >= 4, firsts


def test_a_gangs_first_window_is_heard_while_the_others_still_decode(
    kokoro_synth: KokoroSynthesizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first audio leaves as soon as the gang's first window is decoded (``pacing``
    Rule 3): a helper's decode of the sentence's first gang waits until the listener
    has that audio. Were the gang yielded only when all its windows are ready, the
    helper would wait in vain (until its timeout), and the audio would come after it."""
    backend = spy(kokoro_synth)
    decode = backend.decode
    heard = threading.Event()
    waited: list[bool] = []  # per helper decode of the first gang: released by the listener

    def held(prosody: Any, start: int, end: int, *args: Any) -> npt.NDArray[np.float32]:
        if threading.current_thread().name.startswith("kokoro-window") and not waited:
            waited.append(heard.wait(timeout=30.0))
        return decode(prosody, start, end, *args)

    monkeypatch.setattr(backend, "decode", held)
    monkeypatch.setattr(kokoro_synth.config, "parallel_windows", 2)
    kokoro_synth._cache.clear()
    try:
        chunks = speak_on_cores(kokoro_synth, SEAM_TEXT, 2, call_id=25, on_chunk=heard.set)
    finally:
        heard.set()
    assert waited == [True], "the first window was yielded before the helper's was decoded"
    assert kokoro_synth.stats()["windows_parallel"] >= 2 and len(chunks) >= 3


def test_a_recalled_window_is_decoded_again_in_the_next_unit(
    kokoro_synth: KokoroSynthesizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pool recalls a unit (runtime pool Rule 4) while its decoder runs: the run ends
    at once, the unit ends with no audio, and the next unit decodes the same window; the
    sentence is heard as it is without the recall."""
    backend = spy(kokoro_synth)
    kokoro_synth._cache.clear()
    plain = np.concatenate(speak_on_cores(kokoro_synth, SEAM_TEXT, 1, call_id=27))
    real_session = backend.session
    fire: list[CancelToken] = []  # the recall to fire as the next decoder run starts

    class Firing:
        def __init__(self, session: Any) -> None:
            self.session = session

        def run(self, *args: Any) -> Any:
            fire.pop().cancel()  # ORT checks the terminate flag between nodes
            return self.session.run(*args)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.session, name)

    def session(stage: str, cores: int | None = None) -> Any:
        got = real_session(stage, cores)
        return Firing(got) if stage == "decoder" and fire else got

    monkeypatch.setattr(backend, "session", session)
    kokoro_synth._cache.clear()
    before = kokoro_synth.stats()
    backend.windows.clear()
    state = CallState(call_id=28)
    now = [0.0]
    state.playback = meter = PlaybackMeter(lambda: now[0])
    gen = kokoro_synth.synthesize(SEAM_TEXT, state, CancelToken())
    chunks: list[npt.NDArray[np.float32]] = []
    try:
        for k in itertools.count():
            recall = CancelToken()
            if k == 2:  # a unit after the first (a first unit is never recalled)
                fire.append(recall)
            set_unit_grant(UnitGrant(cores=1, cpus=1, others=0, recall=recall))
            try:
                chunk = next(gen)
            except StopIteration:
                break
            now[0] += 0.3 * len(chunk) / 24000
            meter.sent(len(chunk), now[0])
            chunks.append(chunk)
    finally:
        set_unit_grant(None)
    assert not fire, "the recall fired"
    assert [len(c) == 0 for c in chunks[:4]] == [False, False, True, False], chunks[:4]
    # the recalled window, decoded again at once
    again = [a for a, b in itertools.pairwise(backend.windows) if a == b]
    assert len(again) == 1, backend.windows
    stats = kokoro_synth.stats()
    assert stats["units_recalled"] - before["units_recalled"] == 1
    recalled = np.concatenate(chunks)
    assert abs(len(recalled) - len(plain)) <= 2 * FRAME_SAMPLES
    n = min(len(recalled), len(plain))
    assert spectral_distance(plain[:n], recalled[:n]) < 2.0


def foreign_graph(path: Path) -> Path:
    """Kokoro's interface (tokens, style, speed -> audio) without Kokoro's insides."""
    c = lambda name, v: helper.make_tensor(name, TensorProto.INT64, [len(v)], v)  # noqa: E731
    graph = helper.make_graph(
        [
            helper.make_node("Shape", ["tokens"], ["shape"]),
            helper.make_node("Slice", ["shape", "one", "two"], ["t"]),
            helper.make_node("Mul", ["t", "per_token"], ["n"]),
            helper.make_node("Squeeze", ["n", "zero"], ["n0"]),
            helper.make_node("Range", ["zero_s", "n0", "one_s"], ["idx"]),
            helper.make_node("Cast", ["idx"], ["fidx"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["fidx", "omega"], ["ph"]),
            helper.make_node("Sin", ["ph"], ["s"]),
            helper.make_node("Mul", ["s", "gain"], ["audio"]),
        ],
        "foreign",
        [
            helper.make_tensor_value_info("tokens", TensorProto.INT64, [1, "T"]),
            helper.make_tensor_value_info("style", TensorProto.FLOAT, [1, 256]),
            helper.make_tensor_value_info("speed", TensorProto.FLOAT, [1]),
        ],
        [helper.make_tensor_value_info("audio", TensorProto.FLOAT, ["N"])],
        initializer=[
            c("one", [1]),
            c("two", [2]),
            c("per_token", [1800]),
            c("zero", [0]),
            helper.make_tensor("zero_s", TensorProto.INT64, [], [0]),
            helper.make_tensor("one_s", TensorProto.INT64, [], [1]),
            helper.make_tensor("omega", TensorProto.FLOAT, [], [2 * np.pi * 220 / 24000]),
            helper.make_tensor("gain", TensorProto.FLOAT, [], [0.3]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_a_graph_that_cannot_be_split_falls_back_to_whole_utterances(tmp_path: Path) -> None:
    model = foreign_graph(tmp_path / "other.onnx")
    with pytest.raises(GraphSplitError):
        split_model(onnx.load(str(model)))
    synth = KokoroSynthesizer(KokoroConfig(models_dir=tmp_path, model=model, prompt_cache_mb=0))
    with structlog.testing.capture_logs() as logs:
        synth.load()
        chunks = list(
            synth.synthesize("Hello there. How are you?", CallState(call_id=1), CancelToken())
        )
    events = {e["event"] for e in logs}
    assert "graph_split_unavailable" in events and "streamed_decoding_off" in events
    assert not synth.split
    audio = np.concatenate(chunks)
    assert len(audio) > 0 and rms(audio) > 0.05
    assert synth.stats()["windows"] == 0 and synth.stats()["units"] >= 1
    synth.close()


#: Sentences whose first sound starts early and late in the leading pad (jf_alpha).
ONSET_TEXTS = (
    "Hello, how can I help you today?",
    "Sorry, I did not catch that, could you say it again please?",
    "See you on Monday at ten in the morning, as agreed.",
    "Shall I book the appointment for you right now?",
    "Zero, one, two, three, four, five and six.",
    "Thank you for calling, your order will arrive on Thursday.",
)


def test_the_first_sound_is_decoded_and_little_silence_before_it(
    kokoro_synth: KokoroSynthesizer,
) -> None:
    """The first window starts a few frames before the sentence's first sound, as the
    whole sentence renders it: never after it (a first word cut), and not far before it
    (silent frames decoded before the first audio)."""
    backend = spy(kokoro_synth)
    voice = kokoro_synth.default_voice
    norms = kokoro_synth.voice_norms(voice)
    assert norms is not None
    cancel = CancelToken()
    before = []
    for i, text in enumerate(ONSET_TEXTS):
        tokens = tokens_of(kokoro_synth, text)
        style = kokoro_synth._voices[voice][len(tokens) - 1]
        prosody = replace(backend.prosody(tokens, style, 1.0, cancel), norms=norms)
        pad = int(prosody.durations[0])
        backend.prepare(prosody, 0, pad + 12, style, cancel)
        sound = speech_bounds(backend.decode(prosody, 0, pad + 12, style, cancel))
        assert sound is not None
        backend.clear()
        kokoro_synth._cache.clear()  # decoded now, not the prompt cache's copy
        speak(kokoro_synth, text, CallState(call_id=40 + i))
        ctx_start = backend.windows[0][0]
        kept = ctx_start + windows.FIXED_CONTEXT_FRAMES if ctx_start else 0
        before.append(sound[0] / FRAME_SAMPLES - kept)
    assert min(before) >= 1.0, f"frames kept before the first sound: {before}"
    # (6 frames before the pad's end, whatever the energy: 1.6-5.0 frames, median 2.7)
    assert np.median(before) <= 2.5, f"frames kept before the first sound: {before}"
