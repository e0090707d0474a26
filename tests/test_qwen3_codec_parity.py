"""Codec decoder, exported vocoder and speaker encoder vs the official ``qwen-tts`` classes.

The golden data (tests/golden/qwen3/codec/, written by tests/qwen3_codec_oracle_gen.py
from the official ``Qwen3TTSTokenizerV2Decoder``, ``chunked_decode``,
``mel_spectrogram`` and ``extract_speaker_embedding``) hold only inputs and
outputs; the weights are re-derived from the tiny configs by name on both sides.
When ``qwen_tts`` is importable the golden data are regenerated and compared.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import qwen3_codec_helpers as ch

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

#: Tolerances (fp32 everywhere; the tiny decoder's output peaks near 1.0).
WAV_TOL = 1e-4  # our torch decoder and the exported ONNX vs official decode (measured ~1e-5)
MEL_TOL = 1e-4  # numpy log-mel vs official mel_spectrogram (measured 2.7e-5)
XVEC_TOL = 1e-4  # relative to the x-vector's largest component (measured ~2e-7)


@pytest.fixture(scope="module")
def golden() -> dict[str, np.ndarray]:
    with np.load(ch.GOLDEN_CODEC / "golden.npz") as z:
        return {k: z[k] for k in z.files}


@pytest.fixture(scope="module")
def about() -> dict:
    return json.loads((ch.GOLDEN_CODEC / "about.json").read_text())


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from engines.qwen3.conversion.onnx_export import export_vocoder

    root = tmp_path_factory.mktemp("codec")
    st = ch.write_speech_tokenizer(root / "speech_tokenizer")
    out = root / "qwen3-tts-vocoder.onnx"
    check = export_vocoder(st, out)
    assert check.max_abs_diff < 1e-4 and check.snr_db > 80
    return out


def _decoder():
    from engines.qwen3.conversion.codec_decoder import load_decoder

    return load_decoder(ch.write_speech_tokenizer(Path(_tmp()) / "st"))


def _tmp() -> str:
    import tempfile

    return tempfile.mkdtemp(prefix="qwen3codec")


def test_golden_matches_configs(about: dict) -> None:
    assert about["decoder_config"] == ch.TINY_DECODER
    assert about["speaker_config"] == ch.TINY_SPEAKER


def test_torch_decoder_matches_official(golden: dict, about: dict) -> None:
    dec = _decoder()
    with torch.no_grad():
        wav = dec(torch.from_numpy(golden["codes"]))[0, 0].numpy()
    assert wav.shape == (about["frames"] * 1920,)
    ref = golden["wav_full"]
    assert np.abs(ref).max() > 0.5 and ref.std() > 0.05  # a real signal, mostly unclipped
    assert np.max(np.abs(wav[:: about["stride"]] - ref)) < WAV_TOL


def test_exported_vocoder_matches_official(golden: dict, about: dict, exported: Path) -> None:
    from engines.qwen3.serving.vocoder import Vocoder

    voc = Vocoder(exported)
    assert voc.layout == "BQT"
    codes = golden["codes"][0].T  # [T,16]
    wav = voc.decode(codes, chunk_frames=None)
    assert np.max(np.abs(wav[:: about["stride"]] - golden["wav_full"])) < WAV_TOL
    # The official chunked_decode (chunk 12, left context 4 / 25) is what Vocoder.decode does.
    for ctx in (4, 25):
        ref = golden[f"wav_chunk{about['chunk']}_ctx{ctx}"]
        got = voc.decode(codes, chunk_frames=about["chunk"], left_context=ctx)
        assert np.max(np.abs(got[:: about["stride"]] - ref)) < WAV_TOL
    # ... and those differ from the full decode (context matters in this decoder).
    assert np.max(np.abs(golden["wav_chunk12_ctx4"] - golden["wav_full"])) > 1e-3


def test_frame_axis_is_dynamic(exported: Path) -> None:
    from engines.qwen3.serving.vocoder import Vocoder

    voc = Vocoder(exported)
    dec = _decoder()
    rng = np.random.default_rng(3)
    for t in (1, 2, 5, 73, 150):
        codes = rng.integers(0, 2048, size=(t, 16))
        got = voc.decode(codes, chunk_frames=None)
        with torch.no_grad():
            ref = dec(torch.from_numpy(codes.T[None].copy()))[0, 0].numpy()
        assert got.shape == (t * 1920,)
        assert np.max(np.abs(got - ref)) < WAV_TOL


def test_streamed_matches_full_within_tolerance(exported: Path) -> None:
    """The engine's chunked decode (4-frame chunks) against the full decode, by left context."""
    from engines.qwen3.conversion.onnx_export import snr_db
    from engines.qwen3.serving.vocoder import Vocoder

    voc = Vocoder(exported)
    codes = np.random.default_rng(5).integers(0, 2048, size=(120, 16))
    full = voc.decode(codes, chunk_frames=None)

    def streamed(ctx: int) -> np.ndarray:
        dec = voc.streaming(chunk_frames=4, left_context=ctx)
        parts = [a for a in (dec.push(r) for r in codes) if a is not None]
        parts.append(dec.flush())
        return np.concatenate(parts)

    snrs = {ctx: snr_db(full, streamed(ctx)) for ctx in (0, 25, 72)}
    assert snrs[0] < snrs[25] < snrs[72]  # more context, closer to the full decode
    # Each of the 2 attention layers reaches 71 frames back: with 2*72 frames of context the
    # streamed output is the full decode (the convolutions reach only a few frames).
    assert np.max(np.abs(streamed(2 * 72) - full)) < 1e-5
    assert np.max(np.abs(streamed(72) - full)) > 1e-3


def test_log_mel_matches_official(golden: dict, about: dict) -> None:
    from engines.qwen3.conversion.speaker_encoder import log_mel

    mel = log_mel(ch.test_audio(about["audio_s"]))
    assert mel.shape == golden["mel"].shape
    assert np.max(np.abs(mel - golden["mel"])) < MEL_TOL


def test_speaker_encoder_onnx_matches_official(golden: dict, about: dict, tmp_path: Path) -> None:
    from engines.qwen3.conversion.onnx_export import export_speaker_encoder
    from engines.qwen3.conversion.speaker_encoder import load_speaker_encoder, log_mel

    width = about["enc_dim"]
    tensors = {
        k[len("speaker_encoder.") :]: torch.from_numpy(v)
        for k, v in ch.speaker_arrays(width).items()
    }
    model = load_speaker_encoder({**ch.TINY_SPEAKER, "enc_dim": width}, tensors)
    path = tmp_path / "spk.onnx"
    export_speaker_encoder(model, path)
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    mel = log_mel(ch.test_audio(about["audio_s"]))
    xvec = sess.run(None, {"mels": mel[None]})[0][0]
    ref = golden["xvector"]
    assert np.max(np.abs(xvec - ref)) < XVEC_TOL * np.max(np.abs(ref))


@pytest.mark.skipif(importlib.util.find_spec("qwen_tts") is None, reason="qwen_tts not installed")
def test_golden_regenerates_identically() -> None:  # pragma: no cover - oracle venv only
    import qwen3_codec_oracle_gen as og

    fresh = og.generate()
    with np.load(ch.GOLDEN_CODEC / "golden.npz") as z:
        for k in z.files:
            np.testing.assert_allclose(fresh[k], z[k], atol=1e-6)
