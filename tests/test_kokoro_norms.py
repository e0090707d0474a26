"""Instance norms that take a voice's statistics (engines/kokoro/norms.py).

A small decoder-shaped graph with the shipped export's decomposed instance norm
(``ReduceMean``, ``Sub``, ``Mul``, ``ReduceMean``, ``Add`` eps, ``Sqrt``, ``Div``) stands
in for the generator here: the rewrite must keep it exact with weight 1, must apply the
given statistics with weight 0, and must report the window's own statistics.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kokoro_helpers import rms, shared_models_dir, speak, speak_at
from onnx import TensorProto, helper, numpy_helper

from engines.kokoro.backend import FeatureSpan, OnnxBackend, Prosody
from engines.kokoro.convert.validate import spectral_distance
from engines.kokoro.graph_split import FRAME_MARGIN
from engines.kokoro.models import DEFAULT_VOICE
from engines.kokoro.norms import (
    MEAN_OUTPUT,
    NORM_WEIGHT,
    VAR_OUTPUT,
    NormCache,
    NormStats,
    add_norm_inputs,
    find_norms,
    norm_count,
    own_feeds,
    pool,
    voice_key,
)
from engines.kokoro.synth import KokoroConfig, KokoroSynthesizer
from engines.kokoro.voice_norms import CALIBRATION_TEXTS, VoiceNorms
from engines.kokoro.windows import CONTEXT_FRAMES, FIXED_CONTEXT_FRAMES, FRAME_SAMPLES
from engines.runtime.playback import PlaybackMeter
from engines.runtime.synth import (
    CallState,
    CancelToken,
    SynthesisCancelled,
    UnitGrant,
    set_unit_grant,
)

EPS = 1e-5
C = 4


def norm_graph(norms: int = 2) -> onnx.ModelProto:
    """``x [1, C, T]`` through ``norms`` instance norms, each followed by ``y * g + b``."""
    nodes: list[onnx.NodeProto] = []
    inits = [
        numpy_helper.from_array(np.array([2], np.int64), "axes"),
        numpy_helper.from_array(np.array(EPS, np.float32), "eps"),
    ]
    x = "x"
    for k in range(norms):
        p = f"n{k}/"
        g = np.linspace(0.5, 1.5, C, dtype=np.float32).reshape(1, C, 1) * (k + 1)
        inits += [
            numpy_helper.from_array(g, p + "g"),
            numpy_helper.from_array(np.full((1, C, 1), 0.1 * k, np.float32), p + "b"),
        ]
        nodes += [
            helper.make_node("ReduceMean", [x, "axes"], [p + "m"], keepdims=1, name=p + "mean"),
            helper.make_node("Sub", [x, p + "m"], [p + "d"], name=p + "sub"),
            helper.make_node("Mul", [p + "d", p + "d"], [p + "d2"], name=p + "sq"),
            helper.make_node(
                "ReduceMean", [p + "d2", "axes"], [p + "v"], keepdims=1, name=p + "var"
            ),
            helper.make_node("Add", [p + "v", "eps"], [p + "ve"], name=p + "add"),
            helper.make_node("Sqrt", [p + "ve"], [p + "s"], name=p + "sqrt"),
            helper.make_node("Div", [p + "d", p + "s"], [p + "y"], name=p + "div"),
            helper.make_node("Mul", [p + "y", p + "g"], [p + "yg"], name=p + "gain"),
            helper.make_node("Add", [p + "yg", p + "b"], [p + "out"], name=p + "bias"),
        ]
        x = p + "out"
    graph = helper.make_graph(
        nodes,
        "norms",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, None])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, C, None])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model


def rewrite(model: onnx.ModelProto) -> onnx.ModelProto:
    assert add_norm_inputs(model) > 0
    onnx.checker.check_model(model)
    return model


def session(model: onnx.ModelProto) -> Any:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def reference(x: np.ndarray, stats: list[tuple[np.ndarray, np.ndarray]] | None) -> np.ndarray:
    """The graph in numpy: each norm with its own statistics, or the given ones."""
    for k in range(2):
        if stats is None:
            m, v = x.mean(axis=2, keepdims=True), x.var(axis=2, keepdims=True)
        else:
            m, v = stats[k]
        g = np.linspace(0.5, 1.5, C, dtype=np.float32).reshape(1, C, 1) * (k + 1)
        x = (x - m) / np.sqrt(v + EPS) * g + 0.1 * k
    return x


def signal(t: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((1, C, t)) * 3 + rng.standard_normal((1, C, 1))).astype(np.float32)


def test_the_decomposed_norms_are_found_in_order() -> None:
    norms = find_norms(norm_graph(3).graph)
    assert [n.mean.name for n in norms] == ["n0/mean", "n1/mean", "n2/mean"]
    assert [n.add.name for n in norms] == ["n0/add", "n1/add", "n2/add"]


def test_a_graph_without_instance_norms_is_not_rewritten() -> None:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "plain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, None])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, C, None])],
    )
    model = helper.make_model(graph)
    assert add_norm_inputs(model) == 0
    assert [n.op_type for n in model.graph.node] == ["Relu"], "unchanged"


def test_weight_one_computes_exactly_what_the_original_graph_computes() -> None:
    model = norm_graph()
    x = signal(37)
    (want,) = session(model).run(None, {"x": x})
    rewritten = rewrite(model)
    assert norm_count(rewritten) == 2
    got = session(rewritten).run(["n1/out"], {"x": x, **own_feeds(2)})[0]
    np.testing.assert_array_equal(got, want)


def test_weight_zero_applies_the_given_statistics_and_the_window_is_local() -> None:
    rewritten = rewrite(norm_graph())
    sess = session(rewritten)
    rng = np.random.default_rng(1)
    stats = [
        (
            rng.standard_normal((1, C, 1)).astype(np.float32),
            rng.uniform(0.5, 4, (1, C, 1)).astype(np.float32),
        )
        for _ in range(2)
    ]
    given_stats = NormStats(tuple(m for m, _ in stats), tuple(v for _, v in stats))
    x = signal(60, seed=2)
    whole = sess.run(["n1/out"], {"x": x, **given_stats.feeds()})[0]
    np.testing.assert_allclose(whole, reference(x, stats), rtol=1e-4, atol=1e-4)
    # with given statistics a pointwise decoder is local: any window is the sentence's slice
    window = sess.run(["n1/out"], {"x": x[:, :, 10:25], **given_stats.feeds()})[0]
    np.testing.assert_allclose(window, whole[:, :, 10:25], rtol=1e-5, atol=1e-5)
    # ... and with its own statistics it is not
    own = sess.run(["n1/out"], {"x": x[:, :, 10:25], **own_feeds(2)})[0]
    assert np.abs(own - whole[:, :, 10:25]).max() > 0.1


def test_the_windows_own_statistics_are_reported_with_weight_one() -> None:
    rewritten = rewrite(norm_graph())
    x = signal(50, seed=3)
    names = [MEAN_OUTPUT.format(0), VAR_OUTPUT.format(0)]
    mean, var = session(rewritten).run(names, {"x": x, **own_feeds(2)})
    np.testing.assert_allclose(mean, x.mean(axis=2, keepdims=True), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(var, x.var(axis=2, keepdims=True), rtol=1e-4, atol=1e-5)
    # statistics measured on the sentence, given back, reproduce its own rendering
    m1, v1 = session(rewritten).run(
        [MEAN_OUTPUT.format(1), VAR_OUTPUT.format(1)], {"x": x, **own_feeds(2)}
    )
    stats = NormStats((mean, m1), (var, v1))
    given_out = session(rewritten).run(["n1/out"], {"x": x, **stats.feeds()})[0]
    own_out = session(rewritten).run(["n1/out"], {"x": x, **own_feeds(2)})[0]
    np.testing.assert_allclose(given_out, own_out, rtol=1e-4, atol=1e-4)
    assert NORM_WEIGHT in stats.feeds()


@settings(max_examples=50, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 40), min_size=1, max_size=5),
    seed=st.integers(0, 2**16),
)
def test_pooling_sentences_gives_the_statistics_of_all_their_frames(
    lengths: list[int], seed: int
) -> None:
    rng = np.random.default_rng(seed)
    sentences = [
        (rng.standard_normal((1, C, n)) * rng.uniform(0.1, 5) + rng.uniform(-3, 3)) for n in lengths
    ]
    samples = [
        (s.shape[2], [s.mean(axis=2, keepdims=True)], [s.var(axis=2, keepdims=True)])
        for s in sentences
    ]
    stats = pool(samples)
    frames = np.concatenate(sentences, axis=2)
    np.testing.assert_allclose(
        stats.means[0], frames.mean(axis=2, keepdims=True), rtol=1e-4, atol=1e-4
    )
    np.testing.assert_allclose(
        stats.variances[0], frames.var(axis=2, keepdims=True), rtol=1e-3, atol=1e-3
    )


def test_statistics_round_trip_and_bad_bytes_are_refused() -> None:
    stats = NormStats(
        (np.ones((1, 3, 1), np.float32), np.zeros((1, 2, 1), np.float32)),
        (np.full((1, 3, 1), 2.0, np.float32), np.ones((1, 2, 1), np.float32)),
    )
    back = NormStats.from_bytes(stats.to_bytes(), 2)
    for a, b in zip(back.means + back.variances, stats.means + stats.variances, strict=True):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError):
        NormStats.from_bytes(stats.to_bytes(), 3)  # another decoder: more norms
    with pytest.raises(ValueError):
        NormStats.from_bytes(stats.to_bytes(), 1)  # fewer
    with pytest.raises(ValueError):
        NormStats.from_bytes(b"not a statistics file", 2)
    with pytest.raises(ValueError):
        NormStats((np.full((1, 3, 1), np.nan, np.float32),), (np.ones((1, 3, 1), np.float32),))
    with pytest.raises(ValueError):
        NormStats((np.zeros((1, 3, 1), np.float32),), (-np.ones((1, 3, 1), np.float32),))
    with pytest.raises(ValueError):
        NormStats((np.zeros((3,), np.float32),), (np.ones((3,), np.float32),))


@settings(max_examples=60, deadline=None)
@given(data=st.binary(max_size=400))
def test_any_bytes_are_statistics_or_a_value_error(data: bytes) -> None:
    try:
        NormStats.from_bytes(data, 2)
    except ValueError:
        pass


def test_the_cache_measures_again_what_it_cannot_trust(tmp_path: Path) -> None:
    cache = NormCache(tmp_path / "norms")
    stats = NormStats((np.ones((1, 3, 1), np.float32),), (np.ones((1, 3, 1), np.float32),))
    key = voice_key("model:int8", np.ones((4, 1, 8), np.float32))
    assert cache.get(key, 1) is None
    cache.put(key, stats)
    got = cache.get(key, 1)
    assert got is not None
    np.testing.assert_array_equal(got.means[0], stats.means[0])
    (tmp_path / "norms" / f"{key}.npz").write_bytes(b"\x00" * 20)  # corrupt
    assert cache.get(key, 1) is None
    assert voice_key("model:int8", np.zeros((4, 1, 8), np.float32)) != key, "another voice"
    assert voice_key("model:fp32", np.ones((4, 1, 8), np.float32)) != key, "another decoder"


class FakeNormBackend:
    """``VoiceNorms``'s view of a backend: counts the sentences it measures."""

    norm_count = 1

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.measured = 0

    def prosody(self, tokens: Any, style: Any, speed: float, cancel: CancelToken) -> Any:
        return len(tokens)

    def sentence_norms(
        self, prosody: Any, style: Any, cancel: CancelToken
    ) -> tuple[int, list[Any], list[Any]]:
        if self.fail:
            raise RuntimeError("the decoder cannot run")
        self.measured += 1
        return prosody, [np.full((1, 2, 1), prosody, np.float32)], [np.ones((1, 2, 1), np.float32)]


def voice_norms(backend: FakeNormBackend, cache: Path) -> VoiceNorms:
    return VoiceNorms(backend, lambda text: list(range(len(text.split()))), cache, "model:int8")


def test_a_voice_is_measured_once_then_read_from_the_cache(tmp_path: Path) -> None:
    voice = np.ones((510, 1, 8), np.float32)
    first = FakeNormBackend()
    stats = voice_norms(first, tmp_path).get("v", voice)
    assert stats is not None and first.measured == len(CALIBRATION_TEXTS)
    words = [len(t.split()) for t in CALIBRATION_TEXTS]
    # pooled over the calibration sentences' frames (here: one frame per word)
    assert stats.means[0][0, 0, 0] == pytest.approx(sum(w * w for w in words) / sum(words))
    again = FakeNormBackend()
    norms = voice_norms(again, tmp_path)
    assert norms.get("v", voice) is not None and again.measured == 0, "cached"
    assert norms.get("other", voice * 2) is not None and again.measured == len(CALIBRATION_TEXTS)
    other_texts = FakeNormBackend()
    changed = VoiceNorms(other_texts, lambda t: [1, 2], tmp_path, "model:int8", texts=("Hi.",))
    assert changed.get("v", voice) is not None and other_texts.measured == 1, "other texts"


def test_a_voice_that_cannot_be_measured_keeps_its_own_statistics(tmp_path: Path) -> None:
    failing = FakeNormBackend(fail=True)
    norms = voice_norms(failing, tmp_path)
    assert norms.get("v", np.ones((510, 1, 8), np.float32)) is None
    assert not list(tmp_path.glob("*.npz")), "nothing cached"
    failing.fail = False
    assert norms.get("v", np.ones((510, 1, 8), np.float32)) is None, "not measured per utterance"


def test_other_voices_are_measured_in_the_background_and_never_waited_for(
    tmp_path: Path,
) -> None:
    backend = FakeNormBackend()
    norms = voice_norms(backend, tmp_path)
    voices = {"a": np.ones((510, 1, 8), np.float32), "b": np.zeros((510, 1, 8), np.float32)}
    assert norms.ready("a") is None, "not measured yet: the windows take their own"
    norms.measure_in_background(voices)
    assert norms._thread is not None
    norms._thread.join(30)
    assert norms.ready("a") is not None and norms.ready("b") is not None
    assert backend.measured == 2 * len(CALIBRATION_TEXTS)
    norms.close()


class StoppableNormBackend(FakeNormBackend):
    """Its first sentence runs until it is cancelled (a call arrives)."""

    def __init__(self) -> None:
        super().__init__()
        self.started = threading.Event()
        self.stopped = 0

    def sentence_norms(
        self, prosody: Any, style: Any, cancel: CancelToken
    ) -> tuple[int, list[Any], list[Any]]:
        if not self.started.is_set():
            self.started.set()
            deadline = time.monotonic() + 30
            while not cancel.cancelled and time.monotonic() < deadline:
                time.sleep(0.005)
            self.stopped += 1
            raise SynthesisCancelled()
        return super().sentence_norms(prosody, style, cancel)


def test_the_background_measurement_waits_while_calls_are_in_progress(tmp_path: Path) -> None:
    backend = StoppableNormBackend()
    calls = [0]
    words = lambda text: list(range(len(text.split())))  # noqa: E731
    norms = VoiceNorms(backend, words, tmp_path, "m", busy=lambda: calls[0] > 0)
    voices = {"a": np.ones((510, 1, 8), np.float32)}
    assert norms.pending() == 0, "nothing to do before it starts"
    norms.measure_in_background(voices)
    assert backend.started.wait(10)
    assert norms.pending() == 1, "the voice being measured is still to do"
    calls[0] = 1  # an utterance starts: the sentence being measured stops
    norms.yield_to_calls()
    deadline = time.monotonic() + 10
    while not backend.stopped and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(0.3)  # (several idle polls)
    assert backend.stopped == 1 and backend.measured == 0, "nothing measured during the call"
    calls[0] = 0  # idle again: measured, the stopped sentence included
    assert norms._thread is not None
    norms._thread.join(30)
    assert norms.ready("a") is not None and norms.yielded == 1
    assert backend.measured == len(CALIBRATION_TEXTS)
    assert norms.pending() == 0
    norms.close()


def test_pending_counts_the_voices_left_to_the_background_and_a_close_ends_them(
    tmp_path: Path,
) -> None:
    backend = StoppableNormBackend()  # its first sentence runs until it is stopped
    norms = voice_norms(backend, tmp_path)
    voices = {v: np.full((510, 1, 8), k, np.float32) for k, v in enumerate("abc")}
    backend.started.set()  # (so that this one runs through)
    norms.get("a", voices["a"])  # the default voice, measured before the engine docks
    backend.started.clear()
    norms.measure_in_background(voices)
    assert backend.started.wait(10)
    assert norms.pending() == 2, "b (being measured) and c"
    norms.close()  # the engine stops: nothing is left to wait for
    assert norms.pending() == 0


@pytest.fixture(scope="module")
def synth(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KokoroSynthesizer]:
    engine = KokoroSynthesizer(
        KokoroConfig(
            models_dir=shared_models_dir(tmp_path_factory),
            prompt_cache_mb=0,
            lang="en",
            plan="int8",
        )
    )
    engine.load()
    yield engine
    engine.close()


def windowed(backend: OnnxBackend, prosody: Prosody, style: Any, context: int) -> np.ndarray:
    """The sentence decoded in 32-frame windows with ``context`` frames on each side."""
    parts = []
    n = prosody.n_frames
    for start in range(0, n, 32):
        end = min(n, start + 32)
        a, b = max(0, start - context), min(n, end + context)
        audio = backend.decode(prosody, a, b, style, CancelToken())
        parts.append(audio[(start - a) * FRAME_SAMPLES : (end - a) * FRAME_SAMPLES])
    return np.concatenate(parts)


def test_windows_with_the_voices_statistics_decode_like_the_whole_sentence(
    synth: KokoroSynthesizer,
) -> None:
    backend = synth._backend
    # the frame stage's 10 norms and the generator's 44
    assert isinstance(backend, OnnxBackend) and backend.norm_count == 54
    assert backend.frame_norms == 10
    stats = synth.voice_norms(DEFAULT_VOICE)
    assert stats is not None
    # a short first word after the leading pad: the case a short first window lost
    tokens = synth._tokens_of("Sure, your order has been shipped, it arrives today.")
    style = synth._voices[DEFAULT_VOICE][len(tokens) - 1]
    own = backend.prosody(tokens, style, 1.0, CancelToken())
    voiced = replace(own, norms=stats)
    n = own.n_frames
    with_voice = spectral_distance(
        backend.decode(voiced, 0, n, style, CancelToken()),
        # each window runs the frame stage on its own frames (no features kept between)
        windowed(backend, replace(voiced, span=FeatureSpan()), style, FIXED_CONTEXT_FRAMES),
    )
    with_own = spectral_distance(
        backend.decode(own, 0, n, style, CancelToken()),
        windowed(backend, own, style, CONTEXT_FRAMES),
    )
    # measured: 0.7-0.8 dB (the decoder's own noise source differs per run) against 5-6 dB
    assert with_voice < 1.5, (with_voice, with_own)
    assert with_own > 2 * with_voice, (with_voice, with_own)


def test_a_short_sentence_keeps_its_own_statistics_and_its_level(
    synth: KokoroSynthesizer, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # the voice's statistics, pooled over ordinary sentences, rendered "Hello" at 2 % of
    # its RMS: a sentence this short takes its own (it is one window anyway)
    whole = KokoroSynthesizer(
        KokoroConfig(models_dir=shared_models_dir(tmp_path_factory), prompt_cache_mb=0, split=False)
    )
    whole.load()
    try:
        for text in ("Hello", "Yes.", "Thank you."):
            ours = np.concatenate(speak(synth, text, CallState(call_id=5)))
            ref = np.concatenate(speak(whole, text, CallState(call_id=5)))
            assert 0.9 <= len(ours) / len(ref) <= 1.1, text
            assert 0.8 <= rms(ours) / rms(ref) <= 1.25, text
    finally:
        whole.close()


def test_later_windows_share_one_frame_stage_run_and_decode_alike(
    synth: KokoroSynthesizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = synth._backend
    assert isinstance(backend, OnnxBackend)
    stats = synth.voice_norms(DEFAULT_VOICE)
    assert stats is not None
    tokens = synth._tokens_of(
        "Your package will arrive on Thursday between nine and noon, and the driver will "
        "call you when he is close."
    )
    style = synth._voices[DEFAULT_VOICE][len(tokens) - 1]
    prosody = replace(backend.prosody(tokens, style, 1.0, CancelToken()), norms=stats)
    assert prosody.features is None  # the frame stage runs in the windows
    runs: list[tuple[int, int]] = []
    frame = backend._frame

    def counted(p: Prosody, start: int, end: int, *args: Any, **kw: Any) -> list[Any]:
        if p.asr is prosody.asr:  # not another voice's measurement in the background
            runs.append((start, end))
        return frame(p, start, end, *args, **kw)

    monkeypatch.setattr(backend, "_frame", counted)
    n = prosody.n_frames
    cuts = [*range(0, n, 16), n]

    def decode_all(ahead: int) -> np.ndarray:
        p = replace(prosody, span=FeatureSpan())
        parts = []
        for a, b in itertools.pairwise(cuts):
            lo, hi = max(0, a - 2), min(n, b + 2)
            audio = backend.decode(p, lo, hi, style, CancelToken(), ahead)
            parts.append(audio[(a - lo) * FRAME_SAMPLES : (b - lo) * FRAME_SAMPLES])
        return np.concatenate(parts)

    each = decode_all(0)
    each_runs = len(runs)
    runs.clear()
    shared = decode_all(64)
    # one run per window (but a last window within the margin of the one before)
    assert each_runs >= len(cuts) - 2
    assert len(runs) <= -(-n // 64) + 1  # one per 64 frames
    # the same features but for the int8 activation scale of each run (graph_split)
    assert spectral_distance(each, shared) < 0.5


def test_after_the_first_window_the_frame_stage_takes_the_sentences_own_statistics(
    synth: KokoroSynthesizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first window runs the frame stage on its own frames with the voice's
    statistics (its first audio waits for nothing more); once the audio queued ahead
    pays for it (``pacing`` Rule 5) the frame stage runs once over the whole sentence
    with the sentence's own statistics, and the windows after that slice it, their
    generator norms keeping the voice's (README "Kokoro pipeline"). Where the listener
    has played everything, the queue never pays for it, and every window keeps its own
    run."""
    backend = synth._backend
    assert isinstance(backend, OnnxBackend)
    stats = synth.voice_norms(DEFAULT_VOICE)
    assert stats is not None
    text = "Could you spell your last name for me, please, and then the city you live in?"
    frames: list[tuple[int, int, bool]] = []  # (start, end, the voice's statistics)
    decodes: list[tuple[int, int, bool, bool]] = []  # (start, end, features, voice's)
    frame, decode = backend._frame, backend.decode

    def spied_frame(p: Prosody, start: int, end: int, style: Any, norms: Any, *a: Any) -> Any:
        if threading.current_thread().name != "kokoro-voice-norms":  # not another voice's
            frames.append((start, end, norms is stats))
        return frame(p, start, end, style, norms, *a)

    def spied_decode(p: Prosody, start: int, end: int, *a: Any) -> Any:
        decodes.append((start, end, p.features is not None, p.norms is stats))
        return decode(p, start, end, *a)

    monkeypatch.setattr(backend, "_frame", spied_frame)
    monkeypatch.setattr(backend, "decode", spied_decode)
    monkeypatch.setattr(synth.config, "parallel_windows", 1)  # one window at a time
    monkeypatch.setattr(synth.config, "max_window", 32)  # several windows
    # a machine decoding at 0.3 s per audio second: the plan and the listener's clock
    # pinned, so that the run is the same on any machine (kokoro_helpers.speak_at)
    monkeypatch.setattr(synth.config, "assume_rtf", 0.3)
    speak_at(synth, text, 0.3, call_id=31)
    n = max(end for _, end, _, _ in decodes)  # (the trailing silence is not decoded)
    assert len(decodes) >= 4, decodes
    whole = [k for k, f in enumerate(frames) if f[0] == 0 and f[1] >= n]
    assert len(whole) == 1, frames  # once, over the whole sentence ...
    assert not frames[whole[0]][2], frames  # ... with its own statistics
    assert whole[0] >= 1 and all(f[2] and f[1] < n for f in frames[: whole[0]]), frames
    assert frames[whole[0] + 1 :] == [], frames  # the windows after it slice it
    sliced = [d for d in decodes if d[2]]
    assert len(sliced) >= 2 and all(d[3] for d in decodes), decodes
    assert not decodes[0][2], decodes  # the first window: its own frames
    assert decodes[-len(sliced) :] == sliced, decodes
    # the same plan, but a listener that has always played everything (a machine far
    # slower than planned): the queue never pays for the whole run
    frames.clear()
    decodes.clear()
    state = CallState(call_id=32)
    state.playback = PlaybackMeter(lambda: 10.0)  # 10 s after the first packet, always
    for chunk in synth.synthesize(text, state, CancelToken()):
        state.playback.sent(len(chunk), 0.0)
    assert len(decodes) >= 2 and not any(d[2] for d in decodes), decodes
    assert frames and all(f[2] for f in frames), frames
    # no listener (an offline synthesis): nothing to keep up with, the run at once
    frames.clear()
    decodes.clear()
    list(synth.synthesize(text, CallState(call_id=33), CancelToken()))
    assert len(frames) == 2 and frames[0][2] and not frames[1][2], frames
    assert not decodes[0][2] and all(d[2] for d in decodes[1:]), decodes


def test_the_first_gang_runs_the_frame_stage_on_its_own_frames_only(
    synth: KokoroSynthesizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing but the first windows' own frames delays the first audio: a first gang
    (two windows at once, the utterance alone on two cores) runs the frame stage on its
    windows and ``FRAME_MARGIN`` frames around them, not on the frames of the windows
    after it (``FRAME_AHEAD``, which later windows run ahead)."""
    backend = synth._backend
    assert isinstance(backend, OnnxBackend)
    frames: list[tuple[int, int]] = []
    decodes: list[tuple[int, int]] = []
    frame, decode = backend._frame, backend.decode

    def spied_frame(p: Prosody, start: int, end: int, *a: Any) -> Any:
        if threading.current_thread().name != "kokoro-voice-norms":  # not another voice's
            frames.append((start, end))
        return frame(p, start, end, *a)

    def spied_decode(p: Prosody, start: int, end: int, *a: Any) -> Any:
        decodes.append((start, end))
        return decode(p, start, end, *a)

    monkeypatch.setattr(backend, "_frame", spied_frame)
    monkeypatch.setattr(backend, "decode", spied_decode)
    monkeypatch.setattr(synth.config, "parallel_windows", 2)
    monkeypatch.setattr(synth.config, "assume_rtf", 0.3)
    state = CallState(call_id=34)
    gen = synth.synthesize(
        "Could you spell your last name for me, please, and then the city you live in?",
        state,
        CancelToken(),
    )
    set_unit_grant(UnitGrant(cores=2, cpus=2, others=0))  # alone on two cores
    try:
        assert len(next(gen)) > 0
    finally:
        set_unit_grant(None)
        gen.close()
    # the first chunk came from a gang: two windows decoded at once (one alone otherwise)
    assert len(decodes) == 2 and decodes[0][1] > decodes[1][0] and frames, (decodes, frames)
    gang_end = max(end for _, end in decodes)
    assert frames[0][1] <= gang_end + FRAME_MARGIN, (frames, decodes)


def test_an_utterance_in_progress_holds_the_background_measurement(
    synth: KokoroSynthesizer,
) -> None:
    norms = synth._norms
    assert norms is not None and not norms.busy()
    gen = synth.synthesize("Hello there, one moment please.", CallState(call_id=5), CancelToken())
    next(gen)
    assert norms.busy(), "voice_norms Rule 4: the call comes first"
    gen.close()
    assert not norms.busy()
