"""KokoroSynthesizer with the real int8 model (kept few and short: ~1 s per inference)."""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kokoro_helpers import (
    DE_SENTENCE,
    EN_SENTENCE,
    rms,
    speak,
    spy,
)

import engines.kokoro.synth as synth_module
from engines.kokoro.backend import PROSODY_KEEP_TOKENS, OnnxBackend, Prosody
from engines.kokoro.models import ModelFileError
from engines.kokoro.pacing import SAFETY, START_RAMP_STEPS
from engines.kokoro.synth import WINDOW_OVERHEAD, KokoroConfig, KokoroSynthesizer, _DecodeSpeed
from engines.kokoro.windows import FIXED_STATS_SHAPE
from engines.runtime.cpus import available_cpus
from engines.runtime.synth import (
    SAMPLE_RATE,
    CallState,
    CancelToken,
    SynthesisCancelled,
    SynthesisError,
    Synthesizer,
    UnitGrant,
    VoiceNotFound,
    set_unit_grant,
    unit_grant,
)

pytestmark = pytest.mark.slow


def test_is_a_synthesizer(kokoro_synth: KokoroSynthesizer) -> None:
    assert isinstance(kokoro_synth, Synthesizer)
    assert kokoro_synth.sample_rate == SAMPLE_RATE == 24000
    assert kokoro_synth.default_voice == "jf_alpha"
    assert {"jf_alpha", "jm_kumo"} <= set(kokoro_synth.voices())
    assert kokoro_synth.status_suffix() == f":G2P:espeak:PLAN:{kokoro_synth.plan().name}"


@pytest.mark.parametrize(
    ("text", "lang", "min_s", "max_s"),
    [(EN_SENTENCE, "en", 1.2, 4.5), (DE_SENTENCE, "de", 1.6, 5.5)],
)
def test_known_sentences_sound_plausible(
    kokoro_synth: KokoroSynthesizer, text: str, lang: str, min_s: float, max_s: float
) -> None:
    assert kokoro_synth.phonemize(text).lang == lang
    chunks = speak(kokoro_synth, text)
    assert len(chunks) >= 2, "a sentence with a clause is streamed in phrases"
    audio = np.concatenate(chunks)
    assert audio.dtype == np.float32 and np.all(np.isfinite(audio))
    assert min_s <= len(audio) / SAMPLE_RATE <= max_s
    assert 0.03 <= rms(audio) <= 0.3
    assert float(np.max(np.abs(audio))) <= 1.5
    # edge silence trimmed: sound within the first 100 ms
    assert rms(audio[: SAMPLE_RATE // 10]) > 1e-3


def test_a_sentence_is_one_prosody_pass_streamed_in_windows(
    kokoro_synth: KokoroSynthesizer,
) -> None:
    text = (
        "I have booked your appointment for Monday at ten in the morning, "
        "and I will send you a short reminder the day before."
    )
    backend = spy(kokoro_synth)
    backend.clear()
    phon = kokoro_synth.phonemize(text)
    chunks = speak(kokoro_synth, text, CallState(call_id=7))
    # the whole sentence is one prosody pass: never cut inside
    space = kokoro_synth.frontend.vocab.space
    expected: list[int] = []
    for w in phon.words:
        if expected:
            expected.append(space)  # type: ignore[arg-type]
        expected.extend(w.tokens)
    assert backend.calls == [tuple(expected)]
    # its audio is decoded in windows that tile the frames (with context), in order
    windows = list(backend.windows)
    assert len(windows) >= 2
    # from inside the leading pad (~13 frames): its silent start is not decoded
    assert 0 <= windows[0][0] <= 10
    assert all(a[0] < b[0] and a[1] < b[1] for a, b in itertools.pairwise(windows))
    assert len(chunks) == len(windows)  # one chunk per window, yielded as each is ready
    first_s = len(chunks[0]) / SAMPLE_RATE
    # the first window is short: early first audio (paced at 0.3 compute s per audio s on
    # one core, the start planner takes windows of at least 8 frames after it: 0.22 s)
    assert 0.15 <= first_s <= 1.0
    assert first_s / (sum(len(c) for c in chunks) / SAMPLE_RATE) < 0.3


def test_text_beyond_510_phonemes(kokoro_synth: KokoroSynthesizer) -> None:
    text = " ".join(["The quick brown fox jumps over the lazy dog, and then it runs away."] * 9)
    assert kokoro_synth.phonemize(text).n_tokens > 510
    backend = spy(kokoro_synth)
    backend.clear()
    audio = np.concatenate(speak(kokoro_synth, text, CallState(call_id=2, speed=2.0)))
    assert all(len(c) <= 510 for c in backend.calls)
    assert len(audio) / SAMPLE_RATE > 12.0
    assert rms(audio) > 0.03


def test_cancel_between_windows_stops_early(kokoro_synth: KokoroSynthesizer) -> None:
    text = "One two three four five six seven eight, nine ten eleven twelve thirteen fourteen."
    backend = spy(kokoro_synth)
    backend.clear()
    cancel = CancelToken()
    gen = kokoro_synth.synthesize(text, CallState(call_id=3), cancel)
    first = next(gen)
    assert len(first) > 0
    # the utterance in progress says how much speech it has left (the share rule's horizon)
    outside = kokoro_synth._speaking.open()
    try:
        ((left, _),) = kokoro_synth._speaking.others(outside, 0)
    finally:
        kokoro_synth._speaking.close(outside)
    assert 1.0 < left < 10.0  # of a sentence of about 6 s, less its first window
    cancel.cancel()
    with pytest.raises(SynthesisCancelled):
        next(gen)
    assert len(backend.calls) == 1 and len(backend.windows) == 1
    assert kokoro_synth._speaking.others(outside, 0) == []  # a cancelled one leaves


def test_a_start_beside_another_utterance_counts_on_the_cores_it_will_give_back(
    kokoro_synth: KokoroSynthesizer,
) -> None:
    """``pacing`` Rule 8 in the engine: while the other utterance in progress has told the
    speech it has left, a start beside it on two cores plans its windows alone (a gang,
    or one window on every core) from the time that speech takes on a core of its own;
    not while its length is unknown, nor beside as many others as cores, nor alone."""
    me, other = kokoro_synth._speaking.open(), kokoro_synth._speaking.open()
    try:
        beside = UnitGrant(cores=1, cpus=2, others=1)
        assert kokoro_synth._cores_back(beside, me) == (None, math.inf)  # not told yet
        other.tell(2.0, 1.0)  # 2 s of speech left to decode, 1 s queued
        freed, at = kokoro_synth._cores_back(beside, me)
        assert freed is not None
        assert at == pytest.approx(2.0 * 0.3 * WINDOW_OVERHEAD)  # at the pinned 0.3
        alone = UnitGrant(cores=2, cpus=2, others=0)
        assert freed == kokoro_synth._pace(alone, kokoro_synth._gang_size(alone, retry=False))
        assert kokoro_synth._cores_back(UnitGrant(1, 2, 2), me) == (None, math.inf)
        assert kokoro_synth._cores_back(alone, me) == (None, math.inf)
        other.tell(math.inf, 1.0)  # units follow its current one
        assert kokoro_synth._cores_back(beside, me) == (None, math.inf)
    finally:
        kokoro_synth._speaking.close(me)
        kokoro_synth._speaking.close(other)


def test_the_start_plan_beside_another_utterance_is_told_when_the_cores_come_back(
    kokoro_synth: KokoroSynthesizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The start planner gets Rule 8's pace and time for a sentence begun beside another
    utterance in progress that has told the speech it has left."""
    got: list[dict[str, Any]] = []
    plan = synth_module.plan_first_gang

    def recorded(*args: Any, **kw: Any) -> Any:
        got.append(kw)
        return plan(*args, **kw)

    monkeypatch.setattr(synth_module, "plan_first_gang", recorded)
    other = kokoro_synth._speaking.open()
    other.tell(2.0, 1.0)
    kokoro_synth._cache.clear()
    gen = kokoro_synth.synthesize(EN_SENTENCE, CallState(call_id=31), CancelToken())
    try:
        set_unit_grant(UnitGrant(cores=1, cpus=2, others=1))
        assert len(next(gen)) > 0
    finally:
        set_unit_grant(None)
        gen.close()
        kokoro_synth._speaking.close(other)
    assert got and got[0]["freed"] is not None
    assert got[0]["freed_at"] == pytest.approx(2.0 * 0.3 * WINDOW_OVERHEAD)


def _start_beside_another(
    kokoro_synth: KokoroSynthesizer,
    monkeypatch: pytest.MonkeyPatch,
    lag: float,
    queued: float = 3.0,
    cores: int = 1,
) -> tuple[list[int], list[float], list[int], list[dict[str, Any]]]:
    """A sentence's first unit begun beside another utterance in progress on ``cores`` of
    two, at a pinned 0.9 compute s per audio s, in a pool whose claims answer ``lag``,
    the other with 2 s of speech left and ``queued`` s of audio queued: the claims asked,
    the helpers' takes (their wait), their holds, the start planner's arguments."""
    claims: list[int] = []
    takes: list[float] = []
    holds: list[int] = []
    got: list[dict[str, Any]] = []
    plan = synth_module.plan_first_gang
    decode = kokoro_synth._backend.decode
    threads: list[int] = []  # the unit's cores at each decode in its worker

    def decoded(*args: Any, **kw: Any) -> Any:
        if threading.current_thread() is worker:
            threads.append(unit_grant().cores)
        return decode(*args, **kw)

    def claim(cores: int) -> float:
        claims.append(cores)
        return lag if cores else 0.0

    def take(wait_s: float) -> bool:
        takes.append(wait_s)
        return True

    def recorded(*args: Any, **kw: Any) -> Any:
        got.append(kw)
        return plan(*args, **kw)

    monkeypatch.setattr(synth_module, "plan_first_gang", recorded)
    monkeypatch.setattr(kokoro_synth._backend, "decode", decoded)
    # the unit keeps the cores it was granted whatever the wide session measured
    monkeypatch.setattr(kokoro_synth, "_narrow_if_wide_is_slower", lambda: None)
    worker = threading.current_thread()
    # a CPU near real time on one core: one window on it must be long (Rule 8)
    monkeypatch.setattr(kokoro_synth, "config", replace(kokoro_synth.config, assume_rtf=0.9))
    other = kokoro_synth._speaking.open()
    other.tell(2.0, queued)
    kokoro_synth._cache.clear()
    gen = kokoro_synth.synthesize(EN_SENTENCE, CallState(call_id=32), CancelToken())
    try:
        grant = UnitGrant(cores, 2, 1, claim=claim, take=take, hold=holds.append)
        set_unit_grant(grant)
        assert len(next(gen)) > 0
        assert len(next(gen)) > 0  # the gang's next window (its helper has ended)
        assert threads and threads[0] == 1  # the first part on one core, its helper on another
    finally:
        set_unit_grant(None)
        gen.close()
        kokoro_synth._speaking.close(other)
    return claims, takes, holds, got


def test_a_start_beside_another_utterance_claims_a_core_for_its_first_gang(
    kokoro_synth: KokoroSynthesizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``pacing`` Rule 9 in the engine: a first unit granted one core of two beside another
    utterance claims the other core before its prosody pass and again after it; with
    that core expected free soon its first window is a gang, whose helper takes the
    claimed core (waiting up to twice the expected wait) and gives it back; the start
    planner is told when, and that the other's speech resumes after the first part."""
    claims, takes, holds, got = _start_beside_another(kokoro_synth, monkeypatch, 0.05)
    assert claims == [1, 1]
    assert takes == [pytest.approx(max(synth_module.TAKE_WAIT_MIN_S, 0.1))]
    assert sum(holds) == -1  # every core held is given back, the one taken too
    assert got[-1]["lag"] == 0.05 and got[-1]["freed_after_first"]
    assert got[-1]["pace"].gang == 2


def test_a_start_beside_another_utterance_granted_every_core_gangs_without_a_claim(
    kokoro_synth: KokoroSynthesizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rule 9 with both cores granted (the other's unit was not running): the first window
    is a gang on them, nothing is claimed or waited for, and the helper holds its core."""
    claims, takes, holds, got = _start_beside_another(kokoro_synth, monkeypatch, 1.0, cores=2)
    assert claims == [] and takes == []
    assert holds and sum(holds) == 0 and holds[0] == 1
    assert got[-1]["lag"] == 0.0 and got[-1]["freed_after_first"]
    assert got[-1]["pace"].gang == 2


@pytest.mark.parametrize(("lag", "queued"), [(math.inf, 3.0), (0.05, 0.5)])
def test_a_start_that_may_not_wait_for_the_claimed_core_decodes_one_window(
    kokoro_synth: KokoroSynthesizer, monkeypatch: pytest.MonkeyPatch, lag: float, queued: float
) -> None:
    """The pool does not know when the core comes free, or the other utterance has too
    little audio queued to leave it for the gang (``CLAIM_SPARE_S``): the claim is
    dropped, and the first window is one window on the unit's core, as before Rule 9."""
    claims, takes, holds, got = _start_beside_another(kokoro_synth, monkeypatch, lag, queued)
    assert claims == [1, 1, 0]
    assert takes == [] and holds == []
    assert got[-1]["lag"] == 0.0 and not got[-1]["freed_after_first"]
    assert got[-1]["pace"].gang == 1


#: a short sentence (about 1.4 s of speech after its leading pad): on a CPU near real
#: time with the default skew its first gang would take it whole (``pacing`` Rule 10)
SHORT_SENTENCE = "Hallo, wie geht es?"


def test_a_short_sentences_first_gang_splits_as_its_plan_says(
    kokoro_synth: KokoroSynthesizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``pacing`` Rule 10 in the engine: alone on two cores at a pinned 0.833 compute s
    per audio s, with the frame stage's run after the first part costing 8 frames (the
    default skew), the planner takes a split closer to even for a short sentence, and
    the engine's first gang is split with the skew the plan chose."""
    planned: list[int] = []
    split: list[int] = []
    plan, first_gang = synth_module.plan_first_gang, kokoro_synth._first_gang

    def recorded(*args: Any, **kw: Any) -> Any:
        out = plan(*args, **kw)
        planned.append(out[2])
        return out

    def spied(planner: Any, first_at: Any, gang: int, skew: int = 0) -> Any:
        split.append(skew)
        return first_gang(planner, first_at, gang, skew)

    monkeypatch.setattr(synth_module, "plan_first_gang", recorded)
    monkeypatch.setattr(kokoro_synth, "_first_gang", spied)
    monkeypatch.setattr(kokoro_synth, "_prefetch_frames", lambda pace, frames: 8)
    config = replace(kokoro_synth.config, assume_rtf=0.833, parallel_windows=2)
    monkeypatch.setattr(kokoro_synth, "config", config)
    monkeypatch.setattr(kokoro_synth, "_narrow_if_wide_is_slower", lambda: None)
    kokoro_synth._cache.clear()
    set_unit_grant(UnitGrant(cores=2, cpus=2, others=0))
    try:
        audio = list(kokoro_synth.synthesize(SHORT_SENTENCE, CallState(call_id=33), CancelToken()))
    finally:
        set_unit_grant(None)
    assert sum(len(a) for a in audio) > 0
    assert len(planned) == 1 and planned[0] < 8, planned
    assert split == planned


class RunWatch(CancelToken):
    """A cancel token that notes each model run registering for cancellation."""

    def __init__(self) -> None:
        super().__init__()
        self.runs = 0
        self.run_started = threading.Condition()

    def on_cancel(self, fn: Callable[[], object]) -> Callable[[], None]:
        forget = super().on_cancel(fn)
        with self.run_started:
            self.runs += 1
            self.run_started.notify_all()
        return forget


def test_cancel_interrupts_a_running_inference(kokoro_synth: KokoroSynthesizer) -> None:
    """A barge-in during the long run (the decoder) stops it: the cancelled inference
    costs a fraction of the CPU time of a whole one. The cancel is triggered by the run
    starting (not by a timer) and both are measured in process CPU time, so the test
    does not depend on the machine's speed or load."""
    backend = spy(kokoro_synth)
    tokens = kokoro_synth.phonemize(
        "This is a rather long sentence that keeps the model busy for a while, "
        "so that a barge-in can arrive while it is still running."
    ).words
    flat = [t for w in tokens for t in w.tokens]
    style = np.zeros(256, np.float32)
    c0 = time.process_time()
    backend.infer(flat, style, 1.0, CancelToken())
    full = time.process_time() - c0
    cancel = RunWatch()
    last_run = 2 if backend.split else 1  # split: the prosody run, then the decoder run

    def barge_in() -> None:
        with cancel.run_started:
            cancel.run_started.wait_for(lambda: cancel.runs >= last_run, timeout=120)
        cancel.cancel()

    canceller = threading.Thread(target=barge_in)
    canceller.start()
    c0 = time.process_time()
    with pytest.raises(SynthesisCancelled):
        backend.infer(flat, style, 1.0, cancel)
    cut = time.process_time() - c0
    canceller.join()
    assert cancel.runs == last_run
    assert cut < full * 0.6, (cut, full)


def test_prompt_cache_hit_skips_inference(kokoro_synth: KokoroSynthesizer) -> None:
    text = "Please hold the line."
    backend = spy(kokoro_synth)
    before = kokoro_synth.stats()
    a = np.concatenate(speak(kokoro_synth, text, CallState(call_id=4)))
    n_calls = len(backend.calls)
    b = np.concatenate(speak(kokoro_synth, text + "  ", CallState(call_id=5)))
    after = kokoro_synth.stats()
    assert len(backend.calls) == n_calls
    # the cache keeps 16-bit codes scaled to the entry's peak
    assert a.shape == b.shape
    assert np.max(np.abs(a - b)) <= np.max(np.abs(a)) / 32767 * 0.51 + 1e-9
    assert after["prompt_cache_hits"] == before["prompt_cache_hits"] + 1
    assert after["prompt_cache_misses"] == before["prompt_cache_misses"] + 1
    # another speed is another entry
    speak(kokoro_synth, text, CallState(call_id=6, speed=1.3))
    assert len(backend.calls) > n_calls


def test_prosody_carries_over_within_a_call(kokoro_synth: KokoroSynthesizer) -> None:
    state = CallState(call_id=8)
    speak(kokoro_synth, "Yes.", state)
    first = state.prosody["kokoro_style"].copy()
    speak(kokoro_synth, "That is a longer second sentence of this call.", state)
    second = state.prosody["kokoro_style"]
    voice = kokoro_synth._voices["jf_alpha"]
    n = kokoro_synth.phonemize("That is a longer second sentence of this call.").n_tokens
    np.testing.assert_allclose(second, 0.5 * first + 0.5 * voice[n - 1], rtol=1e-5)


def test_unknown_voice(kokoro_synth: KokoroSynthesizer) -> None:
    with pytest.raises(VoiceNotFound, match="nope"):
        speak(kokoro_synth, "Hello.", CallState(call_id=1, voice="nope"))


@pytest.mark.parametrize("speed", [0.1, 2.5, float("nan"), float("inf")])
def test_bad_speed(kokoro_synth: KokoroSynthesizer, speed: float) -> None:
    with pytest.raises(SynthesisError, match="speed"):
        speak(kokoro_synth, "Hello.", CallState(call_id=1, speed=speed))


@pytest.mark.parametrize("text", ["", "   \n\t", "?!...", "—,;:"])
def test_nothing_to_speak(kokoro_synth: KokoroSynthesizer, text: str) -> None:
    with pytest.raises(SynthesisError):
        speak(kokoro_synth, text)


@pytest.mark.parametrize(
    "text",
    ["☃☃☃ ⌘", "😀🎉", "12345", "\x00\x01\x02\ufffd\u200b\U0010ffff", "ÿþ\x7f\x80ĀĂ"],
)
def test_odd_text_speaks_or_raises_synthesis_error(
    kokoro_synth: KokoroSynthesizer, text: str
) -> None:
    try:
        audio = np.concatenate(speak(kokoro_synth, text))
    except SynthesisError:
        return
    assert len(audio) > 0 and np.all(np.isfinite(audio))


@settings(max_examples=6)
@given(text=st.text(max_size=12))
def test_arbitrary_text_raises_only_synthesis_error(
    kokoro_synth: KokoroSynthesizer, text: str
) -> None:
    try:
        for chunk in speak(kokoro_synth, text):
            assert chunk.dtype == np.float32
    except SynthesisError:
        pass


def test_warm_up(kokoro_synth: KokoroSynthesizer) -> None:
    before = kokoro_synth.stats()["units"]
    kokoro_synth.warm_up()
    assert kokoro_synth.stats()["units"] >= before + 2


def test_warm_up_measures_every_speed_afresh(kokoro_models_dir: Path) -> None:
    """A calibration cached while other work held the cores must not pace the calls: the
    warm-up replaces each estimate (one thread, every core wide, and every core busy at
    once) with what it measures now, where averaging would keep most of a stale one. The
    engine as it runs (its own speeds, no pinned pace), so that gangs may form."""
    synth = KokoroSynthesizer(KokoroConfig(models_dir=kokoro_models_dir))
    synth.load()
    try:
        cpus = available_cpus()
        # the intra-op threads of a unit granted one core, and every core (the backend's)
        one = synth._threads_for(UnitGrant(1, cpus, 0))
        wide = synth._threads_for(UnitGrant(cpus, cpus, 0))
        # compute s per audio s: far slower, and far faster, than any machine running
        # the tests (the fast crowded one makes a gang look best: the warm-up must not
        # form one, or the wide speed goes unmeasured)
        slow, fast = 8.0, 0.05
        speed = synth._speed
        speed.seed(one, slow)
        speed.seed(wide, slow)
        speed.seed(one, fast, crowded=True)
        synth.warm_up()
        assert speed.rtf(one) < slow / 2
        assert speed.rtf(wide) < slow / 2
        if cpus > 1:
            assert speed._by_key[one, True].value > 2 * fast
    finally:
        synth.close()


def test_warm_up_reserves_every_prosody_sessions_arena(
    kokoro_models_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each prosody session runs a pass of the longest length whose arena it keeps, so that
    no sentence up to it maps new pages before its first audio (backend Rule 3)."""
    synth = KokoroSynthesizer(KokoroConfig(models_dir=kokoro_models_dir))
    synth.load()
    try:
        backend = synth._split_backend
        assert isinstance(backend, OnnxBackend)
        seen: list[tuple[int, object]] = []
        real = backend.prosody

        def prosody(tokens: Sequence[int], *args: Any) -> Prosody:
            seen.append((len(tokens), backend.session("prosody")))
            return real(tokens, *args)

        monkeypatch.setattr(backend, "prosody", prosody)
        synth.warm_up()
        longest = {id(s) for n, s in seen if n == PROSODY_KEEP_TOKENS}
        assert longest == {id(s) for s in backend.sessions["prosody"].values()}
        assert max(n for n, _ in seen) == PROSODY_KEEP_TOKENS
    finally:
        synth.close()
    # whole sentences (``--no-split``): no prosody stage to reserve, and the warm-up runs
    whole = KokoroSynthesizer(KokoroConfig(models_dir=kokoro_models_dir, split=False))
    whole.load()
    try:
        assert not whole.split
        whole.warm_up()
    finally:
        whole.close()


def test_a_remeasured_estimate_is_replaced_then_averaged() -> None:
    speed = _DecodeSpeed(prior=0.5)
    speed.seed(2, 0.7)
    speed.seed(1, 0.9, crowded=True)
    speed.remeasure()
    assert speed.rtf(2) == pytest.approx(0.7)  # stands until measured
    speed.update(2, 1.0, 0.28)
    assert speed.rtf(2) == pytest.approx(0.28)  # replaced, not averaged with 0.7
    assert speed.safety() == SAFETY  # the replacing decode is no surprise
    speed.update(2, 1.0, 0.38)
    assert 0.28 < speed.rtf(2) < 0.38  # then averaged again
    assert speed.rtf(1, crowded=True) == pytest.approx(0.9)
    speed.update(1, 1.0, 0.45, crowded=True)
    assert speed.rtf(1, crowded=True) == pytest.approx(0.45)


def test_missing_model_file_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope.onnx"
    synth = KokoroSynthesizer(KokoroConfig(models_dir=tmp_path, model=missing))
    with pytest.raises(ModelFileError, match=r"nope.onnx"):
        synth.load()


def test_corrupt_model_file_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x01garbage" * 100)
    synth = KokoroSynthesizer(KokoroConfig(models_dir=tmp_path, model=bad))
    with pytest.raises(ModelFileError, match=r"bad.onnx"):
        synth.load()


def test_edge_cap_renders_less_silence_and_the_same_speech(kokoro_models_dir: Path) -> None:
    """Whole-utterance mode with ``--edge-cap`` caps the final mark's silence inside the
    graph, and only that: the start, where the first word's onset lies, is rendered as
    without the cap (a capped leading pad cut first words: README "Edge silence")."""
    from engines.kokoro.audio import FRAME, speech_bounds
    from engines.kokoro.backend import MARK_FRAMES, OnnxBackend
    from engines.kokoro.frontend import FrontEnd, Vocab
    from engines.kokoro.models import KOKORO_INT8_NAME, load_default_voices, load_vocab

    model = kokoro_models_dir / "kokoro" / KOKORO_INT8_NAME
    vocab = Vocab(load_vocab())
    capped = OnnxBackend(model, split=False, edge_cap=True)
    capped.load()
    capped.set_marks(frozenset(i for c, i in vocab.table.items() if c in ".,?!"))
    assert capped.capped and not capped.split
    assert (kokoro_models_dir / "kokoro" / f"{KOKORO_INT8_NAME}.durcap.stamp").is_file()
    plain = OnnxBackend(model, split=False)
    plain.load()
    try:
        assert not plain.capped
        tokens: list[int] = []
        for w in FrontEnd(vocab).phonemes(EN_SENTENCE).words:
            if tokens:
                tokens.append(vocab.space)  # type: ignore[arg-type]
            tokens.extend(w.tokens)
        style = load_default_voices()["jf_alpha"][len(tokens) - 1]
        a = capped.infer(tokens, style, 1.0, CancelToken())
        b = plain.infer(tokens, style, 1.0, CancelToken())
    finally:
        plain.close()
        capped.close()
    # the final mark's ~8 frames of 600 samples become MARK_FRAMES
    assert len(b) - len(a) >= (6 - MARK_FRAMES) * 600
    sa, sb = speech_bounds(a), speech_bounds(b)
    assert sa is not None and sb is not None
    assert abs(sa[0] - sb[0]) <= FRAME  # the speech starts where the model puts it
    # and its first 300 ms sound alike (10 ms loudness envelopes; the cap at the end
    # shifts the whole rendering a little: bidirectional LSTMs, instance norms)
    env = [x[s[0] : s[0] + 30 * FRAME].reshape(30, FRAME) for x, s in ((a, sa), (b, sb))]
    la, lb = (np.sqrt(np.mean(e.astype(np.float64) ** 2, axis=1)) for e in env)
    assert float(np.max(np.abs(la - lb))) <= 0.35 * float(np.max(lb)), (la, lb)
    speech_a, speech_b = sa[1] - sa[0], sb[1] - sb[0]
    assert abs(speech_a - speech_b) <= 0.12 * speech_b  # the speech itself keeps its length
    assert 0.8 <= rms(a[sa[0] : sa[1]]) / rms(b[sb[0] : sb[1]]) <= 1.25


@pytest.mark.parametrize(("rtf", "speed"), [(0.01, 1.1), (0.9, 1.15), (5.0, 1.2)])
def test_windows_follow_the_decode_speed_and_a_slow_cpu_starts_later(
    kokoro_synth: KokoroSynthesizer,
    monkeypatch: pytest.MonkeyPatch,
    rtf: float,
    speed: float,
) -> None:
    """Fast: the short first window, then the rest at once. Near real time: the first
    window ends later (the start planner), then larger windows. Far slower than real
    time: the whole sentence is decoded before it starts (no gap inside it)."""
    text = "I have booked your appointment for Monday at ten in the morning."
    monkeypatch.setattr(kokoro_synth.config, "assume_rtf", rtf)
    backend = spy(kokoro_synth)
    backend.clear()
    speak(kokoro_synth, text, CallState(call_id=9, speed=speed))  # own speed: no cache hit
    windows = list(backend.windows)
    assert kokoro_synth.voice_norms(kokoro_synth.default_voice) is not None
    shape = kokoro_synth.config.window_shape(FIXED_STATS_SHAPE)  # the voice's statistics
    n = windows[-1][1]
    first_kept = windows[0][1] - (shape.context if len(windows) > 1 else 0)
    lead_hi = 20 + shape.first[1]  # the leading pad is about 13 frames
    if rtf < 0.1:
        assert len(windows) == 2
        assert first_kept <= lead_hi
    elif rtf < 1:
        assert len(windows) >= 2
        assert first_kept > lead_hi  # started later than the default first window
    else:  # one window: the whole sentence from inside its leading pad
        assert len(windows) == 1 and windows[0][1] == n and windows[0][0] <= 10


def test_an_utterance_alone_starts_with_smaller_windows_for_the_start_ramps_steps(
    kokoro_synth: KokoroSynthesizer,
) -> None:
    """Paced at the tests' 0.3 compute s per audio s on one core, the start planner takes
    a ramp below the shape's (``pacing`` Rule 7): the first window is short and the
    window after it keeps fewer frames than the shape's ramp; from ``START_RAMP_STEPS``
    windows after the first on, none but the last keeps fewer than the shape's ramp."""
    text = (
        "I have booked your appointment for Monday at ten in the morning, "
        "and I will send you a short reminder the night before."
    )
    backend = spy(kokoro_synth)
    backend.clear()
    speak(kokoro_synth, text, CallState(call_id=10, speed=1.01))  # own speed: no cache hit
    windows = list(backend.windows)
    shape = kokoro_synth.config.window_shape(FIXED_STATS_SHAPE)
    assert shape.ramp is not None
    kept = [end - start - 2 * shape.context for start, end in windows[1:-1]]
    assert len(kept) > START_RAMP_STEPS
    assert kept[0] < shape.ramp
    assert all(k >= shape.ramp for k in kept[START_RAMP_STEPS:])


def test_the_start_margin_follows_how_much_slower_than_estimated_the_decodes_ran(
    kokoro_synth: KokoroSynthesizer,
) -> None:
    """The engine's speed estimates feed ``pacing.Surprise``: decodes at the estimate
    keep the fixed margin, decodes a third slower than it raise the margin, and the
    first decode after the prior (nothing measured yet) counts for nothing."""
    speed = _DecodeSpeed(prior=0.5)
    speed.update(1, 1.0, 5.0)  # against the prior: not a surprise
    assert speed.safety() == SAFETY
    speed.seed(1, 0.5)
    for _ in range(10):
        speed.update(1, 1.0, 0.5)
    assert speed.safety() == SAFETY
    for _ in range(6):
        speed.update(1, 1.0, speed.rtf(1) * 1.35)
    assert speed.safety() > SAFETY + 0.2
    assert kokoro_synth.stats()["decode_safety"] >= SAFETY
