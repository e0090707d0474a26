"""The ONNX vocoder wrapper and streaming decoder (engines/qwen3/serving/vocoder.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from qwen3_vocoder_fixture import VocoderFixtureSpec, export_tiny_vocoder

from engines.qwen3.serving.vocoder import SAMPLES_PER_FRAME, StreamingDecoder, Vocoder, VocoderError


@pytest.fixture(scope="module")
def voc_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("voc")
    for tm in (False, True):
        for sq in (False, True):
            for ln in (False, True):
                spec = VocoderFixtureSpec(time_major=tm, squeeze_channel=sq, with_lengths=ln)
                export_tiny_vocoder(d / f"v_{int(tm)}{int(sq)}{int(ln)}.onnx", spec)
    return d


@pytest.fixture(scope="module")
def voc(voc_dir: Path) -> Vocoder:
    return Vocoder(voc_dir / "v_000.onnx", threads=1)


def _codes(t: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 2048, size=(t, 16), dtype=np.int64)


def _stream(dec: StreamingDecoder, codes: np.ndarray) -> tuple[np.ndarray, list[int]]:
    parts: list[np.ndarray] = []
    sizes: list[int] = []
    for f in codes:
        out = dec.push(f)
        if out is not None:
            parts.append(out)
            sizes.append(out.shape[0])
    rest = dec.flush()
    if rest.size:
        parts.append(rest)
        sizes.append(rest.shape[0])
    return (np.concatenate(parts) if parts else np.zeros(0, np.float32)), sizes


@pytest.mark.parametrize("tm", [0, 1])
@pytest.mark.parametrize("sq", [0, 1])
@pytest.mark.parametrize("ln", [0, 1])
def test_layouts_agree(voc_dir: Path, voc: Vocoder, tm: int, sq: int, ln: int) -> None:
    v = Vocoder(voc_dir / f"v_{tm}{sq}{ln}.onnx", threads=1)
    assert v.layout == ("BTQ" if tm else "BQT")
    assert v.audio_rank == (2 if sq else 3)
    assert (v.lengths_output is not None) == bool(ln)
    codes = _codes(7)
    wav = v.decode(codes)
    assert wav.dtype == np.float32 and wav.shape == (7 * SAMPLES_PER_FRAME,)
    assert float(np.abs(wav).max()) <= 1.0
    assert float(np.abs(wav).max()) > 0.01
    # Same weights (same seed), different interface: same audio.
    np.testing.assert_allclose(wav, voc.decode(codes), atol=1e-5)


def test_frame_count_and_determinism(voc: Vocoder) -> None:
    for t in (1, 2, 13):
        assert voc.decode(_codes(t, t)).shape == (t * SAMPLES_PER_FRAME,)
    np.testing.assert_array_equal(voc.decode(_codes(5)), voc.decode(_codes(5)))
    assert not np.allclose(voc.decode(_codes(5, 1)), voc.decode(_codes(5, 2)))
    assert voc.decode(np.zeros((0, 16), np.int64)).shape == (0,)
    assert voc.sample_rate == 24000


def test_clamped_output(voc_dir: Path) -> None:
    loud = export_tiny_vocoder(voc_dir / "loud.onnx", VocoderFixtureSpec(gain=40.0))
    wav = Vocoder(loud).decode(_codes(4))
    assert float(wav.max()) == 1.0 and float(wav.min()) == -1.0


def test_left_context_matters(voc: Vocoder) -> None:
    codes = _codes(40, 3)
    a = voc.decode(codes, chunk_frames=None)[-SAMPLES_PER_FRAME:]
    codes2 = codes.copy()
    codes2[:20] = _codes(20, 4)
    b = voc.decode(codes2, chunk_frames=None)[-SAMPLES_PER_FRAME:]
    assert float(np.abs(a - b).max()) > 1e-4  # the last frame sees 20+ frames back


def test_streaming_close_to_full(voc: Vocoder) -> None:
    # Measured on this fixture: max |diff| 0.0076..0.0092 with 25 frames of context
    # (the dilated tap reaches 32 frames), ~1.0..1.35 with none.
    codes = _codes(120, 1)
    full = voc.decode(codes, chunk_frames=None)
    st, sizes = _stream(voc.streaming(chunk_frames=4, left_context=25), codes)
    assert st.shape == full.shape
    assert sizes == [4 * SAMPLES_PER_FRAME] * 30
    err25 = float(np.abs(st - full).max())
    assert err25 < 0.02
    st0, _ = _stream(voc.streaming(chunk_frames=4, left_context=0), codes)
    err0 = float(np.abs(st0 - full).max())
    assert err0 > 10 * err25
    st40, _ = _stream(voc.streaming(chunk_frames=4, left_context=40), codes)
    np.testing.assert_allclose(st40, full, atol=1e-5)  # context beyond the receptive field


def test_streaming_first_chunk_and_flush(voc: Vocoder) -> None:
    codes = _codes(11)
    dec = voc.streaming(chunk_frames=4, first_chunk_frames=1)
    st, sizes = _stream(dec, codes)
    assert [s // SAMPLES_PER_FRAME for s in sizes] == [1, 4, 4, 2]
    assert dec.frames_in == 11 and dec.samples_out == 11 * SAMPLES_PER_FRAME
    assert st.shape == (11 * SAMPLES_PER_FRAME,)
    assert dec.flush().shape == (0,)
    empty = voc.streaming()
    assert empty.flush().shape == (0,) and empty.pending_frames == 0


def test_decode_chunked_matches_official_scheme(voc: Vocoder) -> None:
    codes = _codes(70, 5)
    full = voc.decode(codes, chunk_frames=None)
    chunked = voc.decode(codes, chunk_frames=30, left_context=25)
    assert chunked.shape == full.shape
    assert float(np.abs(chunked - full).max()) < 0.02


def test_icl_ref_codes_prefix(voc: Vocoder) -> None:
    ref = _codes(10, 7)
    gen = _codes(9, 8)
    whole = voc.decode(np.concatenate([ref, gen]), chunk_frames=None)
    st, _ = _stream(voc.streaming(chunk_frames=3, ref_codes=ref), gen)
    assert st.shape == (9 * SAMPLES_PER_FRAME,)
    np.testing.assert_allclose(st, whole[10 * SAMPLES_PER_FRAME :], atol=1e-5)
    plain, _ = _stream(voc.streaming(chunk_frames=3), gen)
    assert float(np.abs(plain - st).max()) > 1e-3  # the reference context changes the start


def test_bad_codes(voc: Vocoder) -> None:
    with pytest.raises(ValueError, match=r"\[frames, 16\]"):
        voc.decode(np.zeros((3, 15), np.int64))
    with pytest.raises(ValueError, match=r"0\.\.2047"):
        voc.decode(np.full((2, 16), 2048))
    with pytest.raises(ValueError, match=r"0\.\.2047"):
        voc.decode(np.full((2, 16), -1))
    with pytest.raises(ValueError, match="integers"):
        voc.decode(np.zeros((2, 16), np.float32))
    dec = voc.streaming()
    with pytest.raises(ValueError, match="one frame"):
        dec.push(np.zeros((2, 16), np.int64))
    with pytest.raises(ValueError, match="chunk_frames"):
        voc.streaming(chunk_frames=0)
    with pytest.raises(ValueError, match="left_context"):
        voc.streaming(left_context=-1)


def test_bad_files(tmp_path: Path) -> None:
    with pytest.raises(VocoderError, match="missing"):
        Vocoder(tmp_path / "none.onnx")
    with pytest.raises(VocoderError, match="directory"):
        Vocoder(tmp_path)
    (tmp_path / "empty.onnx").write_bytes(b"")
    with pytest.raises(VocoderError, match="empty"):
        Vocoder(tmp_path / "empty.onnx")
    (tmp_path / "junk.onnx").write_bytes(b"this is not a protobuf \x00\xff" * 10)
    with pytest.raises(VocoderError, match="cannot be loaded"):
        Vocoder(tmp_path / "junk.onnx")


def _graph(path: Path, inputs: list[tuple[str, int, list[Any]]], out_shape: list[Any]) -> Path:
    import onnx
    from onnx import TensorProto, helper

    x = inputs[0][0]
    nodes = [
        helper.make_node("Cast", [x], ["f"], to=TensorProto.FLOAT),
        helper.make_node("Identity", ["f"], ["y"]),
    ]
    g = helper.make_graph(
        nodes,
        "bad",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return path


def test_graph_without_contract(tmp_path: Path) -> None:
    from onnx import TensorProto

    i64 = TensorProto.INT64
    p = _graph(tmp_path / "a.onnx", [("codes", TensorProto.FLOAT, ["b", 16, "t"])], ["b", 16, "t"])
    with pytest.raises(VocoderError, match="must be int64"):
        Vocoder(p)
    p = _graph(tmp_path / "b.onnx", [("codes", i64, ["b", "x", "t"])], ["b", "x", "t"])
    with pytest.raises(VocoderError, match="cannot tell the code layout"):
        Vocoder(p)
    p = _graph(tmp_path / "c.onnx", [("codes", i64, ["b", 16])], ["b", 16])
    with pytest.raises(VocoderError, match="rank 3"):
        Vocoder(p)
    p = _graph(tmp_path / "d.onnx", [("codes", i64, ["b", 16, "t"])], ["b", 16, "t"])
    with pytest.raises(VocoderError, match="16 channels"):
        Vocoder(p)
    two: list[tuple[str, int, list[Any]]] = [
        ("codes", i64, ["b", 16, "t"]),
        ("state", TensorProto.FLOAT, [1]),
    ]
    p = _graph(tmp_path / "e.onnx", two, ["b", 1, "t"])
    with pytest.raises(VocoderError, match="stateful"):
        Vocoder(p)
    # Right interface, wrong sample count: caught at decode time.
    p = _graph(tmp_path / "f.onnx", [("codes", i64, ["b", "t", 16])], ["b", "t", 16])
    v = Vocoder(p)
    assert v.layout == "BTQ"
    with pytest.raises(VocoderError, match=r"16 samples for 1 frames"):
        v.decode(_codes(1))


def test_device_and_threads_validation(voc_dir: Path) -> None:
    with pytest.raises(VocoderError, match="device"):
        Vocoder(voc_dir / "v_000.onnx", device="tpu")
    with pytest.raises(VocoderError, match="threads"):
        Vocoder(voc_dir / "v_000.onnx", threads=0)
    # cuda without the CUDA EP falls back to CPU (with a warning), never fails.
    v = Vocoder(voc_dir / "v_000.onnx", device="cuda")
    assert "CPUExecutionProvider" in v.providers
    assert v.decode(_codes(2)).shape == (2 * SAMPLES_PER_FRAME,)
