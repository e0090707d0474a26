"""Graph variants (engines/kokoro/graph_variants.py): structure on tiny graphs, real numerics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kokoro_helpers import EN_SENTENCE, shared_models_dir
from onnx import TensorProto, helper, numpy_helper

from engines.kokoro.frontend import FrontEnd, Vocab
from engines.kokoro.graph_split import split_sources
from engines.kokoro.graph_variants import (
    VARIANTS,
    build_stage,
    conv1d_as_conv2d,
    dequantize,
    session_options,
)
from engines.kokoro.models import KOKORO_INT8_NAME, load_default_voices, load_vocab
from engines.kokoro.plans import stage_outputs

F32 = npt.NDArray[np.float32]
INT_OPS = {"ConvInteger", "MatMulInteger", "DynamicQuantizeLinear", "DynamicQuantizeLSTM"}

# The model's own precision: the shipped int8 decoder vs its dequantised fp32 twin
# on real prosody (benchmarks/kokoro_plans.py: whole sentences, log-spectral distance
# up to 0.20 and SNR down to 13.5 dB). A variant may differ from int8 by about that
# much, never more; exact rewrites (conv1d_as_conv2d) must match to float rounding.
OWN_PRECISION_LOGSPEC = 0.35
OWN_PRECISION_SNR_DB = 8.0
EXACT_SNR_DB = 80.0
WINDOW_FRAMES = 12 + 2 * 10


def run(model: onnx.ModelProto, feeds: dict[str, Any], threads: int = 1) -> list[Any]:
    sess = ort.InferenceSession(
        model.SerializeToString(), session_options(threads), providers=["CPUExecutionProvider"]
    )
    return list(sess.run(None, feeds))


def interface(model: onnx.ModelProto) -> list[tuple[str, int]]:
    io = [*model.graph.input, *model.graph.output]
    return [(v.name, v.type.tensor_type.elem_type) for v in io]


def ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def snr_db(a: F32, ref: F32) -> float:
    err = float(np.sum((a.astype(np.float64) - ref) ** 2))
    return float(10 * np.log10(float(np.sum(ref.astype(np.float64) ** 2)) / max(err, 1e-30)))


def log_spec_distance(a: F32, ref: F32, n_fft: int = 1024, hop: int = 256) -> float:
    def spec(x: F32) -> npt.NDArray[np.float64]:
        x64 = np.pad(x.astype(np.float64), (n_fft // 2, n_fft // 2))
        n = 1 + (len(x64) - n_fft) // hop
        idx = np.arange(n_fft)[None, :] + hop * np.arange(n)[:, None]
        return np.log10(np.abs(np.fft.rfft(x64[idx] * np.hanning(n_fft), axis=1)) + 1e-5)

    return float(np.mean(np.abs(spec(a) - spec(ref))))


# ---------------------------------------------------------------- tiny graphs


def conv_chain(
    c: int, k: int, stride: int, dilation: int, pads: tuple[int, int], group: int, seed: int
) -> onnx.ModelProto:
    """x [1, c, T] -> Conv -> LeakyRelu -> Conv (its input is the first conv's output) -> y."""
    rng = np.random.default_rng(seed)
    w1 = rng.standard_normal((c, c // group, k)).astype(np.float32)
    w2 = rng.standard_normal((c, c, 1)).astype(np.float32)
    b1 = rng.standard_normal(c).astype(np.float32)
    attrs: dict[str, Any] = {
        "kernel_shape": [k],
        "strides": [stride],
        "dilations": [dilation],
        "pads": list(pads),
        "group": group,
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["h"], "c1", **attrs),
        helper.make_node("Conv", ["h", "w2"], ["h2"], "c2", kernel_shape=[1]),
        helper.make_node("LeakyRelu", ["h2"], ["y"], "act", alpha=0.1),
        helper.make_node("Add", ["h", "y"], ["z"], "res"),
    ]
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, "T"])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, c, "T2"])],
        [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (w2, "w2"), (b1, "b1"))],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_conv2d_structure_on_a_chain() -> None:
    model = conv_chain(4, 3, 1, 1, (1, 1), 1, seed=0)
    before = model.SerializeToString()
    out = conv1d_as_conv2d(model)
    assert model.SerializeToString() == before  # the argument is not modified
    onnx.checker.check_model(out)
    assert interface(out) == interface(model)
    convs = [n for n in out.graph.node if n.op_type == "Conv"]
    assert len(convs) == 2
    inits = {t.name: t for t in out.graph.initializer}
    for conv in convs:
        assert len(inits[conv.input[1]].dims) == 4
        assert [len(a.ints) for a in conv.attribute if a.name == "kernel_shape"] == [2]
    # the second conv reads the first one's 4-D output: one Unsqueeze for the chain
    assert ops(out).count("Unsqueeze") == 1
    assert ops(out).count("Squeeze") == 2  # one per conv output read in 3-D
    x = np.random.default_rng(1).standard_normal((1, 4, 37)).astype(np.float32)
    np.testing.assert_allclose(run(out, {"x": x})[0], run(model, {"x": x})[0], atol=1e-4)


@settings(max_examples=25)
@given(
    c=st.sampled_from([2, 4, 6]),
    k=st.integers(1, 7),
    stride=st.integers(1, 3),
    dilation=st.integers(1, 3),
    pad_l=st.integers(0, 4),
    pad_r=st.integers(0, 4),
    grouped=st.booleans(),
    t=st.integers(24, 60),
    seed=st.integers(0, 2**16),
)
def test_conv2d_rewrite_is_exact_for_any_conv(
    c: int,
    k: int,
    stride: int,
    dilation: int,
    pad_l: int,
    pad_r: int,
    grouped: bool,
    t: int,
    seed: int,
) -> None:
    model = conv_chain(c, k, stride, dilation, (pad_l, pad_r), 2 if grouped else 1, seed)
    x = np.random.default_rng(seed).standard_normal((1, c, t)).astype(np.float32)
    want = run(model, {"x": x})[0]
    got = run(conv1d_as_conv2d(model), {"x": x})[0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def quantized(tmp_path_factory: pytest.TempPathFactory) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """(float model, the same model through ORT's quantize_dynamic): Conv, MatMul, LSTM."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    rng = np.random.default_rng(3)
    c, h = 8, 6
    inits = {
        "cw": rng.standard_normal((c, c, 3)).astype(np.float32) * 0.3,
        "cb": rng.standard_normal(c).astype(np.float32),
        "mw": rng.standard_normal((c, c)).astype(np.float32) * 0.3,
        "mb": rng.standard_normal(c).astype(np.float32),
        "lw": rng.standard_normal((1, 4 * h, c)).astype(np.float32) * 0.3,
        "lr": rng.standard_normal((1, 4 * h, h)).astype(np.float32) * 0.3,
    }
    nodes = [
        helper.make_node("Conv", ["x", "cw", "cb"], ["y1"], "conv", kernel_shape=[3], pads=[1, 1]),
        helper.make_node("Transpose", ["y1"], ["y1t"], "tr", perm=[2, 0, 1]),  # [T, 1, C]
        helper.make_node("MatMul", ["y1t", "mw"], ["y2"], "mm"),
        helper.make_node("Add", ["y2", "mb"], ["y3"], "bias"),
        helper.make_node("LSTM", ["y3", "lw", "lr"], ["y"], "lstm", hidden_size=h),
    ]
    graph = helper.make_graph(
        nodes,
        "q",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, "T"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["T", 1, 1, h])],
        [numpy_helper.from_array(a, n) for n, a in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    d = tmp_path_factory.mktemp("q")
    onnx.save(model, d / "f.onnx")
    quantize_dynamic(d / "f.onnx", d / "q.onnx", weight_type=QuantType.QUInt8, per_channel=True)
    return model, onnx.load(d / "q.onnx")


def test_dequantize_structure_and_numerics(
    quantized: tuple[onnx.ModelProto, onnx.ModelProto],
) -> None:
    fmodel, qmodel = quantized
    assert INT_OPS & set(ops(qmodel))
    before = qmodel.SerializeToString()
    out = dequantize(qmodel)
    assert qmodel.SerializeToString() == before
    assert interface(out) == interface(qmodel)
    assert not INT_OPS & set(ops(out)), ops(out)
    assert {"Conv", "MatMul", "LSTM"} <= set(ops(out))
    assert not [t for t in out.graph.initializer if t.data_type != TensorProto.FLOAT]
    x = np.random.default_rng(4).standard_normal((1, 8, 30)).astype(np.float32)
    want = run(fmodel, {"x": x})[0]
    got = run(out, {"x": x})[0]
    quant = run(qmodel, {"x": x})[0]
    # the float graph keeps only the weight rounding: far closer to the float model
    # than the int8 graph (which also quantises activations)
    err_f = float(np.abs(got - want).max())
    err_q = float(np.abs(quant - want).max())
    assert err_f < 0.05, err_f
    assert err_f < err_q, (err_f, err_q)
    # and the dequantised weights are the int8 codes times their scales
    wname = next(n.input[1] for n in out.graph.node if n.op_type == "Conv")
    w = numpy_helper.to_array(next(t for t in out.graph.initializer if t.name == wname))
    cw = numpy_helper.to_array(fmodel.graph.initializer[0])
    err = float(np.abs(w - cw).max())
    assert err <= 0.51 * float(cw.max() - min(cw.min(), 0.0)) / 255  # half a uint8 step


def test_dequantize_leaves_a_float_graph_alone() -> None:
    model = conv_chain(4, 3, 1, 1, (1, 1), 1, seed=5)
    out = dequantize(model)
    assert ops(out) == ops(model)
    assert interface(out) == interface(model)


# ---------------------------------------------------------------- the real model


@pytest.fixture(scope="module")
def real_window(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, dict[str, Any]]:
    """(the shipped decoder stage, feeds of one 12-frame window + 10 context frames a side)."""
    mdir = shared_models_dir(tmp_path_factory)
    graphs = split_sources(mdir / "kokoro" / KOKORO_INT8_NAME)
    assert graphs is not None
    fe = FrontEnd(Vocab(load_vocab()))
    toks: list[int] = []
    for w in fe.phonemes(EN_SENTENCE).words:
        if toks:
            toks.append(16)
        toks.extend(w.tokens)
    style = np.asarray(load_default_voices()["jf_alpha"][len(toks) - 1], np.float32).reshape(1, -1)
    pr = stage_outputs(graphs.prosody, graphs.frame, toks, style, threads=2)
    a, b = 2 * 30, 2 * (30 + WINDOW_FRAMES)  # a window mid-sentence
    window = {
        "features": np.ascontiguousarray(pr["features"][:, :, a:b]),
        "f0": np.ascontiguousarray(pr["f0"][:, a:b]),
        "phase": np.ascontiguousarray(pr["phase"][:, a:b, :]),
        "style": style,
    }
    decoder = graphs.decoder
    data = decoder if isinstance(decoder, bytes) else Path(decoder).read_bytes()
    return data, window


@pytest.mark.slow
def test_variants_on_the_real_decoder(real_window: tuple[bytes, dict[str, Any]]) -> None:
    data, feeds = real_window
    shipped = onnx.load_from_string(data)
    ref = run(shipped, feeds, threads=2)[0].reshape(-1)
    assert set(VARIANTS) == {"int8", "fp32", "fp32_conv2d"}
    same = onnx.load_from_string(build_stage(data, "int8"))
    assert same.graph.SerializeToString() == shipped.graph.SerializeToString()
    fp32 = dequantize(shipped)  # VARIANTS["fp32"]
    conv2d = conv1d_as_conv2d(fp32)  # VARIANTS["fp32_conv2d"], without dequantising twice
    outs: dict[str, F32] = {}
    for name, model in (("fp32", fp32), ("fp32_conv2d", conv2d)):
        assert interface(model) == interface(shipped), name
        assert not INT_OPS & set(ops(model)), name
        outs[name] = run(model, feeds, threads=2)[0].reshape(-1)
        assert outs[name].shape == ref.shape == (WINDOW_FRAMES * 600,)
        lsd, snr = log_spec_distance(outs[name], ref), snr_db(outs[name], ref)
        print(f"{name} vs int8: log-spectral distance {lsd:.3f}, SNR {snr:.1f} dB")
        assert lsd < OWN_PRECISION_LOGSPEC, name
        assert snr > OWN_PRECISION_SNR_DB, name
    assert snr_db(outs["fp32_conv2d"], outs["fp32"]) > EXACT_SNR_DB
