"""The ONNX files: both stages traced from ``stages``, the whole graph merged from them, int8.

Rule 1: graphs only (torch's TorchScript exporter, ``onnx``, onnxruntime's
quantiser); no validation (``validate``) and no file layout (``cli``) here.
Rule 2: the whole graph is the two stage graphs joined (``onnx.compose``), not a
third trace: the same nodes and weights, so ``--no-split`` and the streamed
path compute the same function.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from engines.kokoro.convert.stages import DecoderStage, ProsodyStage

OPSET = 17
PROSODY_INPUTS = ("tokens", "style", "speed")
PROSODY_OUTPUTS = ("features", "f0", "energy", "phase", "durations")
DECODER_INPUTS = ("features", "f0", "phase", "style")
NOISE_INPUT = "noise"  # validate: the decoder's RandomNormalLike made an input


def _trace(module: Any, args: tuple[Any, ...], path: Path, **kw: Any) -> None:
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation chatter
        with torch.no_grad():
            torch.onnx.export(module, args, str(path), dynamo=False, opset_version=OPSET, **kw)


def export_stages(kmodel: Any, prosody_path: Path, decoder_path: Path) -> None:
    """Trace the prosody and decoder stages of ``kmodel`` (weight norm already folded)."""
    import torch

    prosody = ProsodyStage(kmodel).eval()
    decoder = DecoderStage(kmodel).eval()
    tokens = torch.tensor([[0, *range(1, 13), 0]], dtype=torch.long)
    style = torch.zeros((1, 256))
    speed = torch.ones(1)
    _trace(
        prosody,
        (tokens, style, speed),
        prosody_path,
        input_names=list(PROSODY_INPUTS),
        output_names=list(PROSODY_OUTPUTS),
        dynamic_axes={
            "tokens": {1: "T"},
            "features": {2: "T2"},
            "f0": {1: "T2"},
            "energy": {1: "T2"},
            "phase": {1: "T2"},
            "durations": {0: "T"},
        },
    )
    with torch.no_grad():
        features, f0, _energy, phase, _durations = prosody(tokens, style, speed)
    _trace(
        decoder,
        (features, f0, phase, style),
        decoder_path,
        input_names=list(DECODER_INPUTS),
        output_names=["audio"],
        dynamic_axes={
            "features": {2: "T2"},
            "f0": {1: "T2"},
            "phase": {1: "T2"},
            "audio": {2: "samples"},
        },
    )


def merge_whole(prosody: Any, decoder: Any) -> Any:
    """One graph ``tokens``/``style``/``speed`` -> ``audio`` ``[S]``, ``durations`` ``[T]``."""
    import onnx
    from onnx import TensorProto, compose, helper

    dec = compose.add_prefix(decoder, "decoder/")
    # the decoder's own inputs become the prosody stage's tensors (style: the graph input)
    rename = {f"decoder/{n}": n for n in DECODER_INPUTS}
    for node in dec.graph.node:
        for i, name in enumerate(node.input):
            if name in rename:
                node.input[i] = rename[name]
    graph = helper.make_graph(
        [*prosody.graph.node, *dec.graph.node],
        "kokoro_whole",
        list(prosody.graph.input),
        [],
        [*prosody.graph.initializer, *dec.graph.initializer],
    )
    audio = dec.graph.output[0].name
    graph.node.append(helper.make_node("Reshape", [audio, "whole/flat"], ["audio"], "audio"))
    graph.initializer.append(helper.make_tensor("whole/flat", TensorProto.INT64, [1], [-1]))
    graph.node.append(helper.make_node("Identity", ["durations"], ["durations_out"], "dur"))
    graph.output.extend(
        [
            helper.make_tensor_value_info("audio", TensorProto.FLOAT, ["samples"]),
            helper.make_tensor_value_info("durations_out", TensorProto.INT64, ["T"]),
        ]
    )
    model = helper.make_model(
        graph, opset_imports=list(prosody.opset_import), ir_version=prosody.ir_version
    )
    onnx.checker.check_model(model)
    return model


#: What the int8 graphs quantise: PL-BERT, the LSTMs, the style projections, the
#: embeddings. The convolutions stay float32: quantised too (``ConvInteger``,
#: per-tensor activation scales), the audio was 6.0 dB off the official forward
#: (log-spectral distance, random weights), worse than halving the gain (5.4 dB).
INT8_OPS = ("MatMul", "Gemm", "LSTM", "Gather")


def quantize_int8(src: Path, dst: Path) -> None:
    """onnxruntime's dynamic int8 quantiser (int8 weights, activations quantised per run)."""
    import contextlib
    import io
    import logging

    from onnxruntime.quantization import QuantType, quantize_dynamic

    logging.getLogger("onnxruntime").setLevel(logging.ERROR)
    with contextlib.redirect_stdout(io.StringIO()):  # the quantiser prints skipped tensors
        quantize_dynamic(
            str(src), str(dst), weight_type=QuantType.QInt8, op_types_to_quantize=list(INT8_OPS)
        )


def noise_as_input(model: Any) -> Any:
    """A copy of ``model`` whose one ``RandomNormalLike`` reads the graph input ``noise``.

    The harmonic source's noise is the graphs' only random draw (``stages``);
    as an input it can be held equal to the torch side's.
    """
    import onnx
    from onnx import TensorProto, helper

    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes = [n for n in out.graph.node if n.op_type == "RandomNormalLike"]
    if len(nodes) != 1:
        raise ValueError(f"expected one RandomNormalLike node, found {len(nodes)}")
    node = nodes[0]
    target = node.output[0]
    out.graph.node.remove(node)
    out.graph.node.insert(0, helper.make_node("Identity", [NOISE_INPUT], [target], "noise_in"))
    out.graph.input.append(
        helper.make_tensor_value_info(NOISE_INPUT, TensorProto.FLOAT, [1, "samples", "harmonics"])
    )
    return out
