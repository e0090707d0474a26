"""``ttsdock qwen3-clone-prompt``: a voice-clone prompt (x-vector + reference codes) from a WAV.

With ``--model-dir`` it runs the ONNX files ``qwen3-convert`` wrote for a Base
checkpoint (``qwen3-tts-{size}-base-speaker-encoder.onnx``,
``qwen3-tts-codec-encoder.onnx``; no torch); with ``--hf-dir`` it runs the
official checkpoint's speaker encoder and codec encoder in torch (our own
modules). The engine and ``qwen3-synth`` take the result with
``--clone-prompt PROMPT.npz``. Errors print one line and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from engines.qwen3.conversion.onnx_export import CODEC_ENCODER_FILE, speaker_encoder_file
from engines.qwen3.errors import ConversionError
from engines.qwen3.modes import size_or_none
from engines.qwen3.serving.clone_prompt import (
    SIZES,
    ClonePromptError,
    ClonePromptWarning,
    CodesFn,
    FloatArray,
    IntArray,
    XVectorFn,
    make_prompt,
    prepare_reference,
    read_wav,
)


def _onnx_session(path: Path) -> Any:
    import onnxruntime as ort

    try:
        return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise ClonePromptError(f"{path}: cannot be loaded as ONNX: {exc}") from exc


def onnx_backends(
    model_dir: Path, size: str | None, x_vector_only: bool
) -> tuple[str, XVectorFn, CodesFn | None]:
    sizes = [size] if size else [s for s in SIZES if (model_dir / speaker_encoder_file(s)).exists()]
    if not sizes:
        raise ClonePromptError(
            f"{model_dir}: no qwen3-tts-*-base-speaker-encoder.onnx (convert a Base checkpoint "
            "with ttsdock qwen3-convert; CustomVoice/VoiceDesign models cannot clone)"
        )
    if len(sizes) > 1:
        raise ClonePromptError(f"{model_dir}: speaker encoders for {', '.join(sizes)}; pass --size")
    spk_path = model_dir / speaker_encoder_file(sizes[0])
    if not spk_path.exists():
        raise ClonePromptError(f"{spk_path}: missing")
    spk = _onnx_session(spk_path)

    def xvec(mel: FloatArray) -> FloatArray:
        return np.asarray(spk.run(None, {"mels": mel[None]})[0][0], np.float32)

    codes: CodesFn | None = None
    if not x_vector_only:
        enc_path = model_dir / CODEC_ENCODER_FILE
        if not enc_path.exists():
            raise ClonePromptError(
                f"{enc_path}: missing (the checkpoint had no speech_tokenizer/); "
                "use --x-vector-only"
            )
        enc = _onnx_session(enc_path)

        def codes_fn(audio: FloatArray) -> IntArray:
            out = enc.run(None, {"audio": audio[None, None].astype(np.float32)})[0]
            return np.asarray(out[0].T, np.int64)

        codes = codes_fn
    return sizes[0], xvec, codes


def torch_backends(
    hf_dir: Path, size: str | None, x_vector_only: bool
) -> tuple[str, XVectorFn, CodesFn | None]:
    import torch

    from engines.qwen3.conversion.codec_decoder import load_codec_tensors
    from engines.qwen3.conversion.speaker_encoder import load_speaker_encoder

    try:
        cfg = json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ClonePromptError(f"{hf_dir / 'config.json'}: cannot be read: {exc}") from exc
    if cfg.get("tts_model_type") != "base" or "speaker_encoder_config" not in cfg:
        raise ClonePromptError(
            f"{hf_dir}: a {cfg.get('tts_model_type')!r} checkpoint; only Base checkpoints "
            "have the speaker encoder that voice cloning needs"
        )
    raw = str(size or cfg.get("tts_model_size", "")).lower()
    slug = size_or_none(raw) or raw
    tensors = load_codec_tensors(hf_dir, "speaker_encoder.")
    spk = load_speaker_encoder(cfg["speaker_encoder_config"], tensors)

    def xvec(mel: FloatArray) -> FloatArray:
        with torch.no_grad():
            return spk(torch.from_numpy(mel)[None])[0].numpy().astype(np.float32)

    codes: CodesFn | None = None
    if not x_vector_only:
        from engines.qwen3.conversion.codec_encoder import load_encoder

        st = hf_dir / "speech_tokenizer"
        if not st.is_dir():
            raise ClonePromptError(
                f"{st}: missing (no codec in the checkpoint); use --x-vector-only"
            )
        enc = load_encoder(st)

        def codes_fn(audio: FloatArray) -> IntArray:
            with torch.no_grad():
                return enc(torch.from_numpy(audio)[None, None])[0].T.numpy().astype(np.int64)

        codes = codes_fn
    return slug, xvec, codes


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ttsdock qwen3-clone-prompt",
        description="Make a Qwen3-TTS voice-clone prompt (Base models) from a reference WAV.",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--hf-dir", type=Path, help="official Base checkpoint (runs torch)")
    src.add_argument("--model-dir", type=Path, help="qwen3-convert output of a Base checkpoint")
    p.add_argument("--ref-wav", type=Path, required=True, help="reference recording (WAV, 1-30 s)")
    p.add_argument("--ref-text", help="transcript of the reference (needed unless --x-vector-only)")
    p.add_argument(
        "--x-vector-only",
        action="store_true",
        help="speaker embedding only (no reference codes, no transcript needed)",
    )
    p.add_argument("--size", choices=list(SIZES), help="model size (default: from the files)")
    p.add_argument("--out", type=Path, required=True, help="prompt file to write (.npz)")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    try:
        args = p.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code) if isinstance(exc.code, int) else 2
    try:
        if not args.x_vector_only and not (args.ref_text and args.ref_text.strip()):
            raise ClonePromptError(
                "--ref-text is required for ICL cloning (the transcript of the reference); "
                "or pass --x-vector-only"
            )
        audio, rate = read_wav(args.ref_wav)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ClonePromptWarning)
            ref = prepare_reference(audio, rate, name=f"reference {str(args.ref_wav)!r}")
        for w in caught:
            print(f"warning: {w.message}", file=sys.stderr)
        if args.model_dir is not None:
            size, xvec, codes = onnx_backends(args.model_dir, args.size, args.x_vector_only)
        else:
            size, xvec, codes = torch_backends(args.hf_dir, args.size, args.x_vector_only)
        prompt = make_prompt(
            ref,
            model_size=size,
            x_vector=xvec,
            codes=codes,
            ref_text=args.ref_text,
            source=args.ref_wav.name,
        )
        if args.out.is_dir():
            raise ClonePromptError(f"--out {str(args.out)!r} is a directory")
        prompt.save(args.out)
    except (ClonePromptError, ConversionError, OSError) as exc:
        print(f"ttsdock qwen3-clone-prompt: error: {exc}", file=sys.stderr)
        return 2
    kind = "x-vector only" if not prompt.icl else f"ICL, {prompt.ref_codes.shape[0]} frames"  # type: ignore[union-attr]
    print(
        f"wrote {args.out} ({kind}; {prompt.model_size}, x-vector {prompt.x_vector.size}; "
        f"{prompt.seconds:.2f} s of reference at {rate} Hz -> 24000 Hz)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
