"""Speed paths of the Qwen3 engine, checked on the CPU against the eager batch step.

* the CUDA-graph step (``GraphSteps``, capture replaced by a plain call, whole-cache
  attention lengths, padded buckets) vs the eager step: identical greedy codes,
  seeded sampling reproducible;
* a capture failure drops that bucket and larger ones and falls back to eager;
* the batched Gumbel-max draw: top-k 1 is argmax, frequencies follow the softmax,
  per-row parameters do not leak between rows.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import qwen3_helpers as qh
import torch

from engines.qwen3.model.cuda_graphs import GraphSteps, bucket_sizes
from engines.qwen3.model.sampling import draw_rows, gumbel
from engines.qwen3.modes import PresetSpeaker
from engines.qwen3.serving.frame_generator import BatchOptions, FrameGenerator
from engines.qwen3.serving.request import ModeSynthesizeRequest
from engines.qwen3.serving.scheduler import BatchScheduler


@pytest.fixture(scope="module")
def eng(tmp_path_factory: pytest.TempPathFactory) -> FrameGenerator:
    return qh.build_tiny_engine(tmp_path_factory.mktemp("fast"), hidden=64, cp_hidden=32)[0]


def _req(**kw: object) -> ModeSynthesizeRequest:
    base: dict[str, object] = dict(
        text="Hello world, the quick brown fox.", speaker=PresetSpeaker.Ryan, max_frames=12
    )
    base.update(kw)
    return ModeSynthesizeRequest(**base)  # type: ignore[arg-type]


class _EagerGraph:
    """Stands in for a captured CUDA graph: ``replay`` just calls the function."""

    def __init__(self, fn: Callable[[], None]) -> None:
        self.fn = fn
        fn()  # like the warm-up before a capture

    def replay(self) -> None:
        self.fn()


def _graph_engine(eng: FrameGenerator, capture: Callable[..., object]) -> FrameGenerator:
    """A second engine on the same model whose scheduler replays ``GraphSteps``."""
    e = FrameGenerator(eng.model, eng.tokenizer, eng.mode, batching=BatchOptions(max_batch=4))
    sched = e.scheduler
    sched.graphs = GraphSteps(sched.batch, capture_fn=capture)  # type: ignore[arg-type]
    return e


def test_graph_steps_give_the_eager_greedy_codes(eng: FrameGenerator) -> None:
    g = _graph_engine(eng, _EagerGraph)
    reqs = [("a", _req(greedy=True, max_frames=14)), ("b", _req(greedy=True, text="Hi there."))]
    want = [eng.generate_codes(r)[0] for _, r in reqs]
    got = g.generate_batch(reqs)
    for w, r in zip(want, got, strict=True):
        assert r.error is None and r.codes is not None
        np.testing.assert_array_equal(r.codes, w)
    stats = g.batch_stats()
    assert stats["graph_steps"] > 0 and stats["graphs_captured"] >= 1
    g.close()


def test_graph_steps_sampling_is_seeded(eng: FrameGenerator) -> None:
    g = _graph_engine(eng, _EagerGraph)
    a = g.generate_codes(_req(seed=4))[0]
    b = g.generate_codes(_req(seed=4))[0]
    c = g.generate_codes(_req(seed=5))[0]
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    np.testing.assert_array_equal(a, eng.generate_codes(_req(seed=4))[0])  # == eager
    g.close()


def test_capture_failure_drops_the_bucket_and_falls_back(eng: FrameGenerator) -> None:
    calls: list[int] = []

    def flaky(fn: Callable[[], None]) -> _EagerGraph:
        calls.append(1)
        if len(calls) > 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return _EagerGraph(fn)

    g = _graph_engine(eng, flaky)
    sched: BatchScheduler = g.scheduler
    assert sched.graphs is not None
    one = g.generate_codes(_req(greedy=True))[0]  # bucket 1 captured
    res = g.generate_batch([("x", _req(greedy=True)), ("y", _req(greedy=True))])  # bucket 2 fails
    assert all(r.error is None for r in res)
    for r in res:
        assert r.codes is not None
        np.testing.assert_array_equal(r.codes, one)
    assert sched.graphs.buckets == [1] and sched.graphs.failed == 1
    g.close()
    assert bucket_sizes(64) == [1, 2, 4, 8, 16, 32, 64] and bucket_sizes(6) == [1, 2, 4, 6]


def _draw1(logits: torch.Tensor, temp: float, k: int, top_p: float, noise: torch.Tensor) -> int:
    got = draw_rows(
        logits[None],
        torch.tensor([False]),
        torch.tensor([temp]),
        torch.tensor([k]),
        torch.tensor([top_p]),
        noise[None],
    )
    return int(got[0])


def test_gumbel_draw_top1_is_argmax_and_follows_softmax() -> None:
    gen = torch.Generator()
    gen.manual_seed(0)
    logits = torch.tensor([0.0, 1.0, 2.0, -1.0, 0.5, 3.0, -4.0, 1.5])
    for _ in range(20):
        assert _draw1(logits, 0.7, 1, 1.0, gumbel((8,), torch.device("cpu"), gen)) == 5
        assert _draw1(logits, 0.7, 8, 1e-6, gumbel((8,), torch.device("cpu"), gen)) == 5
    n = 20000
    temp, k = 0.8, 4
    noise = gumbel((n, k), torch.device("cpu"), gen)
    rows = draw_rows(
        logits.expand(n, 8),
        torch.zeros(n, dtype=torch.bool),
        torch.full((n,), temp),
        torch.full((n,), k),
        torch.ones(n),
        noise,
    )
    counts = np.bincount(rows.numpy(), minlength=8).astype(float)
    top = torch.topk(logits, k)
    want = np.zeros(8)
    want[top.indices.numpy()] = torch.softmax(top.values / temp, -1).numpy()
    np.testing.assert_allclose(counts / n, want, atol=0.015)
    assert counts[[0, 3, 6, 4]].sum() == 0  # outside the top 4: never drawn


def test_draw_rows_keeps_each_rows_parameters() -> None:
    """A greedy row, a top-1 row and a wide row in one call: none changes the others."""
    gen = torch.Generator()
    gen.manual_seed(1)
    logits = torch.tensor([[0.0, 5.0, 1.0, 4.9], [2.0, 0.0, 3.0, 1.0], [0.0, 1.0, 2.0, 9.0]])
    noise = torch.full((3, 4), 50.0)
    noise[2] = torch.tensor([0.0, 50.0, 0.0, 0.0])  # row 2: its second-best id wins
    got = draw_rows(
        logits,
        torch.tensor([True, False, False]),
        torch.tensor([1.0, 1.0, 1.0]),
        torch.tensor([1, 1, 4]),
        torch.tensor([1.0, 1.0, 1.0]),
        noise,
    )
    assert got.tolist() == [1, 2, 2]
    ones = torch.ones(3)
    greedy = torch.ones(3, dtype=torch.bool)
    no_noise = torch.zeros(3, 0)  # every row greedy: no noise columns at all
    assert draw_rows(logits, greedy, ones, ones.long(), ones, no_noise).tolist() == [1, 2, 3]
