"""Voice statistics for the decoder's instance norms: windows that decode like the sentence.

Rule 1: this module rewrites an ONNX decoder graph (``add_norm_inputs``) and pools,
stores and checks statistics (``NormStats``); it runs no inference and knows no text.
Rule 2: the rewritten graph with ``norm_weight`` 1 computes exactly what the original
graph computes (every instance norm takes its own window's statistics); with 0 every
norm takes the given statistics instead, and then the decoder is local in time.

Why. The iSTFTNet generator has 44 instance norms (AdaIN: ``(x - mean) / sqrt(var +
eps)`` over time, per channel). Over a window they take the window's statistics, so a
window is never the sentence's own rendering: a short first window shifted "Sure, your
order" to "So you would" (README "Kokoro pipeline"), every window needed 10 frames of
context on each side, and the first window could not be short. Measured on the shipped
int8 decoder, 12 telephony sentences, Whisper tiny.en:

* windows decoded with the whole sentence's own statistics (an oracle: it needs the
  whole decode first) are heard like the whole sentence (2 word errors of 105, like
  kokoro-onnx), against 8 with each window's own statistics;
* the statistics depend strongly on the voice (another voice's statistics made speech
  unintelligible: 105 errors) but little on the sentence: statistics pooled over a few
  other sentences of the same voice render whole sentences heard exactly as with their
  own (3 and 3 errors; log-spectral distance 0.9-2.3 dB to the own-statistics render);
* with given statistics the decoder is local: windows of 32 frames with 2 or more
  frames of context join to the whole decode within 0.73-0.83 dB (the decoder's own
  noise source differs per run), against 5-9 dB with each window's own statistics at
  any context.

So the engine measures each voice's statistics once (a few calibration sentences,
cached in the models directory), and every window of that voice takes them.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
from onnx import NodeProto, TensorProto, helper

#: Bump when the rewrite or the calibration changes: cached statistics are measured again.
NORMS_VERSION = 2
NORM_WEIGHT = "norm_weight"  # float [1]: 1 = the window's own statistics, 0 = the given ones
MEAN_INPUT = "norm_mean_{}"
VAR_INPUT = "norm_var_{}"
MEAN_OUTPUT = "norm_own_mean_{}"
VAR_OUTPUT = "norm_own_var_{}"
Float64Array = npt.NDArray[np.float64]
Float32Array = npt.NDArray[np.float32]


@dataclass(frozen=True)
class _Norm:
    mean: NodeProto  # ReduceMean(x) over time
    sub: NodeProto  # x - mean
    var: NodeProto  # ReduceMean((x - mean)^2)
    add: NodeProto  # var + eps


def _consumers(graph: onnx.GraphProto) -> dict[str, list[NodeProto]]:
    out: dict[str, list[NodeProto]] = {}
    for n in graph.node:
        for x in n.input:
            out.setdefault(x, []).append(n)
    return out


def find_norms(graph: onnx.GraphProto) -> list[_Norm]:
    """The decomposed instance norms of ``graph``, in node order: ``m = ReduceMean(x)``,
    ``d = x - m``, ``v = ReduceMean(d * d)`` (or ``Pow(d, 2)``), ``v + eps``."""
    users = _consumers(graph)
    norms: list[_Norm] = []
    for node in graph.node:
        if node.op_type != "ReduceMean" or not node.input:
            continue
        x, m = node.input[0], node.output[0]
        subs = [u for u in users.get(m, []) if u.op_type == "Sub" and list(u.input) == [x, m]]
        if len(subs) != 1:
            continue
        d = subs[0].output[0]
        squares = [
            u
            for u in users.get(d, [])
            if (u.op_type == "Mul" and list(u.input) == [d, d])
            or (u.op_type == "Pow" and u.input[0] == d)
        ]
        found = None
        for sq in squares:
            for r in users.get(sq.output[0], []):
                if r.op_type != "ReduceMean":
                    continue
                adds = [u for u in users.get(r.output[0], []) if u.op_type == "Add"]
                if len(adds) == 1:
                    found = _Norm(node, subs[0], r, adds[0])
        if found is not None:
            norms.append(found)
    return norms


def add_norm_inputs(model: onnx.ModelProto) -> int:
    """Rewrite ``model`` in place so that its instance norms take given statistics (Rule
    2; in place because a decoder is 30-80 MB); returns how many norms it has, 0 (and
    ``model`` unchanged) when it has no decomposed instance norm (another export:
    windows keep their own).

    Adds the inputs ``norm_weight`` ``[1]`` and, per norm ``k``, ``norm_mean_k`` and
    ``norm_var_k`` (``[1, C, 1]``, or ``[1, 1, 1]`` zeros while the weight is 1), and the
    outputs ``norm_own_mean_k`` and ``norm_own_var_k``: the window's own statistics
    when the weight is 1 (calibration reads them).
    """
    graph = model.graph
    norms = find_norms(graph)
    if not norms:
        return 0
    graph.input.append(helper.make_tensor_value_info(NORM_WEIGHT, TensorProto.FLOAT, [1]))
    graph.initializer.append(helper.make_tensor("norm_one", TensorProto.FLOAT, [1], [1.0]))
    after: dict[str, list[NodeProto]] = {}
    head = [helper.make_node("Sub", ["norm_one", NORM_WEIGHT], ["norm_given_w"])]
    for k, norm in enumerate(norms):
        mi, vi, p = MEAN_INPUT.format(k), VAR_INPUT.format(k), f"norm{k}_"
        for name in (mi, vi):
            graph.input.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, None, 1]))
        own_m, own_v = norm.mean.output[0], norm.var.output[0]
        # mean' = w * own + (1 - w) * given, before the Sub that centres x
        after[norm.mean.name or own_m] = [
            helper.make_node("Mul", [own_m, NORM_WEIGHT], [p + "own_w"]),
            helper.make_node("Mul", [mi, "norm_given_w"], [p + "given_w"]),
            helper.make_node("Add", [p + "own_w", p + "given_w"], [p + "mean"]),
        ]
        norm.sub.input[1] = p + "mean"
        # var' = w * E[(x - mean')^2] + (1 - w) * (given var + (given mean - mean')^2)
        after[norm.var.name or own_v] = [
            helper.make_node("Sub", [mi, p + "mean"], [p + "dm"]),
            helper.make_node("Mul", [p + "dm", p + "dm"], [p + "dm2"]),
            helper.make_node("Add", [vi, p + "dm2"], [p + "given_v"]),
            helper.make_node("Mul", [p + "given_v", "norm_given_w"], [p + "given_vw"]),
            helper.make_node("Mul", [own_v, NORM_WEIGHT], [p + "own_vw"]),
            helper.make_node("Add", [p + "own_vw", p + "given_vw"], [p + "var"]),
        ]
        norm.add.input[list(norm.add.input).index(own_v)] = p + "var"
        graph.output.append(
            helper.make_tensor_value_info(MEAN_OUTPUT.format(k), TensorProto.FLOAT, [1, None, 1])
        )
        graph.output.append(
            helper.make_tensor_value_info(VAR_OUTPUT.format(k), TensorProto.FLOAT, [1, None, 1])
        )
        after[norm.var.name or own_v].append(
            helper.make_node("Identity", [own_v], [VAR_OUTPUT.format(k)])
        )
        after[norm.mean.name or own_m].append(
            helper.make_node("Identity", [own_m], [MEAN_OUTPUT.format(k)])
        )
    nodes = list(graph.node)
    del graph.node[:]
    graph.node.extend(head)
    for n in nodes:  # each new node right after its producer: the order stays topological
        graph.node.append(n)
        graph.node.extend(after.get(n.name or n.output[0], []))
    return len(norms)


def norm_count(model: onnx.ModelProto) -> int:
    """How many ``norm_mean_k`` inputs ``model`` takes (0: not rewritten)."""
    names = {i.name for i in model.graph.input}
    k = 0
    while MEAN_INPUT.format(k) in names:
        k += 1
    return k


@dataclass(frozen=True)
class NormStats:
    """Per-norm statistics (``[1, C, 1]`` float32 means and variances) of one voice."""

    means: tuple[Float32Array, ...]
    variances: tuple[Float32Array, ...]

    def __post_init__(self) -> None:
        if len(self.means) != len(self.variances) or not self.means:
            raise ValueError("statistics need one mean and one variance per norm")
        for m, v in zip(self.means, self.variances, strict=True):
            if m.shape != v.shape or m.ndim != 3 or m.shape[0] != 1 or m.shape[2] != 1:
                raise ValueError(f"statistics of shape {m.shape} / {v.shape}, not [1, C, 1]")
            if not (np.all(np.isfinite(m)) and np.all(np.isfinite(v)) and np.all(v >= 0)):
                raise ValueError("statistics must be finite, variances >= 0")

    def feeds(self, first: int = 0, count: int | None = None) -> dict[str, Float32Array]:
        """The inputs of a rewritten graph that give its norms these statistics (with
        weight 0): norms ``first .. first + count`` (default: all) as its ``0 .. count``
        (the frame stage's norms come first, the decoder's after them)."""
        end = len(self.means) if count is None else first + count
        if not 0 <= first <= end <= len(self.means):
            raise ValueError(f"norms {first}..{end} of {len(self.means)}")
        out: dict[str, Float32Array] = {NORM_WEIGHT: np.zeros(1, np.float32)}
        for k in range(end - first):
            out[MEAN_INPUT.format(k)] = self.means[first + k]
            out[VAR_INPUT.format(k)] = self.variances[first + k]
        return out

    def to_bytes(self) -> bytes:
        buf = io.BytesIO()
        arrays = {f"m{k}": m for k, m in enumerate(self.means)}
        arrays.update({f"v{k}": v for k, v in enumerate(self.variances)})
        np.savez(buf, **arrays)  # type: ignore[arg-type]
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes, norms: int) -> NormStats:
        """Raises ``ValueError`` for anything but ``norms`` valid statistics."""
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as z:
                means = tuple(np.asarray(z[f"m{k}"], np.float32) for k in range(norms))
                variances = tuple(np.asarray(z[f"v{k}"], np.float32) for k in range(norms))
                if len(z.files) != 2 * norms:
                    raise ValueError(f"{len(z.files)} arrays for {norms} norms")
        except (OSError, KeyError, EOFError) as exc:
            raise ValueError(f"unreadable statistics: {exc}") from exc
        return cls(means, variances)


def own_feeds(norms: int) -> dict[str, Float32Array]:
    """The decoder inputs that keep every norm's own statistics (weight 1)."""
    zero = np.zeros((1, 1, 1), np.float32)
    out: dict[str, Float32Array] = {NORM_WEIGHT: np.ones(1, np.float32)}
    for k in range(norms):
        out[MEAN_INPUT.format(k)] = zero
        out[VAR_INPUT.format(k)] = zero
    return out


def pool(samples: Sequence[tuple[int, Sequence[Any], Sequence[Any]]]) -> NormStats:
    """Statistics of all frames of ``samples``: ``(frames, means, variances)`` per
    sentence, each sentence's own statistics (``norm_own_*`` with weight 1)."""
    if not samples:
        raise ValueError("no sentences to pool")
    total = float(sum(n for n, _, _ in samples))
    if total <= 0:
        raise ValueError("no frames to pool")
    count = len(samples[0][1])
    first: list[Float64Array] = []
    second: list[Float64Array] = []
    for k in range(count):
        m = np.zeros_like(np.asarray(samples[0][1][k], np.float64))
        e2 = np.zeros_like(m)
        for n, ms, vs in samples:
            mk = np.asarray(ms[k], np.float64)
            m += n * mk
            e2 += n * (np.asarray(vs[k], np.float64) + mk * mk)
        first.append(m / total)
        second.append(e2 / total)
    return NormStats(
        tuple(m.astype(np.float32) for m in first),
        tuple(
            np.maximum(e2 - m * m, 0.0).astype(np.float32)
            for m, e2 in zip(first, second, strict=True)
        ),
    )


def voice_key(model_key: str, voice: npt.NDArray[Any]) -> str:
    """Cache key of one voice's statistics: the decoder, the voice's rows, the version."""
    h = hashlib.sha256()
    h.update(f"{NORMS_VERSION}:{model_key}:".encode())
    h.update(np.ascontiguousarray(voice, dtype=np.float32).tobytes())
    return h.hexdigest()[:32]


class NormCache:
    """``<dir>/<key>.npz``: one voice's statistics; unreadable or invalid files are
    measured again, never trusted."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory

    def get(self, key: str, norms: int) -> NormStats | None:
        path = self.dir / f"{key}.npz"
        try:
            return NormStats.from_bytes(path.read_bytes(), norms)
        except (OSError, ValueError):
            return None

    def put(self, key: str, stats: NormStats) -> None:
        """Written atomically; a directory that cannot be written keeps nothing."""
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            tmp = self.dir / f".{key}.{os.getpid()}.tmp"
            tmp.write_bytes(stats.to_bytes())
            os.replace(tmp, self.dir / f"{key}.npz")
        except OSError:
            pass
