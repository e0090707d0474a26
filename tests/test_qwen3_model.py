"""Model core: projection maths, cached vs recomputed attention, sampling, frame loop."""

from __future__ import annotations

import numpy as np
import pytest
import qwen3_helpers as qh
import torch
import torch.nn.functional as F

from engines.qwen3.engine import Qwen3TtsEngine, measure_frames_per_second
from engines.qwen3.request import ModeSynthesizeRequest, PresetSpeaker
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


def _recompute_codes(eng: Qwen3TtsEngine, h: torch.Tensor, code0: int) -> tuple[list[int], list]:
    """The predictor without a KV cache: rerun the whole sequence for every step."""
    m = eng.model
    seq = [m.project_to_predictor(h), m.project_to_predictor(m.codec_embd[code0])]
    codes: list[int] = []
    hiddens = []
    for g in range(m.cp_heads.shape[0]):
        x = torch.stack(seq)
        out = m.cp.forward(x, 0, m.cp.new_cache(x.shape[0]))[-1]
        hiddens.append(out)
        c = int(torch.argmax(F.linear(out, m.cp_heads[g])))
        codes.append(c)
        seq.append(m.project_to_predictor(m.cp_embd[g][c]))
    return codes, hiddens


@pytest.mark.parametrize("which", ["split", "equal"])
def test_cached_predictor_equals_recompute(which: str, request: pytest.FixtureRequest) -> None:
    eng = request.getfixturevalue(which)[0]
    req = ModeSynthesizeRequest(text="Hello world", speaker=PresetSpeaker.Ryan, greedy=True)
    torch.manual_seed(0)
    with torch.inference_mode():
        for trial in range(3):
            h = torch.randn(eng.meta.talker.hidden_size)
            code0 = 17 + 100 * trial
            out = torch.empty(15, dtype=torch.long)
            cache = eng.model.cp.new_cache(17)
            eng._predict_codes(h, code0, cache, out, req, True, torch.Generator())
            want, _ = _recompute_codes(eng, h, code0)
            assert out.tolist() == want


@pytest.mark.parametrize("which", ["split", "equal"])
def test_cached_talker_equals_recompute(which: str, request: pytest.FixtureRequest) -> None:
    eng = request.getfixturevalue(which)[0]
    t = eng.model.talker
    torch.manual_seed(1)
    x = torch.randn(9, eng.meta.talker.hidden_size)
    with torch.inference_mode():
        full = t.forward(x, 0, t.new_cache(9))
        cache = t.new_cache(9)
        part = [t.forward(x[:5], 0, cache)]
        part += [t.forward(x[i : i + 1], i, cache) for i in range(5, 7)]
        part.append(t.forward(x[7:9], 7, cache))  # multi-row chunk at an offset (masked)
    np.testing.assert_allclose(torch.cat(part).numpy(), full.numpy(), rtol=1e-4, atol=1e-5)


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
    calls = []

    def cancel() -> bool:
        calls.append(1)
        return len(calls) > 2

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
    from engines.qwen3.gguf_model import GgufFile

    types = {t.type_name for t in GgufFile(paths.talker_gguf).tensors.values()}
    assert ("Q8_0" if dtype == "q8_0" else "F16") in types and "F32" in types
    codes, _ = eng.generate_codes(
        ModeSynthesizeRequest(text="Hello", speaker="ryan", greedy=True, max_frames=4)
    )
    assert codes.shape[1] == 16 and codes.shape[0] >= 1


def test_eos_stops_and_is_not_emitted(split) -> None:
    eng = split[0]
    # make EOS the only allowed talker output after the first two frames
    saved = eng._suppress.clone()
    try:
        eng._suppress[:] = float("-inf")
        eng._suppress[eng.meta.codec.eos] = 0.0
        codes, _ = eng.generate_codes(
            ModeSynthesizeRequest(text="Hello", speaker="ryan", greedy=True, max_frames=10)
        )
    finally:
        eng._suppress.copy_(saved)
    assert codes.shape == (2, 16) and (codes[:, 0] != eng.meta.codec.eos).all()
