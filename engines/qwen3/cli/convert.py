"""``ttsdock qwen3-convert``: official Qwen3-TTS checkpoint -> GGUF files, vocoder and encoders.

The GGUF conversion is ``engines.qwen3.conversion.gguf_convert``; with the
checkpoint's ``speech_tokenizer/`` the command also exports the vocoder ONNX
and, for Base checkpoints, the speaker and codec encoders
(``engines.qwen3.conversion.onnx_export``). Errors print one line and exit with status 2.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from engines.qwen3.conversion.gguf_convert import DTYPES, convert
from engines.qwen3.errors import ConversionError


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="ttsdock qwen3-convert",
        description="Convert an official Qwen3-TTS Hugging Face checkpoint into QTS GGUF files.",
    )
    p.add_argument("--hf-dir", required=True, type=Path, help="checkpoint directory")
    p.add_argument("--out", required=True, type=Path, help="output directory")
    p.add_argument("--dtype", default="f16", choices=DTYPES, help="2-D tensor type (default f16)")
    p.add_argument("--size", default="auto", help="auto (from config.json), 0.6b or 1.7b")
    p.add_argument(
        "--mode", default="auto", help="auto (from config.json), base, customvoice or voicedesign"
    )
    p.add_argument("--bundled", action="store_true", help="write one bundled GGUF file")
    p.add_argument(
        "--vocoder-only",
        action="store_true",
        help="only export speech_tokenizer/'s decoder to qwen3-tts-vocoder.onnx",
    )
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    size = None if args.size == "auto" else args.size
    written: list[Path] = []
    try:
        if not args.vocoder_only:
            files = convert(
                args.hf_dir,
                args.out,
                dtype=args.dtype,
                size=size,
                mode=None if args.mode == "auto" else args.mode,
                bundled=args.bundled,
            )
            written += [files.talker, files.code_predictor, files.tokenizer]
        from engines.qwen3.conversion.onnx_export import export_codec_files

        codec = export_codec_files(args.hf_dir, args.out, speaker=not args.vocoder_only, size=size)
    except ConversionError as exc:
        print(f"qwen3-convert: error: {exc}", file=sys.stderr)
        return 2
    if args.vocoder_only and codec.vocoder is None:
        print(f"qwen3-convert: error: {'; '.join(codec.notes or [])}", file=sys.stderr)
        return 2
    written += [f for f in (codec.vocoder, codec.speaker_encoder, codec.codec_encoder) if f]
    for path in dict.fromkeys(written):
        print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB)")
    for check in codec.checks or []:
        print(check.line())
    for note in codec.notes or []:
        print(note)
    print(f"done in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
