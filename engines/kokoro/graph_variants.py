"""Graph variants: a Kokoro stage graph rewritten into an equivalent, faster graph.

Rule: every function here takes an ``onnx.ModelProto`` and returns a new one
(the argument is never modified), with the same graph inputs and outputs
(names, dtypes); it runs no inference. The engine picks a variant per machine
(``VARIANTS``, ``session_options``); the numerics of each variant against the
shipped int8 stage are measured by ``benchmarks/kokoro_plans.py`` and bounded by
``tests/test_kokoro_graph_variants.py``.

What the shipped graph uses (ORT ``quantize_dynamic``), and what ``dequantize``
turns back into float:

* ``ConvInteger``: ``DynamicQuantizeLinear(x)`` -> ``ConvInteger(xq, Wq, xzp, wzp)``
  -> ``Add(round(bias / (xs * ws)))`` -> ``Cast(float)`` -> ``Mul(xs * ws)``
  becomes ``Conv(x, (Wq - wzp) * ws, bias)``;
* ``MatMulInteger``: ``MatMulInteger(xq, Wq, xzp, wzp)`` -> ``Cast`` ->
  ``Mul(xs * ws)`` becomes ``MatMul(x, (Wq - wzp) * ws)`` (the bias ``Add``
  after it stays, and ORT fuses it);
* ``DynamicQuantizeLSTM`` (prosody only) becomes ``LSTM`` with the weights
  transposed back to ONNX's ``[dirs, 4H, in]`` layout.

The int8 embedding ``DequantizeLinear`` after a ``Gather`` stays (cheap).
Float weights are the int8 codes times their scales, so the float graph is the
quantised model's weights computed without activation quantisation: its
difference from the int8 graph is the int8 graph's own activation
quantisation error.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
from onnx import NodeProto, TensorProto, helper, numpy_helper

FloatArray = npt.NDArray[np.float32]
Transform = Callable[[onnx.ModelProto], onnx.ModelProto]


class _Graph:
    """Index of a graph's producers, consumers and initializers (rebuilt per pass)."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.graph = graph
        self.producer: dict[str, NodeProto] = {}
        self.consumers: dict[str, list[NodeProto]] = defaultdict(list)
        for node in graph.node:
            for out in node.output:
                if out:
                    self.producer[out] = node
            for x in node.input:
                if x:
                    self.consumers[x].append(node)
        self.init: dict[str, TensorProto] = {t.name: t for t in graph.initializer}
        self.outputs = {o.name for o in graph.output}
        self.names = {t for t in self.producer} | set(self.init) | {i.name for i in graph.input}

    def array(self, name: str) -> npt.NDArray[Any] | None:
        t = self.init.get(name)
        return None if t is None else numpy_helper.to_array(t)

    def only_consumer(self, tensor: str, op_type: str) -> NodeProto | None:
        """The single consumer of ``tensor`` if it is an ``op_type`` (and not a graph output)."""
        users = self.consumers.get(tensor, [])
        if len(users) != 1 or users[0].op_type != op_type or tensor in self.outputs:
            return None
        return users[0]

    def fresh(self, base: str) -> str:
        name, k = base, 0
        while name in self.names:
            k += 1
            name = f"{base}_{k}"
        self.names.add(name)
        return name


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def _scale_source(g: _Graph, mul_input: str, x_scale: str) -> npt.NDArray[Any] | None:
    """The weight scale in ``Mul(x_scale, w_scale)`` producing ``mul_input``."""
    node = g.producer.get(mul_input)
    if node is None or node.op_type != "Mul" or len(node.input) != 2:
        return None
    a, b = node.input
    if a == x_scale:
        return g.array(b)
    if b == x_scale:
        return g.array(a)
    return None


def _float_bias(g: _Graph, add: NodeProto, conv_out: str) -> str | None:
    """The float bias initializer quantised into the ``Add`` after a ``ConvInteger``.

    The chain is ``Reshape(Cast(Floor(Div(bias, scale))))`` (ORT's dynamic conv bias).
    """
    other = add.input[1] if add.input[0] == conv_out else add.input[0]
    node = g.producer.get(other)
    for op in ("Reshape", "Cast", "Floor", "Div"):
        if node is None or node.op_type != op:
            return None
        if op == "Div":
            return node.input[0] if node.input[0] in g.init else None
        node = g.producer.get(node.input[0])
    return None


def _reshaped_vector(g: _Graph, tensor: str) -> str | None:
    """The 1-D initializer behind ``Reshape(vector, [1, -1, 1...])`` (a conv bias), if so."""
    node = g.producer.get(tensor)
    if node is None or node.op_type != "Reshape" or node.input[0] not in g.init:
        return None
    vec, shape = g.array(node.input[0]), g.array(node.input[1])
    if vec is None or shape is None or vec.ndim != 1 or vec.dtype != np.float32:
        return None
    dims = [int(d) for d in shape.reshape(-1)]
    if len(dims) < 2 or [d for i, d in enumerate(dims) if i != 1 and d != 1]:
        return None
    return node.input[0]


def _dequantized(
    g: _Graph, wq: str, wzp: str | None, scale: npt.NDArray[Any], channel_axis: int
) -> FloatArray | None:
    """``(Wq - zp) * scale`` with per-tensor or per-channel zero point and scale."""
    q = g.array(wq)
    if q is None:
        return None
    zp = np.zeros((), np.float32) if not wzp else g.array(wzp)
    if zp is None:
        return None
    shape = [1] * q.ndim
    shape[channel_axis] = -1
    zp_b = zp.astype(np.float32).reshape(shape) if zp.size > 1 else zp.astype(np.float32)
    sc_b = scale.astype(np.float32).reshape(shape) if scale.size > 1 else scale.astype(np.float32)
    return ((q.astype(np.float32) - zp_b) * sc_b).astype(np.float32)


def _dequantize_conv(g: _Graph, node: NodeProto) -> tuple[list[NodeProto], NodeProto] | None:
    """``ConvInteger`` and its rescale chain -> (nodes replaced, the float ``Conv``)."""
    dql = g.producer.get(node.input[0])
    if dql is None or dql.op_type != "DynamicQuantizeLinear":
        return None
    if len(node.input) > 2 and node.input[2] and node.input[2] != dql.output[2]:
        return None
    wzp = node.input[3] if len(node.input) > 3 else None
    out = node.output[0]
    chain = [node]
    bias: str | None = None
    nxt = g.consumers.get(out, [])
    if len(nxt) == 1 and nxt[0].op_type == "Add" and out not in g.outputs:
        bias = _float_bias(g, nxt[0], out)
        if bias is None:
            return None
        chain.append(nxt[0])
        out = nxt[0].output[0]
    cast = g.only_consumer(out, "Cast")
    if cast is None:
        return None
    mul = g.only_consumer(cast.output[0], "Mul")
    if mul is None:
        return None
    other = mul.input[1] if mul.input[0] == cast.output[0] else mul.input[0]
    scale = _scale_source(g, other, dql.output[1])
    if scale is None:
        return None
    weight = _dequantized(g, node.input[1], wzp, scale, channel_axis=0)
    if weight is None:
        return None
    chain += [cast, mul]
    out = mul.output[0]
    add = g.only_consumer(out, "Add") if bias is None else None
    if add is not None:  # newer quantisers: a float bias added after the rescale
        bias = _reshaped_vector(g, add.input[1] if add.input[0] == out else add.input[0])
        if bias is not None:
            chain.append(add)
            out = add.output[0]
    w_name = g.fresh(node.input[1].removesuffix("_quantized") + "_float")
    g.graph.initializer.append(numpy_helper.from_array(weight, w_name))
    inputs = [dql.input[0], w_name] + ([bias] if bias else [])
    conv = helper.make_node("Conv", inputs, [out], node.name.removesuffix("_quant") or None)
    conv.attribute.extend(node.attribute)
    return chain, conv


def _dequantize_matmul(g: _Graph, node: NodeProto) -> tuple[list[NodeProto], NodeProto] | None:
    """``MatMulInteger`` with a constant B and its rescale -> (nodes replaced, ``MatMul``)."""
    dql = g.producer.get(node.input[0])
    if dql is None or dql.op_type != "DynamicQuantizeLinear" or node.input[1] not in g.init:
        return None
    if len(node.input) > 2 and node.input[2] and node.input[2] != dql.output[2]:
        return None
    bzp = node.input[3] if len(node.input) > 3 else None
    cast = g.only_consumer(node.output[0], "Cast")
    if cast is None:
        return None
    mul = g.only_consumer(cast.output[0], "Mul")
    if mul is None:
        return None
    other = mul.input[1] if mul.input[0] == cast.output[0] else mul.input[0]
    scale = _scale_source(g, other, dql.output[1])
    if scale is None:
        return None
    q = g.array(node.input[1])
    if q is None or q.ndim != 2:
        return None
    weight = _dequantized(g, node.input[1], bzp, scale, channel_axis=1)
    if weight is None:
        return None
    w_name = g.fresh(node.input[1].removesuffix("_quantized") + "_float")
    g.graph.initializer.append(numpy_helper.from_array(weight, w_name))
    mm = helper.make_node(
        "MatMul", [dql.input[0], w_name], [mul.output[0]], node.name.removesuffix("_quant") or None
    )
    return [node, cast, mul], mm


def _dequantize_lstm(g: _Graph, node: NodeProto) -> tuple[list[NodeProto], NodeProto] | None:
    """``com.microsoft.DynamicQuantizeLSTM`` -> ONNX ``LSTM`` with float weights."""
    ins = list(node.input) + [""] * (12 - len(node.input))
    w_scale, w_zp, r_scale, r_zp = (g.array(n) if n else None for n in ins[8:12])
    if w_scale is None or r_scale is None:
        return None
    weights: list[str] = []
    for q_name, scale, zp in ((ins[1], w_scale, w_zp), (ins[2], r_scale, r_zp)):
        q = g.array(q_name)
        if q is None or q.ndim != 3:
            return None
        zp_f = np.zeros_like(scale, np.float32) if zp is None else zp.astype(np.float32)
        sc = scale.astype(np.float32).reshape(q.shape[0], 1, -1)
        w = (q.astype(np.float32) - zp_f.reshape(q.shape[0], 1, -1)) * sc  # [dirs, in, 4H]
        name = g.fresh(q_name.removesuffix("_quantized") + "_float")
        g.graph.initializer.append(
            numpy_helper.from_array(np.ascontiguousarray(w.transpose(0, 2, 1)), name)
        )
        weights.append(name)
    inputs = [ins[0], *weights, *ins[3:8]]
    while inputs and not inputs[-1]:
        inputs.pop()
    lstm = helper.make_node("LSTM", inputs, list(node.output), node.name or None)
    lstm.attribute.extend(node.attribute)
    return [node], lstm


def _prune(model: onnx.ModelProto) -> None:
    """Drop nodes no graph output depends on, then unused initializers and value infos."""
    graph = model.graph
    producer = {o: i for i, n in enumerate(graph.node) for o in n.output if o}
    live: set[int] = set()
    stack = [o.name for o in graph.output]
    seen = set(stack)
    while stack:
        idx = producer.get(stack.pop())
        if idx is None or idx in live:
            continue
        live.add(idx)
        for x in graph.node[idx].input:
            if x and x not in seen:
                seen.add(x)
                stack.append(x)
    kept = [n for i, n in enumerate(graph.node) if i in live]
    del graph.node[:]
    graph.node.extend(kept)
    used = {x for n in kept for x in n.input} | {o.name for o in graph.output}
    inits = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(inits)
    produced = {o for n in kept for o in n.output}
    infos = [v for v in graph.value_info if v.name in produced]
    del graph.value_info[:]
    graph.value_info.extend(infos)


def _ensure_opset(model: onnx.ModelProto, domain: str, version: int) -> None:
    for op in model.opset_import:
        if op.domain == domain:
            op.version = max(op.version, version)
            return
    model.opset_import.append(helper.make_opsetid(domain, version))


def dequantize(model: onnx.ModelProto) -> onnx.ModelProto:
    """A float32 graph: every matched dynamic-quantisation pattern as float Conv/MatMul/LSTM.

    Patterns that do not match exactly (another quantiser) are left as they are.
    """
    out = _copy(model)
    g = _Graph(out.graph)
    replaced: dict[int, NodeProto] = {}  # id(first node of a chain) -> new node
    dropped: set[int] = set()
    for node in list(out.graph.node):
        result: tuple[list[NodeProto], NodeProto] | None = None
        if node.op_type == "ConvInteger":
            result = _dequantize_conv(g, node)
        elif node.op_type == "MatMulInteger":
            result = _dequantize_matmul(g, node)
        elif node.op_type == "DynamicQuantizeLSTM" and node.domain == "com.microsoft":
            result = _dequantize_lstm(g, node)
        if result is None:
            continue
        chain, new = result
        replaced[id(chain[0])] = new
        dropped.update(id(n) for n in chain[1:])
    nodes = []
    for node in out.graph.node:
        if id(node) in replaced:
            nodes.append(replaced[id(node)])
        elif id(node) not in dropped:
            nodes.append(node)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    _prune(out)
    return out


def _ints(node: NodeProto, name: str) -> list[int] | None:
    for a in node.attribute:
        if a.name == name:
            return list(a.ints)
    return None


def conv1d_as_conv2d(model: onnx.ModelProto) -> onnx.ModelProto:
    """Every float 1-D ``Conv`` with a constant weight as a ``1 x k`` 2-D ``Conv``.

    ``x [N, C, T]`` -> ``Unsqueeze(axis 2)`` -> ``Conv`` on ``[N, C, 1, T]`` ->
    ``Squeeze(axis 2)``; a conv whose input is another rewritten conv's output
    reads that 4-D tensor directly (no Squeeze/Unsqueeze pair between them).
    2-D convs are what ORT's NCHWc layout transformer (``ORT_ENABLE_ALL``)
    turns into its blocked kernels; 1-D ones it leaves alone.
    ``ConvInteger`` (the int8 graph) is left as it is.
    """
    out = _copy(model)
    g = _Graph(out.graph)
    axes = g.fresh("conv2d_axis2")
    out.graph.initializer.append(numpy_helper.from_array(np.array([2], np.int64), axes))
    four_d: dict[str, str] = {}  # 3-D tensor -> its [N, C, 1, T] twin
    weights: dict[str, str] = {}
    nodes: list[NodeProto] = []
    for node in out.graph.node:
        w = g.array(node.input[1]) if node.op_type == "Conv" and len(node.input) > 1 else None
        if w is None or w.ndim != 3 or w.dtype != np.float32:
            nodes.append(node)
            continue
        x = node.input[0]
        if x not in four_d:
            x4 = g.fresh(x + "_4d")
            nodes.append(helper.make_node("Unsqueeze", [x, axes], [x4], g.fresh(x4 + "_unsq")))
            four_d[x] = x4
        if node.input[1] not in weights:
            w_name = g.fresh(node.input[1] + "_2d")
            out.graph.initializer.append(numpy_helper.from_array(w[:, :, None, :].copy(), w_name))
            weights[node.input[1]] = w_name
        y = node.output[0]
        y4 = g.fresh(y + "_4d")
        conv = helper.make_node(
            "Conv", [four_d[x], weights[node.input[1]], *node.input[2:]], [y4], node.name or None
        )
        for a in node.attribute:
            if a.name in ("kernel_shape", "strides", "dilations"):
                conv.attribute.append(helper.make_attribute(a.name, [1, *a.ints]))
            elif a.name == "pads":
                p = list(a.ints)
                conv.attribute.append(helper.make_attribute("pads", [0, p[0], 0, p[1]]))
            else:
                conv.attribute.append(a)
        if _ints(node, "kernel_shape") is None:
            conv.attribute.append(helper.make_attribute("kernel_shape", [1, int(w.shape[2])]))
        nodes.append(conv)
        nodes.append(helper.make_node("Squeeze", [y4, axes], [y], g.fresh(y + "_sq")))
        four_d[y] = y4
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    _ensure_opset(out, "", 13)
    _prune(out)
    return out


def identity(model: onnx.ModelProto) -> onnx.ModelProto:
    """The stage as shipped (a copy)."""
    return _copy(model)


def dequantize_conv2d(model: onnx.ModelProto) -> onnx.ModelProto:
    """``dequantize`` then ``conv1d_as_conv2d``."""
    return conv1d_as_conv2d(dequantize(model))


#: Variant name -> graph transform (apply to each stage's ModelProto).
VARIANTS: dict[str, Transform] = {
    "int8": identity,
    "fp32": dequantize,
    "fp32_conv2d": dequantize_conv2d,
}


def build_stage(source: str | bytes, variant: str) -> bytes:
    """A ``split_sources`` stage (path or bytes) rewritten by ``VARIANTS[variant]``, serialised."""
    model = onnx.load_from_string(source) if isinstance(source, bytes) else onnx.load(source)
    return VARIANTS[variant](model).SerializeToString()


def session_options(
    threads: int = 1,
    *,
    spinning: bool = False,
    opt_level: str = "all",
    denormal_as_zero: bool = False,
    mem_pattern: bool = True,
    entries: dict[str, str] | None = None,
) -> Any:
    """ONNX Runtime session options as the engine sets them, plus a plan's choices.

    ``opt_level``: ``"all"`` (ORT_ENABLE_ALL, ORT's default: includes the NCHWc
    layout transformer that ``conv1d_as_conv2d`` is for), ``"extended"`` or
    ``"basic"``. ``denormal_as_zero`` sets ``session.set_denormal_as_zero``;
    ``mem_pattern`` False turns off the memory-pattern planner; ``entries`` are
    extra ``add_session_config_entry`` keys.
    """
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.log_severity_level = 3
    opts.graph_optimization_level = {
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    }[opt_level]
    opts.enable_mem_pattern = mem_pattern
    if not spinning:
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if denormal_as_zero:
        opts.add_session_config_entry("session.set_denormal_as_zero", "1")
    for key, value in (entries or {}).items():
        opts.add_session_config_entry(key, value)
    return opts
