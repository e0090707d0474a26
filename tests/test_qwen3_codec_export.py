"""``ttsdock qwen3-convert`` on official-layout checkpoints with ``speech_tokenizer/``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import qwen3_codec_helpers as ch

pytest.importorskip("torch")
pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def base_hf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    hf, _ = ch.write_full_checkpoint(tmp_path_factory.mktemp("hf") / "base", "base")
    return hf


def test_convert_writes_vocoder_and_encoders(base_hf: Path, tmp_path: Path, capsys) -> None:
    from engines.qwen3.cli.convert import main
    from engines.qwen3.serving.vocoder import Vocoder

    out = tmp_path / "out"
    assert main(["--hf-dir", str(base_hf), "--out", str(out), "--dtype", "f32"]) == 0
    text = capsys.readouterr().out
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "qwen3-tts-0.6b-base-code-predictor-f32.gguf",
        "qwen3-tts-0.6b-base-speaker-encoder.onnx",
        "qwen3-tts-0.6b-base-talker-f32.gguf",
        "qwen3-tts-0.6b-base-tokenizer.gguf",
        "qwen3-tts-codec-encoder.onnx",
        "qwen3-tts-vocoder.onnx",
    ]
    assert "vocoder: ONNX vs torch on 3 random inputs: max abs diff" in text
    assert "speaker encoder: ONNX vs torch" in text and "SNR" in text
    assert "codec encoder: ONNX vs torch on 2 random inputs: 100.00% of the codes identical" in text
    voc = Vocoder(out / "qwen3-tts-vocoder.onnx")
    assert voc.layout == "BQT"
    assert voc.decode(np.zeros((3, 16), np.int64)).shape == (3 * 1920,)


def test_vocoder_only(base_hf: Path, tmp_path: Path, capsys) -> None:
    from engines.qwen3.cli.convert import main

    out = tmp_path / "v"
    assert main(["--hf-dir", str(base_hf), "--out", str(out), "--vocoder-only"]) == 0
    assert [p.name for p in out.iterdir()] == ["qwen3-tts-vocoder.onnx"]


def test_checkpoint_without_codec_says_so(tmp_path: Path, capsys) -> None:
    from engines.qwen3.cli.convert import main

    hf, _ = ch.write_full_checkpoint(tmp_path / "cv", "custom_voice", with_codec=False)
    out = tmp_path / "out"
    assert main(["--hf-dir", str(hf), "--out", str(out), "--dtype", "f32"]) == 0
    text = capsys.readouterr().out
    assert "no vocoder written" in text and "speech_tokenizer does not exist" in text
    assert not (out / "qwen3-tts-vocoder.onnx").exists()
    assert len(list(out.glob("*.gguf"))) == 3
    assert main(["--hf-dir", str(hf), "--out", str(out), "--vocoder-only"]) == 2
    assert "no vocoder written" in capsys.readouterr().err


def test_broken_codec_is_a_clear_error(base_hf: Path, tmp_path: Path, capsys) -> None:
    from engines.qwen3.cli.convert import main

    hf, _ = ch.write_full_checkpoint(tmp_path / "b", "base")
    st = hf / "speech_tokenizer"
    from safetensors.numpy import save_file

    arrays = ch.decoder_arrays()
    arrays.pop("decoder.pre_conv.conv.weight")
    save_file(arrays, str(st / "model.safetensors"))
    assert main(["--hf-dir", str(hf), "--out", str(tmp_path / "o"), "--vocoder-only"]) == 2
    err = capsys.readouterr().err
    assert "decoder tensors do not match" in err and "pre_conv.conv.weight" in err
    (st / "config.json").write_text(json.dumps({"model_type": "x"}))
    assert main(["--hf-dir", str(hf), "--out", str(tmp_path / "o"), "--vocoder-only"]) == 2
    assert "no decoder_config" in capsys.readouterr().err
