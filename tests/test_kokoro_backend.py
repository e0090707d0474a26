"""The ONNX backend's edge caps: the cap vector, and the duration-cap graph patch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from engines.kokoro.backend import (
    DUR_CAP_INPUT,
    DURATIONS_TENSOR,
    MARK_FRAMES,
    NO_CAP,
    OPEN_TAIL_PAD_FRAMES,
    TAIL_PAD_FRAMES,
    OnnxBackend,
    capped_model_source,
    patch_duration_cap,
)


def test_duration_cap_caps_only_the_end() -> None:
    b = OnnxBackend(Path("unused.onnx"))
    assert not b.edge_cap  # opt-in (--edge-cap)
    b.set_marks(frozenset({3, 4}))
    # the leading pad is never capped: the first phoneme's onset lies in its last frames
    cap = b.duration_cap([50, 60, 3]).tolist()
    assert cap == [NO_CAP, NO_CAP, NO_CAP, MARK_FRAMES, TAIL_PAD_FRAMES]
    cap = b.duration_cap([50, 60]).tolist()  # ends in a phoneme: it and its decay are kept
    assert cap == [NO_CAP, NO_CAP, NO_CAP, OPEN_TAIL_PAD_FRAMES]
    assert OPEN_TAIL_PAD_FRAMES > TAIL_PAD_FRAMES
    assert b.duration_cap([]).tolist() == [NO_CAP, OPEN_TAIL_PAD_FRAMES]


def durations_graph(path: Path, *, with_durations: bool = True) -> Path:
    """x (int64 [T]) -> durations (Identity) -> CumSum -> y: the shape of Kokoro's aligner."""
    name = DURATIONS_TENSOR if with_durations else "other"
    axis = helper.make_tensor("axis", TensorProto.INT64, [], [0])
    graph = helper.make_graph(
        [
            helper.make_node("Identity", ["x"], [name]),
            helper.make_node("CumSum", [name, "axis"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.INT64, ["T"])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, ["T"])],
        initializer=[axis],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_patch_feeds_min_of_durations_and_cap_to_the_consumers(tmp_path: Path) -> None:
    data = patch_duration_cap(durations_graph(tmp_path / "m.onnx"))
    assert data is not None
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    assert {i.name for i in sess.get_inputs()} == {"x", DUR_CAP_INPUT}
    x = np.array([13, 2, 3, 8, 6], np.int64)
    cap = np.array([4, NO_CAP, NO_CAP, 2, 1], np.int64)
    (y,) = sess.run(None, {"x": x, DUR_CAP_INPUT: cap})
    np.testing.assert_array_equal(y, np.cumsum(np.minimum(x, cap)))


def test_graph_without_durations_is_left_alone(tmp_path: Path) -> None:
    path = durations_graph(tmp_path / "m.onnx", with_durations=False)
    assert patch_duration_cap(path) is None
    assert capped_model_source(path) is None
    assert not list(tmp_path.glob("*.durcap*"))


def test_patched_graph_is_cached_beside_the_model(tmp_path: Path) -> None:
    path = durations_graph(tmp_path / "m.onnx")
    first = capped_model_source(path)
    assert first == str(tmp_path / "m.onnx.durcap")
    cached = Path(first)
    stamp = tmp_path / "m.onnx.durcap.stamp"
    assert stamp.is_file() and not list(tmp_path.glob("*.part"))
    cached.write_bytes(cached.read_bytes())  # reused while the stamp matches the model
    before = cached.stat().st_mtime_ns
    assert capped_model_source(path) == first and cached.stat().st_mtime_ns == before
    stamp.write_text("stale")  # the model changed: patched again
    assert capped_model_source(path) == first
    assert stamp.read_text() != "stale"
    # the variant loader globs *.onnx: the cache must not look like a model
    assert sorted(p.name for p in tmp_path.glob("*.onnx")) == ["m.onnx"]
