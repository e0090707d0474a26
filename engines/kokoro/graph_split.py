"""Graph surgery: the shipped Kokoro ONNX graph cut into prosody, frame and decoder stages.

Rule 1: this module only rewrites ONNX graphs (the ``onnx`` package) and caches
the result beside the model; it runs no inference and knows no text.
Rule 2: the stages are exact: prosody, frame and a decode of all frames give the same
samples as the whole graph (tests/test_kokoro_split.py).

Where the cuts are and why (profile in README "Kokoro pipeline"): about 87 % of
an inference is the iSTFTNet generator (the upsampling convolutions and their
residual blocks); BERT, the text encoder, the duration, F0 and energy
predictors and the alignment are about 2 %, the frame-rate half of the decoder
(its ``encode`` and ``decode`` blocks, ten instance norms) about 3 %. Three stages:

* **prosody**, once per sentence (it needs the whole text): graph inputs ->

  - ``asr``  ``[1, 512, F]`` the text encoding aligned to frames,
  - ``f0``, ``energy``  ``[1, 2F]`` predicted pitch and energy (half-frames),
  - ``phase``  ``[1, 2F, 9]`` the harmonic source's cumulative phase (a running
    sum over the whole sentence, so a window of it continues the sentence's
    phase exactly),
  - ``durations``  ``[T + 2]`` frames per token (pads included; 1 frame = 600
    samples = 25 ms), after the edge cap when the graph is capped;

* **frame**, the frame-rate half of the decoder: ``asr``, ``f0``, ``energy``,
  ``style`` -> ``features`` ``[1, 512, 2F]``. With the voice's instance-norm
  statistics (``norms``) a window of it with ``FRAME_MARGIN`` frames on each
  side gives the sentence's features but for the int8 graph's activation
  quantisation, whose scale each run takes over its own frames (dequantised to
  float the window is exact: 1e-5 at 10 frames, 4 % of the peak at 8). Decoded
  in 24-frame windows, 3 sentences, log-spectral distance to the whole decode:
  0.09-0.13 dB with the int8 frame stage, 0.05 dB with a float one, against
  0.20 dB between the int8 and the float graph themselves; the float stage
  would hold 134 MB of weights per session against 34 MB. So the prosody pass
  before the first audio no longer pays for it (126 tokens: 284 -> 102 ms on
  one thread); each window does, on its own frames;

* **decoder**, the generator alone: ``features``, ``f0``, ``phase`` (any window
  of half-frames ``[2a, 2b)``) and ``style`` -> ``600 * (b - a)`` samples. It is
  local except for the instance norms inside the generator's residual blocks,
  whose statistics are those of the window unless given (``norms``).

A converted checkpoint (``converted``) keeps two stages, its prosody producing
``features`` itself: ``SplitGraphs.frame`` is None there.

A graph that lacks one of the cut tensors (another export) is not split:
``split_sources`` returns None and the engine runs whole-utterance inference.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger(__name__)

#: Bump when the cut changes: cached split files of an older version are rebuilt.
SPLIT_VERSION = 2
DURATIONS_TENSOR = "/encoder/Gather_output_0"  # int64 [T]: frames per token, pads included
DUR_CAP_INPUT = "dur_cap"
#: Internal tensor names of the shipped export (kokoro-v1.0 ONNX) -> our names.
PROSODY_TENSORS: dict[str, str] = {
    "asr": "/encoder/MatMul_1_output_0",
    "f0": "/encoder/Reshape_output_0",
    "energy": "/encoder/Reshape_1_output_0",
    "phase": "/decoder/decoder/generator/m_source/l_sin_gen/CumSum_output_0",
}
FEATURES_TENSOR = "/decoder/decoder/decode.3/Div_4_output_0"
FRAME_INPUTS = ("asr", "f0", "energy")
DECODER_INPUTS = ("features", "f0", "phase")
PROSODY_OUTPUTS = ("asr", "f0", "energy", "phase", "durations")
#: Frames decoded on each side of a window by the frame stage and discarded: its
#: receptive field (five residual blocks of two 3-tap convolutions, one upsampling)
FRAME_MARGIN = 10


def patch_duration_cap_model(model: Any) -> bool:
    """Add a ``dur_cap`` input to a loaded graph: durations become ``Min(durations, dur_cap)``.

    Modifies ``model`` in place; False (unchanged) when the graph has no
    ``/encoder/Gather_output_0`` durations (another export).
    """
    import onnx
    from onnx import helper

    graph = model.graph
    users = [n for n in graph.node if DURATIONS_TENSOR in n.input]
    if not any(n.output and n.output[0] == DURATIONS_TENSOR for n in graph.node) or not users:
        return False
    capped = DURATIONS_TENSOR + "_capped"
    for node in users:
        for i, name in enumerate(node.input):
            if name == DURATIONS_TENSOR:
                node.input[i] = capped
    # insert right after the producer so the node list stays topologically sorted
    pos = next(i for i, n in enumerate(graph.node) if DURATIONS_TENSOR in n.output)
    graph.node.insert(
        pos + 1, helper.make_node("Min", [DURATIONS_TENSOR, DUR_CAP_INPUT], [capped], "dur_cap")
    )
    graph.input.append(helper.make_tensor_value_info(DUR_CAP_INPUT, onnx.TensorProto.INT64, ["T"]))
    return True


class GraphSplitError(Exception):
    """The graph cannot be cut here (another export); the message says what is missing."""


@dataclass(frozen=True)
class SplitGraphs:
    """Where the stages load from: file paths, or serialised bytes (read-only dir).
    ``frame`` None: the prosody stage outputs ``features`` itself (a converted
    checkpoint's two stages)."""

    prosody: str | bytes
    decoder: str | bytes
    frame: str | bytes | None = None


def _subgraph(
    model: Any, inputs: dict[str, Any], outputs: list[str], name: str, rename: dict[str, str]
) -> Any:
    """The nodes that compute ``outputs`` from ``inputs`` (name -> value_info), as a model."""
    from onnx import NodeProto, helper

    graph = model.graph
    producer: dict[str, int] = {}
    for i, node in enumerate(graph.node):
        for out in node.output:
            producer[out] = i
    needed: set[int] = set()
    stack = list(outputs)
    seen = set(outputs)
    while stack:
        tensor = stack.pop()
        if tensor in inputs or tensor not in producer:
            continue
        idx = producer[tensor]
        if idx in needed:
            continue
        needed.add(idx)
        for x in graph.node[idx].input:
            if x and x not in seen:
                seen.add(x)
                stack.append(x)
    nodes = [graph.node[i] for i in sorted(needed)]  # original order: still topological
    used = {x for n in nodes for x in n.input if x}
    initializers = [t for t in graph.initializer if t.name in used]
    known = set(inputs) | {t.name for t in initializers} | {o for n in nodes for o in n.output}
    unknown = sorted(used - known)
    if unknown:
        raise GraphSplitError(f"{name} stage needs tensors outside the cut: {unknown[:5]}")
    copies = []
    for node in nodes:
        if any(x in rename for x in node.input):
            renamed = NodeProto()
            renamed.CopyFrom(node)
            for i, x in enumerate(renamed.input):
                if x in rename:
                    renamed.input[i] = rename[x]
            node = renamed
        copies.append(node)
    value_infos = list(inputs.values())
    out_infos = []
    for tensor in outputs:
        out_infos.append(helper.make_empty_tensor_value_info(tensor))
    sub = helper.make_graph(copies, name, value_infos, out_infos, initializers)
    return helper.make_model(
        sub, opset_imports=list(model.opset_import), ir_version=model.ir_version
    )


def _expose(sub: Any, outputs: dict[str, str], int64: tuple[str, ...] = ()) -> None:
    """Replace ``sub``'s outputs by Identity copies of internal tensors under our names."""
    from onnx import TensorProto, helper

    del sub.graph.output[:]
    for ours, theirs in outputs.items():
        sub.graph.node.append(helper.make_node("Identity", [theirs], [ours], f"out_{ours}"))
        dtype = TensorProto.INT64 if ours in int64 else TensorProto.FLOAT
        sub.graph.output.append(helper.make_tensor_value_info(ours, dtype, None))


def _stage_inputs(names: tuple[str, ...], shapes: dict[str, list[str | int]]) -> dict[str, Any]:
    """Our names as graph inputs, keyed by the internal tensor each stands for."""
    from onnx import TensorProto, helper

    internal = {**PROSODY_TENSORS, "features": FEATURES_TENSOR}
    return {
        internal[n]: helper.make_tensor_value_info(n, TensorProto.FLOAT, shapes[n]) for n in names
    }


def split_model(model: Any) -> tuple[bytes, bytes, bytes]:
    """Cut a loaded Kokoro ``ModelProto`` into (prosody, frame, decoder) serialised graphs.

    Raises ``GraphSplitError`` when a cut tensor or a graph input is missing.
    A graph patched with ``patch_duration_cap_model`` keeps its ``dur_cap``
    input and reports the capped durations.
    """
    graph = model.graph
    produced = {o for n in graph.node for o in n.output}
    missing = [t for t in (*PROSODY_TENSORS.values(), FEATURES_TENSOR) if t not in produced]
    if missing:
        raise GraphSplitError(f"no {missing[0]} in the graph (not the kokoro-v1.0 export)")
    graph_inputs = {i.name: i for i in graph.input}
    tokens = "input_ids" if "input_ids" in graph_inputs else "tokens"
    for need in (tokens, "style", "speed"):
        if need not in graph_inputs:
            raise GraphSplitError(f"graph input {need!r} missing")
    durations = DURATIONS_TENSOR + "_capped" if DURATIONS_TENSOR + "_capped" in produced else None
    durations = durations or (DURATIONS_TENSOR if DURATIONS_TENSOR in produced else None)
    if durations is None:
        raise GraphSplitError(f"no {DURATIONS_TENSOR} in the graph")

    # prosody: graph inputs -> internal tensors, exposed under our names via Identity
    p_inputs = {n: graph_inputs[n] for n in graph_inputs}
    internal = [*PROSODY_TENSORS.values(), durations]
    prosody = _subgraph(model, p_inputs, internal, "kokoro_prosody", {})
    used_inputs = {x for n in prosody.graph.node for x in n.input}
    kept = [i for i in prosody.graph.input if i.name in used_inputs]
    del prosody.graph.input[:]
    prosody.graph.input.extend(kept)
    _expose(prosody, {**PROSODY_TENSORS, "durations": durations}, ("durations",))

    # frame and decoder: our names as graph inputs, renamed where the stage reads them
    shapes: dict[str, list[str | int]] = {
        "asr": [1, "C", "T"],
        "energy": [1, "T2"],
        "features": [1, "C", "T2"],
        "f0": [1, "T2"],
        "phase": [1, "T2", "H"],
    }
    stages = []
    for name, ins, outs in (
        ("kokoro_frame", FRAME_INPUTS, {"features": FEATURES_TENSOR}),
        ("kokoro_decoder", DECODER_INPUTS, {graph.output[0].name: graph.output[0].name}),
    ):
        inputs = _stage_inputs(ins, shapes)
        inputs["style"] = graph_inputs["style"]
        rename = {t: info.name for t, info in inputs.items() if t != "style"}
        stage = _subgraph(model, inputs, list(outs.values()), name, rename)
        del stage.graph.input[:]
        stage.graph.input.extend([inputs[t] for t in rename] + [graph_inputs["style"]])
        reads = {x for n in stage.graph.node for x in n.input}
        if any(t in reads for t in rename):
            raise GraphSplitError(f"{name} stage still reads an internal tensor")
        if name == "kokoro_frame":
            _expose(stage, outs)
        stages.append(stage)
    return (
        prosody.SerializeToString(),
        stages[0].SerializeToString(),
        stages[1].SerializeToString(),
    )


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def split_sources(model_path: Path) -> SplitGraphs | None:
    """The split stages of ``model_path``, built once and cached beside it.

    The split graph is not edge-capped (``patch_duration_cap_model``): the
    instance-norm statistics of the first and last decoder windows need the
    model's own edge silence (capped, the recogniser lost first and last words).
    Files: ``<model>.prosody``, ``<model>.frame`` and
    ``<model>.decoder`` (no ``.onnx`` suffix, so variant globbing ignores them) and
    ``<model>.split.stamp`` holding the model's size and mtime, the split version and
    each file's sha256, verified at every load: a stale or corrupt file is rebuilt. A
    read-only directory gets the bytes instead. Returns None (logged) when ``onnx`` is
    missing or the graph cannot be cut.
    """
    paths = [
        model_path.with_name(f"{model_path.name}.{n}") for n in ("prosody", "frame", "decoder")
    ]
    stamp = model_path.with_name(f"{model_path.name}.split.stamp")
    st = model_path.stat()
    source = f"v{SPLIT_VERSION}:{st.st_size}:{st.st_mtime_ns}"
    try:
        lines = stamp.read_text().split()
        if (
            len(lines) == 1 + len(paths)
            and lines[0] == source
            and all(
                p.is_file() and _file_digest(p) == d for p, d in zip(paths, lines[1:], strict=True)
            )
        ):
            return SplitGraphs(str(paths[0]), str(paths[2]), str(paths[1]))
    except OSError:
        pass
    try:
        import onnx
    except ImportError:
        log.warning("graph_split_unavailable", reason="the onnx package is not installed")
        return None
    model = onnx.load(str(model_path))
    try:
        stages = split_model(model)
    except GraphSplitError as exc:
        log.warning(
            "graph_split_unavailable",
            model=str(model_path),
            reason=str(exc),
            fallback="whole-utterance inference",
        )
        return None
    del model
    try:
        stamp.unlink(missing_ok=True)  # a crash while writing leaves no valid stamp
        for path, data in zip(paths, stages, strict=True):
            part = path.with_name(f"{path.name}.{os.getpid()}.part")
            try:
                part.write_bytes(data)
                os.replace(part, path)
            finally:
                part.unlink(missing_ok=True)
        stamp.write_text("\n".join([source, *(_digest(d) for d in stages)]) + "\n")
    except OSError as exc:
        log.info("graph_split_not_cached", path=str(paths[0]), error=str(exc))
        return SplitGraphs(stages[0], stages[2], stages[1])
    log.info("graph_split_cached", stages=[str(p) for p in paths])
    return SplitGraphs(str(paths[0]), str(paths[2]), str(paths[1]))
