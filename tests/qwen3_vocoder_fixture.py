"""A tiny vocoder ONNX graph with the real Qwen3-TTS 12 Hz decoder contract (for tests/benchmarks).

The real decoder (the official 12 Hz codec decoder) maps int64 codes ``[B,16,T]`` (or
``[B,T,16]``, time-major) with values 0..2047 to float32 audio of exactly
``T*1920`` samples at 24 kHz, clamped to [-1, 1], shaped ``[B,1,S]`` or
``[B,S]``, sometimes with an int64 ``lengths [B]`` output.

This fixture keeps that contract with a few KiB of weights: per-codebook
embeddings summed, two causal convolutions (the second dilated far enough that
it reaches ``FAR_TAP`` frames back, so a streaming decoder with 25 frames of
left context is near-exact but not bit-exact, like the real one), then a
ConvTranspose that upsamples each frame to 1920 samples, then clamp.
Weights are deterministic from ``seed``. Built with ``onnx.helper`` (no torch).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np

NUM_CODEBOOKS = 16
CODEBOOK_SIZE = 2048
SAMPLES_PER_FRAME = 1920
#: The dilated conv's farthest tap, in frames: beyond the default 25-frame streaming context.
FAR_TAP = 32


@dataclass(frozen=True)
class VocoderFixtureSpec:
    """Shape of the generated graph's interface."""

    time_major: bool = False  # codes [B,T,16] instead of [B,16,T]
    squeeze_channel: bool = False  # audio [B,S] instead of [B,1,S]
    with_lengths: bool = False  # extra int64 output ``lengths [B]`` (= count(codes[:,0]>=0)*1920)
    channels: int = 8
    seed: int = 0
    far_weight: float = (
        0.005  # weight of the tap FAR_TAP frames back (how much far context matters)
    )
    gain: float = 0.9
    input_name: str = "audio_codes"
    output_name: str = "audio_values"
    opset: int = 17


def build_vocoder_model(spec: VocoderFixtureSpec = VocoderFixtureSpec()) -> object:
    """Return the ``onnx.ModelProto`` of a tiny vocoder with ``spec``'s interface."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(spec.seed)
    c = spec.channels
    emb = rng.normal(0.0, 0.5, size=(NUM_CODEBOOKS * CODEBOOK_SIZE, c)).astype(np.float32)
    offsets = (np.arange(NUM_CODEBOOKS, dtype=np.int64) * CODEBOOK_SIZE).reshape(1, 16, 1)
    w1 = rng.normal(0.0, 0.4, size=(c, c, 3)).astype(np.float32)  # causal k=3, dilation 1
    b1 = rng.normal(0.0, 0.1, size=(c,)).astype(np.float32)
    # k=3, dilation FAR_TAP/2: taps at t, t-16, t-32; the farthest one is weak.
    w2 = rng.normal(0.0, 0.4, size=(c, c, 3)).astype(np.float32)
    w2[:, :, 0] *= spec.far_weight / 0.4
    w2[:, :, 1] *= 0.25
    b2 = np.zeros((c,), dtype=np.float32)
    # Upsample: each frame becomes 1920 samples of a few sinusoids mixed by channel.
    t = np.arange(SAMPLES_PER_FRAME, dtype=np.float32) / 24000.0
    freqs = rng.uniform(110.0, 1800.0, size=(c,)).astype(np.float32)
    phases = rng.uniform(0.0, 2 * np.pi, size=(c,)).astype(np.float32)
    wave = np.sin(2 * np.pi * freqs[:, None] * t[None, :] + phases[:, None]) / c
    wup = (spec.gain * wave).astype(np.float32).reshape(c, 1, SAMPLES_PER_FRAME)

    inits = [
        numpy_helper.from_array(emb, "emb"),
        numpy_helper.from_array(offsets, "offsets"),
        numpy_helper.from_array(w1, "w1"),
        numpy_helper.from_array(b1, "b1"),
        numpy_helper.from_array(w2, "w2"),
        numpy_helper.from_array(b2, "b2"),
        numpy_helper.from_array(wup, "wup"),
        numpy_helper.from_array(np.array(0, dtype=np.int64), "zero_i"),
        numpy_helper.from_array(np.array(CODEBOOK_SIZE - 1, dtype=np.int64), "max_code"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), "axis1"),
        numpy_helper.from_array(np.array([0, 0, 2, 0, 0, 0], dtype=np.int64), "pad1"),
        numpy_helper.from_array(np.array([0, 0, FAR_TAP, 0, 0, 0], dtype=np.int64), "pad2"),
        numpy_helper.from_array(np.array(-1.0, dtype=np.float32), "lo"),
        numpy_helper.from_array(np.array(1.0, dtype=np.float32), "hi"),
    ]
    if spec.with_lengths:
        inits.append(numpy_helper.from_array(np.array(SAMPLES_PER_FRAME, dtype=np.int64), "spf"))
    nodes = []
    x = spec.input_name
    if spec.time_major:
        nodes.append(helper.make_node("Transpose", [x], ["codes_bqt"], perm=[0, 2, 1]))
        x = "codes_bqt"
    nodes += [
        helper.make_node("Clip", [x, "zero_i", "max_code"], ["codes_c"]),
        helper.make_node("Add", ["codes_c", "offsets"], ["codes_o"]),
        helper.make_node("Gather", ["emb", "codes_o"], ["e"], axis=0),  # [B,16,T,C]
        helper.make_node("ReduceSum", ["e", "axis1"], ["es"], keepdims=0),  # [B,T,C]
        helper.make_node("Transpose", ["es"], ["h0"], perm=[0, 2, 1]),  # [B,C,T]
        helper.make_node("Pad", ["h0", "pad1"], ["h0p"]),
        helper.make_node("Conv", ["h0p", "w1", "b1"], ["h1c"], kernel_shape=[3]),
        helper.make_node("Tanh", ["h1c"], ["h1"]),
        helper.make_node("Pad", ["h1", "pad2"], ["h1p"]),
        helper.make_node(
            "Conv", ["h1p", "w2", "b2"], ["h2c"], kernel_shape=[3], dilations=[FAR_TAP // 2]
        ),
        helper.make_node("Tanh", ["h2c"], ["h2"]),
        helper.make_node("Add", ["h1", "h2"], ["h3"]),
        helper.make_node(
            "ConvTranspose",
            ["h3", "wup"],
            ["up"],
            kernel_shape=[SAMPLES_PER_FRAME],
            strides=[SAMPLES_PER_FRAME],
        ),  # [B,1,T*1920]
    ]
    audio_shape: list[int | str]
    if spec.squeeze_channel:
        nodes.append(helper.make_node("Clip", ["up", "lo", "hi"], ["up_c"]))
        nodes.append(helper.make_node("Squeeze", ["up_c", "axis1"], [spec.output_name]))
        audio_shape = ["batch", "samples"]
    else:
        nodes.append(helper.make_node("Clip", ["up", "lo", "hi"], [spec.output_name]))
        audio_shape = ["batch", 1, "samples"]
    outputs = [helper.make_tensor_value_info(spec.output_name, TensorProto.FLOAT, audio_shape)]
    if spec.with_lengths:
        nodes += [
            helper.make_node("Gather", [x, "zero_i"], ["q0"], axis=1),  # [B,T] (codebook 0)
            helper.make_node("GreaterOrEqual", ["q0", "zero_i"], ["valid"]),
            helper.make_node("Cast", ["valid"], ["valid_i"], to=TensorProto.INT64),
            helper.make_node("ReduceSum", ["valid_i", "axis1"], ["nvalid"], keepdims=0),
            helper.make_node("Mul", ["nvalid", "spf"], ["lengths"]),
        ]
        outputs.append(helper.make_tensor_value_info("lengths", TensorProto.INT64, ["batch"]))
    in_shape: list[int | str] = (
        ["batch", "frames", NUM_CODEBOOKS]
        if spec.time_major
        else ["batch", NUM_CODEBOOKS, "frames"]
    )
    graph = helper.make_graph(
        nodes,
        "tiny_qwen3_tts_vocoder",
        [helper.make_tensor_value_info(spec.input_name, TensorProto.INT64, in_shape)],
        outputs,
        initializer=inits,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", spec.opset)],
        producer_name="ttsdock-vocoder-fixture",
    )
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def export_tiny_vocoder(path: str | Path, spec: VocoderFixtureSpec = VocoderFixtureSpec()) -> Path:
    """Write a tiny vocoder ONNX file to ``path`` and return the path."""
    import onnx

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    model = build_vocoder_model(spec)
    onnx.save(model, str(out))  # type: ignore[arg-type]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Write a tiny Qwen3-TTS vocoder ONNX fixture.")
    p.add_argument("out", type=Path)
    p.add_argument("--time-major", action="store_true", help="codes [B,T,16]")
    p.add_argument("--squeeze", action="store_true", help="audio [B,S] instead of [B,1,S]")
    p.add_argument("--lengths", action="store_true", help="add the int64 lengths output")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    spec = VocoderFixtureSpec(
        time_major=a.time_major, squeeze_channel=a.squeeze, with_lengths=a.lengths, seed=a.seed
    )
    print(export_tiny_vocoder(a.out, spec))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
