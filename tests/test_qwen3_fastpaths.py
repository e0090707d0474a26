"""Speed paths of the Qwen3 engine, checked on the CPU against the plain paths.

* numpy single-row steps (small models) vs the torch steps: identical greedy codes;
* the tensor-position talker step (CUDA-graph form) vs the int-position step;
* the CUDA-graph frame loop run eagerly (capture replaced by a plain call) vs the
  normal loop: identical greedy codes, seeded sampling reproducible;
* the Gumbel-max draw: top-k 1 is argmax, frequencies follow the softmax.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import pytest
import qwen3_helpers as qh
import torch

from engines.qwen3.engine import Qwen3TtsEngine, _CudaGraphRunner, _draw, _gumbel, _sample
from engines.qwen3.model import NumpyStep
from engines.qwen3.request import ModeSynthesizeRequest, PresetSpeaker


@pytest.fixture(scope="module")
def eng(tmp_path_factory: pytest.TempPathFactory) -> Qwen3TtsEngine:
    e = qh.build_tiny_engine(tmp_path_factory.mktemp("fast"), hidden=64, cp_hidden=32)[0]
    assert e._np_cp is not None and e._np_talker is not None  # small model: numpy steps on
    return e


def _req(**kw: object) -> ModeSynthesizeRequest:
    base: dict[str, object] = dict(
        text="Hello world, the quick brown fox.", speaker=PresetSpeaker.Ryan, max_frames=12
    )
    base.update(kw)
    return ModeSynthesizeRequest(**base)  # type: ignore[arg-type]


def _torch_only(e: Qwen3TtsEngine, fn: Callable[[], np.ndarray]) -> np.ndarray:
    saved = e._np_cp, e._np_talker
    e._np_cp = e._np_talker = None
    try:
        return fn()
    finally:
        e._np_cp, e._np_talker = saved


def test_numpy_steps_match_torch_steps(eng: Qwen3TtsEngine) -> None:
    for stack in (eng.model.cp, eng.model.talker):
        step = NumpyStep(stack)
        torch.manual_seed(3)
        xs = torch.randn(9, stack.width)
        with torch.inference_mode():
            a, b = stack.new_cache(9), stack.new_cache(9)
            for i in range(9):
                want = stack.step(xs[i : i + 1], i, a)[0].numpy()
                got = step(xs[i].numpy(), i, b.kv.numpy())
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(b.kv.numpy(), a.kv.numpy(), rtol=1e-4, atol=1e-5)


def test_numpy_path_gives_the_torch_greedy_codes(eng: Qwen3TtsEngine) -> None:
    req = _req(greedy=True, max_frames=16)
    fast, _ = eng.generate_codes(req)
    plain = _torch_only(eng, lambda: eng.generate_codes(req)[0])
    assert fast.shape[0] > 1
    np.testing.assert_array_equal(fast, plain)


@pytest.mark.parametrize("numpy_path", [True, False])
def test_seeded_sampling_is_reproducible(eng: Qwen3TtsEngine, numpy_path: bool) -> None:
    def run(seed: int) -> np.ndarray:
        return eng.generate_codes(_req(seed=seed))[0]

    def go(seed: int) -> np.ndarray:
        return run(seed) if numpy_path else _torch_only(eng, lambda: run(seed))

    a, b, c = go(11), go(11), go(12)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert (a >= 0).all() and (a[:, 1:] < 2048).all() and (a[:, 0] < 2048).all()


def test_tensor_position_step_matches_int_step(eng: Qwen3TtsEngine) -> None:
    t = eng.model.talker
    torch.manual_seed(5)
    xs = torch.randn(7, t.width)
    cap = 16
    with torch.inference_mode():
        a, b = t.new_cache(cap), t.new_cache(cap)
        t.forward(xs[:3], 0, a)
        t.forward(xs[:3], 0, b)
        ar = torch.arange(cap)
        for i in range(3, 7):
            want = t.step(xs[i : i + 1], i, a)
            pos = torch.tensor([i])
            bias = torch.where(ar <= pos, 0.0, float("-inf"))
            got = t.step_at(xs[i : i + 1], pos, b, bias)
            np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)


class _EagerGraph:
    """Stands in for a captured CUDA graph: ``replay`` just calls the function."""

    def __init__(self, fn: Callable[[], None]) -> None:
        self.fn = fn
        fn()  # like the warm-up before a capture

    def replay(self) -> None:
        self.fn()


def _graph_codes(e: Qwen3TtsEngine, req: ModeSynthesizeRequest) -> np.ndarray:
    with torch.inference_mode():
        prep = e.prepare(req)
        runner = _CudaGraphRunner(e, req, prep.rows.shape[0] + req.max_frames, _EagerGraph)
        gen = torch.Generator()
        gen.manual_seed(int(req.seed or 0))
        e.timings = {"prefill": 0.0, "talker": 0.0, "code_predictor": 0.0, "frames": 0.0}
        frames = list(runner.run(prep, req, gen, None, time.perf_counter()))
    return np.stack(frames)


def test_graph_loop_gives_the_eager_greedy_codes(eng: Qwen3TtsEngine) -> None:
    req = _req(greedy=True, max_frames=14)
    want = _torch_only(eng, lambda: eng.generate_codes(req)[0])
    got = _torch_only(eng, lambda: _graph_codes(eng, req))
    np.testing.assert_array_equal(got, want)
    assert eng.timings["frames"] == len(got)


def test_graph_loop_sampling_is_seeded(eng: Qwen3TtsEngine) -> None:
    a = _torch_only(eng, lambda: _graph_codes(eng, _req(seed=4)))
    b = _torch_only(eng, lambda: _graph_codes(eng, _req(seed=4)))
    c = _torch_only(eng, lambda: _graph_codes(eng, _req(seed=5)))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_gumbel_draw_top1_is_argmax_and_follows_softmax() -> None:
    gen = torch.Generator()
    gen.manual_seed(0)
    logits = torch.tensor([0.0, 1.0, 2.0, -1.0, 0.5, 3.0, -4.0, 1.5])
    for _ in range(20):
        assert int(_sample(logits, 0.7, 1, 1.0, gen)) == 5
        assert int(_sample(logits, 0.7, 0, 1e-6, gen)) == 5
    n = 20000
    temp, k = 0.8, 4
    noise = _gumbel(n, k, torch.device("cpu"), gen)
    counts = np.zeros(8)
    for i in range(n):
        counts[int(_draw(logits, temp, k, 1.0, noise[i]))] += 1
    top = torch.topk(logits, k)
    want = np.zeros(8)
    want[top.indices.numpy()] = torch.softmax(top.values / temp, -1).numpy()
    np.testing.assert_allclose(counts / n, want, atol=0.015)
    assert counts[[0, 3, 6, 4]].sum() == 0  # outside the top 4: never drawn
