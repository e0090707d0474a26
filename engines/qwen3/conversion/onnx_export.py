"""ONNX export of the codec decoder (vocoder) and the speaker encoder, validated at export time.

``qwen3-convert`` calls these (convert time only; torch and our own modules in
``codec_decoder`` / ``speaker_encoder``, no official package):

- ``export_vocoder``: ``speech_tokenizer/`` -> ``qwen3-tts-vocoder.onnx``, input
  ``codes`` int64 ``[B,16,T]`` (batch and frame axes dynamic), output ``audio``
  float32 ``[B,1,T*1920]``; then ONNX Runtime is compared with the torch decoder
  on random codes of a few lengths (max abs diff and SNR reported; a diff above
  ``VOCODER_TOLERANCE`` fails the conversion).
- ``export_speaker_encoder``: Base checkpoints' ECAPA-TDNN -> ONNX, input
  ``mels`` float32 ``[1, frames, 128]`` (frames dynamic), output ``xvector``
  ``[1, enc_dim]``, checked the same way on random mels.
- ``export_codec_encoder`` (Base): the codec's encoder -> ``qwen3-tts-codec-encoder.onnx``,
  input ``audio`` ``[1,1,S]`` (S a multiple of 1920), output ``codes`` int64
  ``[1,16,S/1920]``, checked by code agreement on random audio.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from engines.qwen3.errors import ConversionError
from engines.qwen3.modes import size_or_none

VOCODER_FILE = "qwen3-tts-vocoder.onnx"
CODEC_ENCODER_FILE = "qwen3-tts-codec-encoder.onnx"
#: Share of reference codes ONNX Runtime must reproduce exactly (a nearest-codeword search
#: may flip on a near-tie between two codewords; typical: all equal).
ENCODER_MIN_AGREEMENT = 0.99
#: Max abs difference ONNX Runtime vs torch accepted at export (fp32 both; typical 1e-6).
VOCODER_TOLERANCE = 1e-3
SPEAKER_TOLERANCE = 1e-3
OPSET = 17


@dataclass(frozen=True)
class ExportCheck:
    """Validation of one exported graph against its torch module."""

    what: str
    cases: int
    max_abs_diff: float
    snr_db: float

    def line(self) -> str:
        if self.what == "codec encoder":
            return (
                f"codec encoder: ONNX vs torch on {self.cases} random inputs: "
                f"{1.0 - self.max_abs_diff:.2%} of the codes identical"
            )
        return (
            f"{self.what}: ONNX vs torch on {self.cases} random inputs: "
            f"max abs diff {self.max_abs_diff:.2e}, SNR {self.snr_db:.1f} dB"
        )


def snr_db(ref: npt.ArrayLike, test: npt.ArrayLike) -> float:
    """``10 log10(sum ref^2 / sum (ref - test)^2)``; inf when identical."""
    r = np.asarray(ref, dtype=np.float64).reshape(-1)
    t = np.asarray(test, dtype=np.float64).reshape(-1)
    noise = float(np.sum((r - t) ** 2))
    sig = float(np.sum(r**2))
    if noise == 0.0:
        return math.inf
    if sig == 0.0:
        return -math.inf
    return 10.0 * math.log10(sig / noise)


def _export(module: Any, args: tuple[Any, ...], path: Path, **kw: Any) -> None:
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.part")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation chatter
        with torch.no_grad():
            torch.onnx.export(module, args, str(tmp), dynamo=False, opset_version=OPSET, **kw)
    tmp.replace(path)


def export_vocoder(
    st_dir: str | Path,
    out_path: str | Path,
    *,
    check_frames: Sequence[int] = (1, 7, 40),
    seed: int = 0,
) -> ExportCheck:
    """Export the codec decoder of ``st_dir`` to ``out_path`` and validate it."""
    import onnxruntime as ort
    import torch

    from engines.qwen3.conversion.codec_decoder import load_decoder

    model = load_decoder(st_dir)
    out = Path(out_path)
    example = torch.zeros((1, 16, 8), dtype=torch.int64)
    _export(
        model,
        (example,),
        out,
        input_names=["codes"],
        output_names=["audio"],
        dynamic_axes={"codes": {0: "batch", 2: "frames"}, "audio": {0: "batch", 2: "samples"}},
    )
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(seed)
    worst, refs, tests = 0.0, [], []
    spf = model.config.samples_per_frame
    for t in check_frames:
        codes = rng.integers(0, model.config.codebook_size, size=(1, 16, t), dtype=np.int64)
        with torch.no_grad():
            ref = model(torch.from_numpy(codes)).numpy()
        got = np.asarray(sess.run(None, {"codes": codes})[0])
        if got.shape != (1, 1, t * spf):
            raise ConversionError(
                f"exported vocoder returned shape {list(got.shape)} for {t} frames, "
                f"expected [1, 1, {t * spf}]"
            )
        worst = max(worst, float(np.max(np.abs(got - ref))))
        refs.append(ref.reshape(-1))
        tests.append(got.reshape(-1))
    check = ExportCheck(
        "vocoder", len(check_frames), worst, snr_db(np.concatenate(refs), np.concatenate(tests))
    )
    if worst > VOCODER_TOLERANCE:
        raise ConversionError(f"{check.line()} exceeds the tolerance {VOCODER_TOLERANCE:g}")
    return check


def export_speaker_encoder(
    model: Any, out_path: str | Path, *, check_frames: Sequence[int] = (96, 250), seed: int = 0
) -> ExportCheck:
    """Export a loaded speaker-encoder module (``speaker_encoder.load_speaker_encoder``)."""
    import onnxruntime as ort
    import torch

    out = Path(out_path)
    mel_dim = int(model.blocks[0].conv.in_channels)
    _export(
        model,
        (torch.zeros((1, 120, mel_dim), dtype=torch.float32),),
        out,
        input_names=["mels"],
        output_names=["xvector"],
        dynamic_axes={"mels": {1: "frames"}},
    )
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(seed)
    worst, refs, tests = 0.0, [], []
    for t in check_frames:
        mels = rng.normal(-4.0, 2.0, size=(1, t, mel_dim)).astype(np.float32)
        with torch.no_grad():
            ref = model(torch.from_numpy(mels)).numpy()
        got = np.asarray(sess.run(None, {"mels": mels})[0])
        worst = max(worst, float(np.max(np.abs(got - ref))))
        refs.append(ref.reshape(-1))
        tests.append(got.reshape(-1))
    check = ExportCheck(
        "speaker encoder",
        len(check_frames),
        worst,
        snr_db(np.concatenate(refs), np.concatenate(tests)),
    )
    if worst > SPEAKER_TOLERANCE:
        raise ConversionError(f"{check.line()} exceeds the tolerance {SPEAKER_TOLERANCE:g}")
    return check


def export_codec_encoder(
    st_dir: str | Path,
    out_path: str | Path,
    *,
    check_frames: Sequence[int] = (5, 31),
    seed: int = 0,
) -> ExportCheck:
    """Export the codec encoder of ``st_dir`` (audio ``[1,1,S]`` -> codes ``[1,16,S/1920]``)."""
    import onnxruntime as ort
    import torch

    from engines.qwen3.conversion.codec_encoder import HOP, load_encoder

    model = load_encoder(st_dir)
    out = Path(out_path)
    _export(
        model,
        (torch.zeros((1, 1, 8 * HOP), dtype=torch.float32),),
        out,
        input_names=["audio"],
        output_names=["codes"],
        dynamic_axes={"audio": {2: "samples"}, "codes": {2: "frames"}},
    )
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(seed)
    same = total = 0
    for t in check_frames:
        audio = (0.3 * rng.standard_normal((1, 1, t * HOP))).astype(np.float32)
        with torch.no_grad():
            ref = model(torch.from_numpy(audio)).numpy()
        got = np.asarray(sess.run(None, {"audio": audio})[0])
        if got.shape != ref.shape or got.shape != (1, 16, t):
            raise ConversionError(
                f"exported codec encoder returned {list(got.shape)} for {t} frames of audio"
            )
        same += int(np.sum(got == ref))
        total += got.size
    agree = same / total
    check = ExportCheck("codec encoder", len(check_frames), 1.0 - agree, math.inf)
    if agree < ENCODER_MIN_AGREEMENT:
        raise ConversionError(
            f"codec encoder: ONNX reproduces only {agree:.1%} of the torch codes "
            f"(needs {ENCODER_MIN_AGREEMENT:.0%})"
        )
    return check


def speaker_encoder_file(size_slug: str) -> str:
    return f"qwen3-tts-{size_slug}-base-speaker-encoder.onnx"


@dataclass
class CodecExport:
    """What ``export_codec_files`` wrote (None: not written) and why not."""

    vocoder: Path | None = None
    speaker_encoder: Path | None = None
    codec_encoder: Path | None = None
    checks: list[ExportCheck] | None = None
    notes: list[str] | None = None


def _size_slug(cfg: dict[str, Any], size: str | None) -> str:
    raw = str(size or cfg.get("tts_model_size") or "").lower()
    slug = size_or_none(raw)
    if slug is None:
        raise ConversionError(f"cannot tell the model size (tts_model_size={raw!r}); pass --size")
    return slug


def export_codec_files(
    hf_dir: str | Path,
    out_dir: str | Path,
    *,
    speaker: bool = True,
    size: str | None = None,
) -> CodecExport:
    """Export the vocoder (when ``speech_tokenizer/`` exists) and, for Base checkpoints with
    ``speaker_encoder.*`` tensors and ``speaker=True``, the speaker encoder."""
    import json

    from engines.qwen3.conversion.codec_decoder import load_codec_tensors

    src, out = Path(hf_dir), Path(out_dir)
    res = CodecExport(checks=[], notes=[])
    assert res.checks is not None and res.notes is not None
    st_dir = src / "speech_tokenizer"
    if st_dir.is_dir():
        res.vocoder = out / VOCODER_FILE
        res.checks.append(export_vocoder(st_dir, res.vocoder))
    else:
        res.notes.append(f"no vocoder written: {st_dir} does not exist (no 12 Hz codec in {src})")
    if not speaker:
        return res
    try:
        cfg = json.loads((src / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConversionError(f"{src / 'config.json'}: cannot read JSON: {exc}") from exc
    spk_cfg = cfg.get("speaker_encoder_config")
    if cfg.get("tts_model_type") != "base" or not isinstance(spk_cfg, dict):
        return res
    tensors = load_codec_tensors(src, "speaker_encoder.")
    if not tensors:
        res.notes.append("no speaker encoder written: the Base checkpoint has no speaker_encoder.*")
        return res
    from engines.qwen3.conversion.speaker_encoder import load_speaker_encoder

    model = load_speaker_encoder(spk_cfg, tensors)
    res.speaker_encoder = out / speaker_encoder_file(_size_slug(cfg, size))
    res.checks.append(export_speaker_encoder(model, res.speaker_encoder))
    if st_dir.is_dir():
        res.codec_encoder = out / CODEC_ENCODER_FILE
        res.checks.append(export_codec_encoder(st_dir, res.codec_encoder))
    else:
        res.notes.append("no codec encoder written: voice-clone prompts will be x-vector only")
    return res
