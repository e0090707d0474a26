"""The QTS GGUF contract (this project's format): metadata keys and fallbacks, projection rules,
routing by prefix (split vs bundled), presets/dialects, quant types, clear errors."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import qwen3_helpers as qh

from engines.qwen3.errors import GgufError
from engines.qwen3.weights.gguf_loader import (
    GgufBundle,
    GgufFile,
    check_projection,
    find_projection,
    read_metadata,
)

Q = gguf.GGMLQuantizationType


def _meta(tmp_path: Path, talker_kv: dict, pred_kv: dict | None = None, **tensors):
    t = qh.write_gguf(tmp_path / "talker.gguf", talker_kv, tensors.get("talker"))
    if pred_kv is None and "pred" not in tensors:
        return read_metadata(GgufBundle(t, t))
    p = qh.write_gguf(tmp_path / "pred.gguf", pred_kv or {}, tensors.get("pred"))
    return read_metadata(GgufBundle(t, p))


FULL_TALKER = {
    "qwen3-tts.talker.embedding_length": 2048,
    "qwen3-tts.talker.block_count": 28,
    "qwen3-tts.talker.feed_forward_length": 6144,
    "qwen3-tts.talker.attention.head_count": 16,
    "qwen3-tts.talker.attention.head_count_kv": 8,
    "qwen3-tts.talker.attention.key_length": 128,
    "qwen3-tts.talker.vocab_size": 3072,
    "qwen3-tts.talker.text_vocab_size": 151936,
    "qwen3-tts.talker.text_hidden_size": 2048,
    "qwen3-tts.talker.rope.freq_base": 1000000.0,
    "qwen3-tts.talker.attention.layer_norm_rms_epsilon": 1e-6,
}
FULL_PRED = {
    "qwen3-tts.code_pred.embedding_length": 1024,
    "qwen3-tts.code_pred.layer_count": 5,
    "qwen3-tts.code_pred.feed_forward_length": 3072,
    "qwen3-tts.code_pred.attention.head_count": 16,
    "qwen3-tts.code_pred.attention.head_count_kv": 8,
    "qwen3-tts.code_pred.attention.key_length": 128,
    "qwen3-tts.code_pred.vocab_size": 2048,
}


def test_independent_2048_1024_metadata_without_tensors(tmp_path: Path) -> None:
    m = _meta(tmp_path, FULL_TALKER, FULL_PRED)
    assert m.talker.hidden_size == 2048 and m.predictor.hidden_size == 1024
    assert (m.talker.n_layers, m.predictor.n_layers) == (28, 5)
    assert (m.talker.intermediate_size, m.predictor.intermediate_size) == (6144, 3072)
    assert m.predictor.n_attention_heads == 16 and m.predictor.n_key_value_heads == 8
    assert m.predictor.head_dim == 128 and m.predictor.vocab_size == 2048
    # missing predictor eps/theta inherit the talker values
    assert m.predictor.rms_norm_eps == pytest.approx(1e-6)
    assert m.predictor.rope_theta == 1e6
    assert m.has_projection_widths


def test_predictor_namespace_and_aliases(tmp_path: Path) -> None:
    pred = {
        "qwen3-tts.code_predictor.hidden_size": 1024,
        "qwen3-tts.code_predictor.block_count": 5,
        "qwen3-tts.code_predictor.feed_forward_length": 3072,
        "qwen3-tts.code_predictor.attention.head_count": 16,
        "qwen3-tts.code_predictor.attention.head_count_kv": 8,
        "qwen3-tts.code_predictor.rope.freq_base": 10000.0,
    }
    m = _meta(tmp_path, FULL_TALKER, pred)
    assert m.predictor.hidden_size == 1024 and m.predictor.n_layers == 5
    assert m.predictor.rope_theta == 10000.0
    assert m.predictor.head_dim == 128  # inherited from the talker key_length


def test_talker_width_fallbacks(tmp_path: Path) -> None:
    base = {k: v for k, v in FULL_TALKER.items() if k != "qwen3-tts.talker.embedding_length"}
    m = _meta(tmp_path, {**base, "qwen3-tts.talker.hidden_size": 1024}, FULL_PRED)
    assert m.talker.hidden_size == 1024
    m = _meta(tmp_path, {**base, "qwen3-tts.embedding_length": 512}, FULL_PRED)
    assert m.talker.hidden_size == 512
    m = _meta(
        tmp_path, base, FULL_PRED, talker={"talker.output_norm.weight": np.ones(768, np.float32)}
    )
    assert m.talker.hidden_size == 768
    with pytest.raises(GgufError, match="talker width"):
        _meta(tmp_path, base, FULL_PRED)


def test_predictor_values_derived_from_tensor_shapes(tmp_path: Path) -> None:
    # width 8, 2 heads of 4, 1 kv head, ffn 12, 2 layers -- no predictor metadata at all
    z = np.zeros
    pred_t = {
        "code_pred.output_norm.weight": np.ones(8, np.float32),
        "code_pred.blk.0.attn_q.weight": z((8, 8), np.float32),
        "code_pred.blk.0.attn_k.weight": z((4, 8), np.float32),
        "code_pred.blk.0.attn_q_norm.weight": np.ones(4, np.float32),
        "code_pred.blk.0.ffn_gate.weight": z((12, 8), np.float32),
        "code_pred.blk.1.attn_q.weight": z((8, 8), np.float32),
        "code_pred.lm_head.0.weight": z((2048, 8), np.float32),
    }
    m = _meta(tmp_path, FULL_TALKER, {}, pred=pred_t)
    p = m.predictor
    assert (p.hidden_size, p.n_attention_heads, p.n_key_value_heads) == (8, 2, 1)
    assert (p.head_dim, p.intermediate_size, p.n_layers, p.vocab_size) == (4, 12, 2, 2048)


def test_presets_dialects_languages_and_identity_from_metadata(tmp_path: Path) -> None:
    kv = {
        **FULL_TALKER,
        "qwen3-tts.talker.spk_id.ryan": 3000,
        "qwen3-tts.talker.spk_id.eric": 2001,
        "qwen3-tts.talker.spk_is_dialect.ryan": False,
        "qwen3-tts.talker.spk_is_dialect.eric": "sichuan_dialect",
        "qwen3-tts.talker.codec_language_id.english": 2050,
        "qwen3-tts.talker.codec_language_id.sichuan_dialect": 2062,
        "qwen3-tts.tts_model_type": "custom_voice",
        "qwen3-tts.tts_model_size": "1b7",
    }
    m = _meta(tmp_path, kv, FULL_PRED)
    assert m.speakers == {"ryan": 3000, "eric": 2001}
    assert m.dialects == {"eric": "sichuan_dialect"}
    assert m.languages == {"english": 2050, "sichuan_dialect": 2062}
    assert (m.model_type, m.model_size) == ("custom_voice", "1.7b")
    bad = {**kv, "qwen3-tts.talker.spk_id.vivian": 5000}
    with pytest.raises(GgufError, match="outside the codec vocabulary"):
        _meta(tmp_path, bad, FULL_PRED)
    bad = {**kv, "qwen3-tts.talker.spk_is_dialect.ryan": "beijing_dialect"}
    with pytest.raises(GgufError, match="beijing_dialect"):
        _meta(tmp_path, bad, FULL_PRED)


def _proj_files(tmp_path: Path, tw: int, pw: int, talker_t=None, pred_t=None):
    kv_t = {**FULL_TALKER, "qwen3-tts.talker.embedding_length": tw}
    kv_p = {**FULL_PRED, "qwen3-tts.code_pred.embedding_length": pw}
    t = qh.write_gguf(tmp_path / "t.gguf", kv_t, talker_t)
    p = qh.write_gguf(tmp_path / "p.gguf", kv_p, pred_t)
    b = GgufBundle(t, p)
    return b, read_metadata(b)


@pytest.mark.parametrize(
    "prefix",
    [
        "code_pred.small_to_mtp_projection",
        "talker.code_predictor.small_to_mtp_projection",
        "small_to_mtp_projection",
        "code_pred.mtp_proj",
    ],
)
@pytest.mark.parametrize("where", ["talker", "pred"])
def test_projection_prefixes_in_either_file(tmp_path: Path, prefix: str, where: str) -> None:
    tensors = {prefix + ".weight": np.zeros((2, 4), np.float32), prefix + ".bias": np.zeros(2)}
    b, m = _proj_files(tmp_path, 4, 2, **{f"{where}_t": tensors})
    w, bias = find_projection(b)
    assert w is not None and bias is not None
    assert w.ggml_shape == (4, 2) and bias.ggml_shape == (2,)
    check_projection(m, w, bias, b.predictor.path)


def test_invalid_projection_shapes(tmp_path: Path) -> None:
    # differing widths without the projection
    b, m = _proj_files(tmp_path, 4, 2)
    with pytest.raises(GgufError, match=r"projection .* is required; weight and bias missing"):
        check_projection(m, *find_projection(b), b.predictor.path)
    # weight present, bias missing
    b, m = _proj_files(
        tmp_path, 4, 2, pred_t={"code_pred.small_to_mtp_projection.weight": np.zeros((2, 4))}
    )
    with pytest.raises(GgufError, match="bias missing"):
        check_projection(m, *find_projection(b), b.predictor.path)
    # transposed weight (GGML [2, 4] instead of [4, 2])
    b, m = _proj_files(
        tmp_path,
        4,
        2,
        pred_t={
            "code_pred.small_to_mtp_projection.weight": np.zeros((4, 2)),
            "code_pred.small_to_mtp_projection.bias": np.zeros(2),
        },
    )
    with pytest.raises(GgufError, match=r"GGML shape \[2, 4\], expected \[4, 2\]"):
        check_projection(m, *find_projection(b), b.predictor.path)
    # wrong bias width
    b, m = _proj_files(
        tmp_path,
        4,
        2,
        pred_t={
            "code_pred.small_to_mtp_projection.weight": np.zeros((2, 4)),
            "code_pred.small_to_mtp_projection.bias": np.zeros(4),
        },
    )
    with pytest.raises(GgufError, match=r"bias .* expected \[2\]"):
        check_projection(m, *find_projection(b), b.predictor.path)
    # equal widths: no projection is fine
    b, m = _proj_files(tmp_path, 4, 4)
    check_projection(m, *find_projection(b), b.predictor.path)


def _q4_k_block_bytes(rows: int, d: float = 1.0) -> np.ndarray:
    """Hand-built Q4_K rows (256 values each): all scales 1, mins 0, nibbles 3 (low) / 5 (high)."""
    block = np.zeros(144, dtype=np.uint8)
    block[0:2] = np.frombuffer(np.float16(d).tobytes(), dtype=np.uint8)
    block[2:4] = np.frombuffer(np.float16(0.0).tobytes(), dtype=np.uint8)
    scales = np.zeros(12, dtype=np.uint8)
    scales[0:4] = 1  # sub-blocks 0..3: scale 1, min 0
    scales[8:12] = 1  # sub-blocks 4..7: low nibble = scale 1, high nibble = min 0
    block[4:16] = scales
    block[16:] = 0x53
    return np.tile(block, (rows, 1))


def test_quant_types_dequantize_and_gather_rows(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 64)).astype(np.float32)
    q8 = gguf.quants.quantize(x, Q.Q8_0)
    bf = gguf.quants.quantize(x, Q.BF16)
    path = qh.write_gguf(
        tmp_path / "q.gguf",
        {},
        {
            "f32": x,
            "f16": (x.astype(np.float16), Q.F16),
            "bf16": (bf, Q.BF16),
            "q8": (q8, Q.Q8_0),
            "q4k": (_q4_k_block_bytes(3), Q.Q4_K),
        },
    )
    f = GgufFile(path)
    np.testing.assert_array_equal(f.tensors["f32"].numpy(), x)
    np.testing.assert_allclose(f.tensors["f16"].numpy(), x, atol=2e-3)
    np.testing.assert_allclose(f.tensors["bf16"].numpy(), x, atol=2e-2, rtol=1e-2)
    np.testing.assert_allclose(f.tensors["q8"].numpy(), x, atol=0.05)
    assert f.tensors["q8"].type_name == "Q8_0" and f.tensors["q8"].ggml_shape == (64, 6)
    np.testing.assert_array_equal(f.tensors["q8"].rows([4, 1]), f.tensors["q8"].numpy()[[4, 1]])
    q4 = f.tensors["q4k"].numpy()
    assert q4.shape == (3, 256)
    want = np.tile(np.r_[np.full(32, 3.0), np.full(32, 5.0)], 4)
    np.testing.assert_array_equal(q4[0], want)
    np.testing.assert_array_equal(f.tensors["q4k"].rows([2]), q4[2:3])
    with pytest.raises(GgufError, match="row id out of range"):
        f.tensors["q8"].rows([6])


def test_clear_errors_for_missing_truncated_and_unknown_types(tmp_path: Path) -> None:
    with pytest.raises(GgufError, match=r"nope\.gguf: file not found"):
        GgufFile(tmp_path / "nope.gguf")
    (tmp_path / "junk.gguf").write_bytes(b"NOTAGGUF" * 10)
    with pytest.raises(GgufError, match="not a GGUF file"):
        GgufFile(tmp_path / "junk.gguf")
    good = qh.write_gguf(tmp_path / "good.gguf", {"a": 1}, {"w": np.ones((4, 32), np.float32)})
    data = good.read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[:-100])
    with pytest.raises(GgufError, match=r"cut\.gguf: .*truncated"):
        GgufFile(tmp_path / "cut.gguf")
    # unknown tensor type: patch the type field of tensor "w" (after name, n_dims, dims)
    raw = bytearray(data)
    at = raw.index((1).to_bytes(8, "little") + b"w\x02\x00\x00\x00")  # len, name, n_dims
    type_off = at + 8 + 1 + 4 + 8 * 2
    raw[type_off : type_off + 4] = (200).to_bytes(4, "little")
    (tmp_path / "badtype.gguf").write_bytes(bytes(raw))
    with pytest.raises(GgufError, match=r"badtype\.gguf: unknown tensor type"):
        GgufFile(tmp_path / "badtype.gguf")


def test_split_and_bundled_files_load_alike(tmp_path: Path) -> None:
    eng_split, paths_split, _ = qh.build_tiny_engine(tmp_path / "s", "custom_voice")
    eng_bund, paths_bund, _ = qh.build_tiny_engine(tmp_path / "b", "custom_voice", bundled=True)
    assert paths_split.talker_gguf != paths_split.code_predictor_gguf
    assert paths_bund.talker_gguf == paths_bund.code_predictor_gguf == paths_bund.tokenizer_gguf
    # the split predictor file holds only code_pred.* tensors, the talker file only talker.*
    names_t = set(GgufFile(paths_split.talker_gguf).tensors)
    names_p = set(GgufFile(paths_split.code_predictor_gguf).tensors)
    assert all(n.startswith("talker.") for n in names_t)
    assert all(n.startswith("code_pred.") for n in names_p)
    assert names_t | names_p == set(GgufFile(paths_bund.talker_gguf).tensors)
    from engines.qwen3.modes import PresetSpeaker
    from engines.qwen3.serving.request import ModeSynthesizeRequest

    req = ModeSynthesizeRequest(
        text="Hello world", speaker=PresetSpeaker.Ryan, greedy=True, max_frames=6
    )
    a, _ = eng_split.generate_codes(req)
    b, _ = eng_bund.generate_codes(req)
    np.testing.assert_array_equal(a, b)


def test_wrong_tensor_shape_names_file_and_tensor(tmp_path: Path) -> None:
    from engines.qwen3.weights.gguf_loader import load_weights

    _, paths, _ = qh.build_tiny_engine(tmp_path, "custom_voice")
    # a predictor file from a model with another width
    _, other, _ = qh.build_tiny_engine(tmp_path / "o", "custom_voice", hidden=32, cp_hidden=16)
    b = GgufBundle(paths.talker_gguf, other.code_predictor_gguf)
    with pytest.raises(
        GgufError, match=r"code-predictor.*GGML shape \[32, 16\], expected \[64, 16\]"
    ):
        load_weights(b)
