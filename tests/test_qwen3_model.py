"""Model core: projection maths, cached vs recomputed attention, sampling, frame loop."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import qwen3_helpers as qh
import torch
import torch.nn.functional as F
from qwen3_measure import measure_frames_per_second

from engines.qwen3.model.frame_batch import FrameBatch, StepShape
from engines.qwen3.modes import PresetSpeaker
from engines.qwen3.serving.frame_generator import FrameGenerator
from engines.qwen3.serving.request import ModeSynthesizeRequest
from engines.runtime.synth import SynthesisCancelled


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory):
    """Talker width 4, predictor width 2: the 4->2 projection with bias."""
    return qh.build_tiny_engine(tmp_path_factory.mktemp("split"), hidden=4, cp_hidden=2)


@pytest.fixture(scope="module")
def equal(tmp_path_factory: pytest.TempPathFactory):
    return qh.build_tiny_engine(tmp_path_factory.mktemp("equal"), hidden=4, cp_hidden=4)


def test_projection_4_to_2_with_bias(split) -> None:
    eng, _, cfg = split
    m = eng.model
    assert m.has_projection
    arrays = qh.state_dict_arrays(cfg)
    w = arrays["talker.code_predictor.small_to_mtp_projection.weight"]
    b = arrays["talker.code_predictor.small_to_mtp_projection.bias"]
    assert w.shape == (2, 4) and b.shape == (2,)
    x = np.array([[1.0, -2.0, 0.5, 3.0], [0.0, 0.0, 0.0, 0.0]], np.float32)
    got = m.project_to_predictor(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, x @ w.T + b, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got[1], b, rtol=0, atol=0)  # zero input -> the bias
    # pre-projected predictor tables are the projection of the talker-width tables
    cp0 = arrays["talker.code_predictor.model.codec_embedding.0.weight"]
    np.testing.assert_allclose(m.cp_embd_in[0].numpy(), cp0 @ w.T + b, rtol=1e-5, atol=1e-6)


def test_equal_widths_use_identity(equal) -> None:
    eng, _paths, _ = equal
    assert not eng.model.has_projection
    assert eng.model.cp_embd_in is eng.model.cp_embd


def _recompute_codes(eng: FrameGenerator, h: torch.Tensor, code0: int) -> tuple[list[int], list]:
    """The predictor without a KV cache: rerun the whole sequence for every step."""
    m = eng.model
    seq = [m.project_to_predictor(h), m.project_to_predictor(m.codec_embd[code0])]
    codes: list[int] = []
    hiddens = []
    for g in range(m.cp_heads.shape[0]):
        x = torch.stack(seq)
        out = m.cp.forward(x[None], torch.zeros(1, dtype=torch.long), m.cp.new_cache(18))[0, -1]
        hiddens.append(out)
        c = int(torch.argmax(F.linear(out, m.cp_heads[g])))
        codes.append(c)
        seq.append(m.project_to_predictor(m.cp_embd[g][c]))
    return codes, hiddens


@pytest.mark.parametrize("which", ["split", "equal"])
def test_cached_predictor_equals_recompute(which: str, request: pytest.FixtureRequest) -> None:
    eng = request.getfixturevalue(which)[0]
    torch.manual_seed(0)
    fb = FrameBatch(eng.model, max_batch=3, max_context=16, eos=2150, suppress=eng.suppress)
    with torch.inference_mode():
        fb.h[:] = torch.randn(3, eng.meta.talker.hidden_size)
        fb.frame_codes(3, StepShape(0, 0, False, False), None)  # all greedy: the defaults
        for row in range(3):
            code0 = int(fb.codes[row, 0])
            want, _ = _recompute_codes(eng, fb.h[row], code0)
            assert fb.codes[row, 1:].tolist() == want


@pytest.mark.parametrize("which", ["split", "equal"])
def test_cached_talker_equals_recompute(which: str, request: pytest.FixtureRequest) -> None:
    eng = request.getfixturevalue(which)[0]
    t = eng.model.talker
    torch.manual_seed(1)
    x = torch.randn(9, eng.meta.talker.hidden_size)

    def at(p: int) -> torch.Tensor:
        return torch.tensor([p])

    with torch.inference_mode():
        full = t.forward(x[None], at(0), t.new_cache(10))[0]
        cache = t.new_cache(10)
        part = [t.forward(x[None, :5], at(0), cache)[0]]
        part += [t.forward(x[None, i : i + 1], at(i), cache)[0] for i in range(5, 7)]
        part.append(t.forward(x[None, 7:9], at(7), cache)[0])  # multi-row chunk at an offset
    np.testing.assert_allclose(torch.cat(part).numpy(), full.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("which", ["split", "equal"])
def test_batched_rows_at_their_own_positions_equal_single_rows(
    which: str, request: pytest.FixtureRequest
) -> None:
    """Three cache rows holding prefixes of different lengths, stepped together."""
    eng = request.getfixturevalue(which)[0]
    t = eng.model.talker
    torch.manual_seed(2)
    xs = [torch.randn(n, eng.meta.talker.hidden_size) for n in (3, 6, 1)]
    step = torch.randn(3, 1, eng.meta.talker.hidden_size)
    with torch.inference_mode():
        batch = t.new_cache(12, batch=3)
        for b, x in enumerate(xs):  # each row's prefill alone, in its own cache row
            t.forward(x[None], torch.tensor([0]), batch.rows(b, b + 1))
        pos = torch.tensor([3, 6, 1])
        got = t.forward(step, pos, batch)[:, 0]
        for b, x in enumerate(xs):
            alone = t.new_cache(12)
            want = t.forward(torch.cat((x, step[b]))[None], torch.tensor([0]), alone)[0, -1]
            np.testing.assert_allclose(got[b].numpy(), want.numpy(), rtol=1e-4, atol=1e-5)
        # a padding row (valid False) writes only to the scratch position
        before = batch.kv.clone()
        valid = torch.tensor([True, False, True])
        t.forward(step, pos + 1, batch, lengths=valid.long())
        np.testing.assert_array_equal(batch.kv[:, 1, :11].numpy(), before[:, 1, :11].numpy())
        # prompts of different lengths prefilled in one padded call into chosen cache rows
        padded = torch.zeros(2, 6, eng.meta.talker.hidden_size)
        padded[0, :3], padded[1] = xs[0], xs[1]
        other = t.new_cache(12, batch=4)
        out = t.forward(
            padded,
            torch.tensor([0, 0]),
            other,
            lengths=torch.tensor([3, 6]),
            rows=torch.tensor([2, 0]),
        )
        np.testing.assert_allclose(
            other.kv[:, 2, :3].numpy(), batch.kv[:, 0, :3].numpy(), atol=1e-5
        )
        np.testing.assert_allclose(
            other.kv[:, 0, :6].numpy(), batch.kv[:, 1, :6].numpy(), atol=1e-5
        )
        alone = t.forward(xs[0][None], torch.tensor([0]), t.new_cache(12))[0, -1]
        np.testing.assert_allclose(out[0, 2].numpy(), alone.numpy(), rtol=1e-4, atol=1e-5)


def test_sampling_is_seedable_and_greedy_is_deterministic(split) -> None:
    eng = split[0]
    base = dict(text="Hello world", speaker=PresetSpeaker.Ryan, max_frames=8)
    a, _ = eng.generate_codes(ModeSynthesizeRequest(**base, seed=5))
    b, _ = eng.generate_codes(ModeSynthesizeRequest(**base, seed=5))
    c, _ = eng.generate_codes(ModeSynthesizeRequest(**base, seed=6))
    np.testing.assert_array_equal(a, b)
    assert a.shape[1] == 16 and not np.array_equal(a, c)
    g1, _ = eng.generate_codes(ModeSynthesizeRequest(**base, greedy=True, seed=1))
    g2, _ = eng.generate_codes(ModeSynthesizeRequest(**base, greedy=True, seed=2))
    np.testing.assert_array_equal(g1, g2)
    assert (a[:, 0] < 2048).all() and (a >= 0).all() and (a[:, 1:] < 2048).all()
    top1, _ = eng.generate_codes(
        ModeSynthesizeRequest(**base, seed=3, top_k=1, subtalker_top_k=1, repetition_penalty=1.05)
    )
    np.testing.assert_array_equal(top1, g1)  # top-k 1 sampling == greedy
    nucleus, _ = eng.generate_codes(
        ModeSynthesizeRequest(**base, seed=3, top_p=1e-6, subtalker_top_p=1e-6)
    )
    np.testing.assert_array_equal(nucleus, g1)


def test_iter_frames_streams_cancels_and_caps(split) -> None:
    eng = split[0]
    req = ModeSynthesizeRequest(text="Hello world", speaker="ryan", greedy=True, max_frames=5)
    frames = list(eng.iter_frames(req))
    codes, timings = eng.generate_codes(req)
    assert len(frames) <= 5 and all(f.dtype == np.int64 and f.shape == (16,) for f in frames)
    np.testing.assert_array_equal(np.stack(frames), codes)
    assert timings["frames"] == len(frames) and timings["code_predictor"] > 0
    # The scheduler thread polls ``cancel`` once before each frame step; the stream
    # polls it too, from this thread, whenever it waits for a frame, and how often it
    # waits depends on the machine's speed. So only the scheduler's polls count, and
    # only the scheduler sees the cancel: its third poll cancels, after exactly two
    # frame steps, and the scheduler queues the cancellation behind both frames. (Were
    # the stream's own poll to see it too, a stream that had just timed out waiting
    # could see it before the second frame, queued meanwhile, and hand out one frame.)
    consumer = threading.get_ident()
    scheduler_polls = []

    def cancel() -> bool:
        if threading.get_ident() == consumer:
            return False
        scheduler_polls.append(1)
        return len(scheduler_polls) > 2

    it = eng.iter_frames(
        ModeSynthesizeRequest(text="Hello", speaker="ryan", max_frames=50), cancel=cancel
    )
    got = []
    with pytest.raises(SynthesisCancelled):
        for f in it:
            got.append(f)
    assert len(got) == 2
    fps = measure_frames_per_second(eng, req, runs=1, warmup=0)
    assert fps["frames"] == len(frames) and fps["fps_best"] > 0


@pytest.mark.parametrize("dtype", ["f16", "q8_0"])
def test_quantized_exports_run(tmp_path, dtype: str) -> None:
    eng, paths, _ = qh.build_tiny_engine(tmp_path, dtype=dtype, hidden=64, cp_hidden=32)
    from engines.qwen3.weights.gguf_loader import GgufFile

    types = {t.type_name for t in GgufFile(paths.talker_gguf).tensors.values()}
    assert ("Q8_0" if dtype == "q8_0" else "F16") in types and "F32" in types
    codes, _ = eng.generate_codes(
        ModeSynthesizeRequest(text="Hello", speaker="ryan", greedy=True, max_frames=4)
    )
    assert codes.shape[1] == 16 and codes.shape[0] >= 1


def test_eos_stops_and_is_not_emitted(split) -> None:
    eng = split[0]
    # make EOS the only allowed talker output after the first two frames
    saved = eng.suppress.clone()
    try:
        eng.suppress[:] = float("-inf")
        eng.suppress[eng.meta.codec.eos] = 0.0
        codes, _ = eng.generate_codes(
            ModeSynthesizeRequest(text="Hello", speaker="ryan", greedy=True, max_frames=10)
        )
    finally:
        eng.suppress.copy_(saved)
    assert codes.shape == (2, 16) and (codes[:, 0] != eng.meta.codec.eos).all()
