"""``ttsdock qwen3-convert``: names, sizes, dtypes, metadata, errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import qwen3_helpers as qh

from engines.qwen3.cli.convert import main
from engines.qwen3.conversion.gguf_convert import gguf_name
from engines.qwen3.weights.gguf_loader import GgufBundle, GgufFile, read_metadata


def test_cli_writes_seed_file_names_and_metadata(tmp_path: Path, capsys) -> None:
    cfg = qh.tiny_config("custom_voice", text_hidden=8)
    hf = qh.write_checkpoint(
        tmp_path / "hf",
        cfg,
        dtype="bfloat16",
        extra={"speaker_encoder.fc.weight": np.ones((4, 4), np.float32)},
    )
    assert main(["--hf-dir", str(hf), "--out", str(tmp_path / "out")]) == 0
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == [
        "qwen3-tts-1.7b-customvoice-code-predictor-f16.gguf",
        "qwen3-tts-1.7b-customvoice-talker-f16.gguf",
        "qwen3-tts-1.7b-customvoice-tokenizer.gguf",
    ]
    assert "wrote" in capsys.readouterr().out
    t = tmp_path / "out" / names[1]
    p = tmp_path / "out" / names[0]
    meta = read_metadata(GgufBundle(t, p))
    assert (meta.model_type, meta.model_size) == ("custom_voice", "1.7b")
    assert meta.speakers["ryan"] == 3061 and meta.dialects == {
        "eric": "sichuan_dialect",
        "dylan": "beijing_dialect",
    }
    assert (meta.talker.hidden_size, meta.predictor.hidden_size) == (64, 32)
    assert "code_pred.small_to_mtp_projection.weight" in GgufFile(p).tensors
    tf = GgufFile(t)
    assert tf.tensors["talker.codec_embd.weight"].type_name == "F16"
    assert tf.tensors["talker.output_norm.weight"].type_name == "F32"
    # bf16 source values survive (bf16 -> f16 is exact for these magnitudes)
    want = qh.tensor_value("talker.model.norm.weight", (64,))
    np.testing.assert_allclose(tf.tensors["talker.output_norm.weight"].numpy(), want, atol=1e-2)


def test_small_size_names_and_bundled(tmp_path: Path) -> None:
    cfg = qh.tiny_config("base", size="0b6", hidden=32, cp_hidden=32, text_hidden=8)
    hf = qh.write_checkpoint(tmp_path / "hf", cfg)
    assert (
        main(["--hf-dir", str(hf), "--out", str(tmp_path / "o"), "--dtype", "q8_0", "--bundled"])
        == 0
    )
    (only,) = list((tmp_path / "o").iterdir())
    assert only.name == "qwen3-tts-0.6b-base-q8_0.gguf"
    f = GgufFile(only)
    assert "tokenizer.ggml.tokens" in f.fields
    assert not any("small_to_mtp" in n for n in f.tensors)  # equal widths: identity


def test_errors(tmp_path: Path, capsys) -> None:
    assert main(["--hf-dir", str(tmp_path / "none"), "--out", str(tmp_path / "o")]) == 2
    assert "not a directory" in capsys.readouterr().err
    cfg = qh.tiny_config("voice_design", text_hidden=8)
    hf = qh.write_checkpoint(tmp_path / "hf", cfg, extra={"talker.mystery.weight": np.ones(3)})
    assert main(["--hf-dir", str(hf), "--out", str(tmp_path / "o")]) == 2
    assert "unknown tensors" in capsys.readouterr().err
    (hf / "config.json").write_text(json.dumps({"tts_model_type": "voice_design"}))
    assert main(["--hf-dir", str(hf), "--out", str(tmp_path / "o")]) == 2
    assert "size" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--hf-dir", str(hf), "--out", str(tmp_path / "o"), "--dtype", "q4_k"])


def test_name_map() -> None:
    assert gguf_name("talker.model.layers.3.self_attn.q_norm.weight") == (
        "talker.blk.3.attn_q_norm.weight"
    )
    assert gguf_name("talker.code_predictor.model.layers.0.mlp.down_proj.weight") == (
        "code_pred.blk.0.ffn_down.weight"
    )
    assert gguf_name("talker.code_predictor.lm_head.14.weight") == "code_pred.lm_head.14.weight"
    assert gguf_name("speaker_encoder.fc.weight") is None
