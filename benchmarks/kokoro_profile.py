"""Where a Kokoro inference's time goes: ONNX Runtime node profiling, grouped by stage.

Runs the shipped whole graph (the model the engine splits) with ONNX Runtime's
profiler for several token counts and sums node kernel time per stage, by the
node names of the export: PL-BERT, text encoder, duration predictor, F0 and
energy predictors, alignment (the rest of the encoder), the frame-rate half
of the decoder, the harmonic source (F0 upsampling, sine source, its STFT),
the generator (upsampling convolutions and residual blocks) and the iSTFT.
Fused nodes without a stage in their name count as "other". It also times the
engine's two split stages on the same tokens: prosody pass vs decoding all
frames, i.e. the fixed cost before the first window and the cost that streams.

    python benchmarks/kokoro_profile.py [--tokens 15,50,100,250] [--threads 2] [--runs 3]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from engines.kokoro.backend import OnnxBackend  # noqa: E402
from engines.kokoro.models import (  # noqa: E402
    assemble_default_model,
    default_models_dir,
    load_default_voices,
)
from engines.runtime.synth import CancelToken  # noqa: E402

STAGES = (
    "bert",
    "text_encoder",
    "duration_predictor",
    "f0_energy_predictor",
    "alignment",
    "decoder_framerate",
    "harmonic_source",
    "generator",
    "istft",
    "other",
)


def stage(name: str) -> str:
    n = name
    if "/encoder/bert/" in n or "encoder.bert." in n:
        return "bert"
    if "text_encoder" in n:
        return "text_encoder"
    if "/encoder/predictor" in n or "/encoder/shared" in n or "bert_encoder" in n:
        return "duration_predictor"
    if "/encoder/F0" in n or "/encoder/N" in n or "encoder.predictor.F0" in n:
        return "f0_energy_predictor"
    if "encoder.predictor.N" in n:
        return "f0_energy_predictor"
    if "m_source" in n or "f0_upsamp" in n or "generator/STFT" in n:
        return "harmonic_source"
    if "istft" in n or "conv_post" in n:
        return "istft"
    if "generator" in n:
        return "generator"
    if "/decoder/" in n or "decoder.decoder." in n:
        return "decoder_framerate"
    if "/encoder/" in n or n.startswith("encoder."):
        return "alignment"
    if n.startswith(("FastGelu", "SkipLayerNorm", "Attention", "EmbedLayer", "BiasGelu")):
        return "bert"  # PL-BERT's fused transformer nodes
    return "other"


def tokens_of(n: int) -> list[int]:
    rng = np.random.default_rng(n)
    toks = rng.integers(43, 70, n).tolist()
    for i in range(4, n, 6):
        toks[i] = 16  # a space every few phonemes, like real words
    return toks


def main() -> None:
    import onnxruntime as ort

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", default="15,50,100,250")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--models-dir", type=Path, default=None)
    args = p.parse_args()
    model = assemble_default_model(args.models_dir or default_models_dir())
    voice = load_default_voices()["jf_alpha"]
    split = OnnxBackend(model, threads=args.threads)
    split.load()
    print(f"load average {os.getloadavg()[0]:.2f}, {args.threads} intra-op threads, int8 model")
    head = "tokens audio_s run_ms " + " ".join(f"{s[:12]:>12}" for s in STAGES)
    print(head + "  | prosody_ms decode_ms  prosody_share")
    for n in [int(x) for x in args.tokens.split(",")]:
        toks = tokens_of(n)
        style = voice[min(n, len(voice)) - 1].reshape(1, -1)
        feeds = {
            "tokens": np.array([[0, *toks, 0]], np.int64),
            "style": style,
            "speed": np.array([1.0], np.float32),
        }
        with tempfile.TemporaryDirectory() as tmp:
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = args.threads
            opts.inter_op_num_threads = 1
            opts.log_severity_level = 3
            opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
            opts.enable_profiling = True
            opts.profile_file_prefix = str(Path(tmp) / "kokoro")
            sess = ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])
            t0 = time.perf_counter()
            for _ in range(args.runs):
                audio = sess.run(None, feeds)[0]
            run_ms = (time.perf_counter() - t0) / args.runs * 1000
            events = json.loads(Path(sess.end_profiling()).read_text())
        per: collections.Counter[str] = collections.Counter()
        for e in events:
            if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
                per[stage(e["name"][: -len("_kernel_time")])] += e["dur"]
        total = sum(per.values()) or 1
        cancel = CancelToken()
        t0 = time.perf_counter()
        for _ in range(args.runs):
            pr = split.prosody(toks, style, 1.0, cancel)
        t_p = (time.perf_counter() - t0) / args.runs * 1000
        t0 = time.perf_counter()
        for _ in range(args.runs):
            split.decode(pr, 0, pr.n_frames, style, cancel)
        t_d = (time.perf_counter() - t0) / args.runs * 1000
        shares = " ".join(f"{100 * per[s] / total:11.1f}%" for s in STAGES)
        print(
            f"{n:6d} {audio.size / 24000:7.2f} {run_ms:6.0f} {shares}  | "
            f"{t_p:10.0f} {t_d:9.0f}  {100 * t_p / (t_p + t_d):12.1f}%"
        )
    split.close()


if __name__ == "__main__":
    main()
