"""Streamed vs full vocoder decode against the left context, on an exported codec decoder.

The engine decodes codec frames in small chunks (``--chunk-frames``, default
4), each with ``left_context`` earlier frames prepended whose samples are
dropped (engines/qwen3/serving/vocoder.py ``StreamingDecoder``). The decoder's
transformer attends 72 frames back per layer, so a finite context is
near-exact, not exact. This script builds a codec decoder with the real
transformer shape (8 layers, hidden 512, window 72) and a narrow conv stack,
random weights (``--init official``: as a freshly built official decoder;
``--init strong``: the tests' larger values, a stress case), exports it with our
exporter, and prints max abs diff and SNR of the streamed output against the
full decode for each context length, plus the vocoder time per chunk::

    python benchmarks/qwen3_vocoder_context.py [--frames 200] [--chunk 4]
    python benchmarks/qwen3_vocoder_context.py --onnx models/qwen3/qwen3-tts-vocoder.onnx

``--onnx`` measures a real exported vocoder instead (the numbers that matter).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

CONTEXTS = (0, 4, 8, 16, 25, 36, 48, 72, 96, 144)


def official_init(arrays: dict[str, np.ndarray], seed: int) -> dict[str, np.ndarray]:
    """Values like a freshly constructed official decoder: linears/convs N(0, 0.02), layer
    scales 0.01, ConvNeXt gamma 1e-6, norms 1, biases and Snake parameters 0, codebooks N(0, 1)."""
    rng = np.random.default_rng(seed)
    out = {}
    for k, v in arrays.items():
        leaf = k.rsplit(".", 1)[-1]
        if leaf == "embedding_sum":
            x = rng.normal(0.0, 1.0, v.shape)
        elif leaf == "cluster_usage":
            x = np.ones(v.shape)
        elif leaf == "scale":
            x = np.full(v.shape, 0.01)
        elif leaf == "gamma":
            x = np.full(v.shape, 1e-6)
        elif v.ndim == 1:
            x = np.ones(v.shape) if "norm" in k else np.zeros(v.shape)
        else:
            x = rng.normal(0.0, 0.02, v.shape)
        out[k] = x.astype(np.float32)
    return out


def build(tmp: Path, layers: int, hidden: int, init: str, seed: int) -> Path:
    import qwen3_codec_helpers as ch
    from safetensors.numpy import save_file

    from engines.qwen3.conversion.onnx_export import export_vocoder

    dec = dict(ch.TINY_DECODER)
    dec.update(
        num_hidden_layers=layers,
        hidden_size=hidden,
        num_attention_heads=16,
        num_key_value_heads=16,
        head_dim=hidden // 16,
        intermediate_size=2 * hidden,
        latent_dim=64,
        codebook_dim=64,
        decoder_dim=64,
    )
    st = ch.write_speech_tokenizer(tmp / "speech_tokenizer", dec)
    if init == "official":
        arrays = official_init(ch.decoder_arrays(dec), seed)
        save_file(arrays, str(st / "model.safetensors"))
    out = tmp / "qwen3-tts-vocoder.onnx"
    print(export_vocoder(st, out).line())
    print(
        "decoder config:",
        json.dumps(
            {
                k: dec[k]
                for k in (
                    "num_hidden_layers",
                    "hidden_size",
                    "sliding_window",
                    "latent_dim",
                    "decoder_dim",
                )
            }
        ),
    )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--onnx", type=Path, help="a real qwen3-tts-vocoder.onnx (default: build one)")
    p.add_argument("--frames", type=int, default=200)
    p.add_argument("--chunk", type=int, default=4)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--init",
        choices=["official", "strong"],
        default="official",
        help="random weights: as the official class initialises them, or the tests' larger ones",
    )
    args = p.parse_args(argv)

    from engines.qwen3.conversion.onnx_export import snr_db
    from engines.qwen3.serving.vocoder import Vocoder

    print(f"loadavg: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    with tempfile.TemporaryDirectory() as td:
        path = args.onnx or build(Path(td), args.layers, args.hidden, args.init, args.seed)
        voc = Vocoder(path, threads=args.threads)
        codes = np.random.default_rng(args.seed).integers(0, 2048, size=(args.frames, 16))
        t0 = time.perf_counter()
        full = voc.decode(codes, chunk_frames=None)
        full_ms = (time.perf_counter() - t0) * 1e3
        print(f"full decode of {args.frames} frames: {full_ms:.0f} ms; chunk {args.chunk} frames")
        print("context  max_abs_diff  rms_diff   snr_db  ms_per_chunk")
        for ctx in CONTEXTS:
            dec = voc.streaming(chunk_frames=args.chunk, left_context=ctx)
            parts = []
            t1 = time.perf_counter()
            for row in codes:
                out = dec.push(row)
                if out is not None:
                    parts.append(out)
            parts.append(dec.flush())
            ms = (time.perf_counter() - t1) * 1e3 / max(1, dec.chunks_out)
            got = np.concatenate(parts)
            diff = got - full
            print(
                f"{ctx:7d}  {np.max(np.abs(diff)):12.2e}  {np.sqrt(np.mean(diff**2)):8.2e}  "
                f"{snr_db(full, got):7.1f}  {ms:12.1f}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
