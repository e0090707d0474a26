"""Qwen3-TTS engine speed: frames/s, real-time factor and time to first audio (TTFA).

Random-weight GGUF model sets are generated on the fly (nothing is downloaded):

* ``tiny``  - the test-sized model (talker 64 wide, predictor 32 wide + projection),
* ``0.6b``  - 0.6B-shaped: talker 1024 x 28 layers, predictor 1024 x 5 layers,
* ``1.7b``  - 1.7B-shaped: talker 2048 x 28 layers, predictor 1024 x 5 + 2048->1024 projection,

all with the real 151936 x 2048 text embedding, f16 on disk. The codec head's
EOS row is zeroed so that random weights never stop early. Audio goes through
the tiny vocoder fixture unless ``--vocoder-onnx`` names a real one (the tiny
one costs almost nothing, so with it the numbers are talker + predictor only).

Numbers (per run, after one warm-up run):
  frames/s        codec frames per wall second (12.5 frames = 1 s of audio)
  x_realtime      audio seconds / wall seconds (higher is better; >= 1 keeps up)
  rtf             wall / audio (lower is better)
  ttfa_ms         request start -> first chunk out of the StreamingDecoder
  frame1/2_ms     request start -> first / second frame generated (TTFA floor for a
                  1- or 2-frame first chunk, --first-chunk-frames)

Usage:
  python benchmarks/qwen3_speed.py                        # tiny + 0.6b on CPU, 16 frames
  python benchmarks/qwen3_speed.py --config 1.7b --device cuda --dtype bfloat16 --frames 64
  .dev/oracle-venv/bin/python benchmarks/qwen3_speed.py --official-only --config 0.6b
      (the official qwen_tts model, same shapes, random weights, for comparison)
  PYTHONPATH=.:<dir with gguf+structlog> .dev/oracle-venv/bin/python \
      benchmarks/qwen3_speed.py --compare --config tiny --frames 64 --repeat 9
      (ours and official interleaved in one process: same load, ratio of medians)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
if str(ROOT / "tests") not in sys.path:  # the tiny test vocoder (tests/qwen3_vocoder_fixture.py)
    sys.path.insert(1, str(ROOT / "tests"))

EOS_ID = 2150
TEXT_VOCAB = 151936
SPECIAL_TOKENS = {
    151643: "<|endoftext|>",
    151644: "<|im_start|>",
    151645: "<|im_end|>",
    151671: "<tts_pad>",
    151672: "<tts_text_bos>",
    151673: "<tts_text_eod>",
}
ASSISTANT_ID = 77091
PRESETS = ["vivian", "serena", "uncle_fu", "dylan", "eric", "ryan", "aiden", "ono_anna", "sohee"]
LANGUAGES = {"english": 2050, "german": 2053, "chinese": 2055}
DEFAULT_TEXT = (
    "Hello, this is a speed test of the streaming speech engine, with a sentence of a "
    "realistic length for a telephone agent."
)


@dataclass(frozen=True)
class Shape:
    name: str
    size: str  # file-name size
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    text_hidden: int
    cp_hidden: int
    cp_layers: int
    cp_heads: int
    cp_kv_heads: int
    cp_head_dim: int
    cp_ffn: int


SHAPES = {
    "tiny": Shape("tiny", "0.6b", 64, 2, 4, 2, 16, 128, 32, 32, 2, 4, 2, 8, 64),
    "0.6b": Shape("0.6b", "0.6b", 1024, 28, 16, 8, 128, 3072, 2048, 1024, 5, 16, 8, 128, 3072),
    "1.7b": Shape("1.7b", "1.7b", 2048, 28, 16, 8, 128, 6144, 2048, 1024, 5, 16, 8, 128, 3072),
}


# -- random GGUF model set --------------------------------------------------------------------


def _bytes_to_unicode() -> list[str]:
    """GPT-2 byte-level alphabet in vocabulary order (so id 198 is 'Ċ', the newline)."""
    bs = list(range(ord("!"), ord("~") + 1))
    bs += list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


def tokenizer_tables() -> tuple[list[str], list[int], list[str]]:
    """A byte-level BPE table with the real special-token ids and 'assistant' at 77091."""
    tokens = [f"<|unused-{i}|>" for i in range(TEXT_VOCAB)]
    types = [5] * TEXT_VOCAB
    for i, ch in enumerate(_bytes_to_unicode()):
        tokens[i], types[i] = ch, 1
    merges: list[str] = []
    word = "assistant"
    nid = 256
    cur = word[0]
    for ch in word[1:]:
        merges.append(f"{cur} {ch}")
        cur += ch
        tid = ASSISTANT_ID if cur == word else nid
        tokens[tid], types[tid] = cur, 1
        nid += 1
    for tid, tok in SPECIAL_TOKENS.items():
        tokens[tid], types[tid] = tok, 3
    return tokens, types, merges


def write_random_model(
    out_dir: Path, shape: Shape, mode: str = "customvoice", seed: int = 0
) -> Path:
    """Write a bundled ``qwen3-tts-{size}-{mode}-f16.gguf`` with random weights; return it."""
    import gguf

    from engines.qwen3.weights.paths import bundled_file_name

    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / bundled_file_name(mode, shape.size, "f16")
    if path.exists() and path.with_suffix(".done").exists():
        return path
    rng = np.random.default_rng(seed)

    def mat(rows: int, cols: int, std: float = 0.02) -> np.ndarray:
        a = rng.standard_normal((rows, cols), dtype=np.float32)
        a *= std
        return a.astype(np.float16)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    s = shape
    w = gguf.GGUFWriter(str(path), arch="qwen3-tts")
    ns, t, p = "qwen3-tts.", "qwen3-tts.talker.", "qwen3-tts.code_pred."
    w.add_string(
        ns + "tts_model_type",
        {"customvoice": "custom_voice", "voicedesign": "voice_design"}.get(mode, mode),
    )
    w.add_string(ns + "tts_model_size", shape.size)
    w.add_uint32(ns + "num_code_groups", 16)
    for key, val in {
        "embedding_length": s.hidden,
        "block_count": s.layers,
        "attention.head_count": s.heads,
        "attention.head_count_kv": s.kv_heads,
        "attention.key_length": s.head_dim,
        "feed_forward_length": s.ffn,
        "vocab_size": 3072,
        "text_vocab_size": TEXT_VOCAB,
        "text_hidden_size": s.text_hidden,
    }.items():
        w.add_uint32(t + key, val)
    w.add_float32(t + "rope.freq_base", 1_000_000.0)
    w.add_float32(t + "attention.layer_norm_rms_epsilon", 1e-6)
    for key, val in {
        "embedding_length": s.cp_hidden,
        "block_count": s.cp_layers,
        "attention.head_count": s.cp_heads,
        "attention.head_count_kv": s.cp_kv_heads,
        "attention.key_length": s.cp_head_dim,
        "feed_forward_length": s.cp_ffn,
        "vocab_size": 2048,
    }.items():
        w.add_uint32(p + key, val)
    w.add_float32(p + "rope.freq_base", 1_000_000.0)
    w.add_float32(p + "attention.layer_norm_rms_epsilon", 1e-6)
    for lang, lid in LANGUAGES.items():
        w.add_uint32(t + f"codec_language_id.{lang}", lid)
    if mode == "customvoice":
        for i, name in enumerate(PRESETS):
            w.add_uint32(t + f"spk_id.{name}", 3000 + i)
    tokens, types, merges = tokenizer_tables()
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)

    # Text embedding: the 151936 x 2048 table dominates generation time; write it in one go.
    w.add_tensor("talker.text_embd.weight", mat(TEXT_VOCAB, s.text_hidden, 0.5))
    w.add_tensor("talker.text_proj.fc1.weight", mat(s.text_hidden, s.text_hidden))
    w.add_tensor("talker.text_proj.fc1.bias", np.zeros(s.text_hidden, np.float32))
    w.add_tensor("talker.text_proj.fc2.weight", mat(s.hidden, s.text_hidden))
    w.add_tensor("talker.text_proj.fc2.bias", np.zeros(s.hidden, np.float32))
    w.add_tensor("talker.codec_embd.weight", mat(3072, s.hidden, 0.5))
    head = mat(3072, s.hidden)
    head[EOS_ID] = 0.0  # EOS logit 0: never in the top-k of 2048 random logits
    w.add_tensor("talker.codec_head.weight", head)
    w.add_tensor("talker.output_norm.weight", ones(s.hidden))

    def layers(prefix: str, n: int, h: int, nh: int, nkv: int, hd: int, ffn: int) -> None:
        for i in range(n):
            b = f"{prefix}.blk.{i}."
            w.add_tensor(b + "attn_norm.weight", ones(h))
            w.add_tensor(b + "attn_q.weight", mat(nh * hd, h))
            w.add_tensor(b + "attn_k.weight", mat(nkv * hd, h))
            w.add_tensor(b + "attn_v.weight", mat(nkv * hd, h))
            w.add_tensor(b + "attn_output.weight", mat(h, nh * hd))
            w.add_tensor(b + "attn_q_norm.weight", ones(hd))
            w.add_tensor(b + "attn_k_norm.weight", ones(hd))
            w.add_tensor(b + "ffn_norm.weight", ones(h))
            w.add_tensor(b + "ffn_gate.weight", mat(ffn, h))
            w.add_tensor(b + "ffn_up.weight", mat(ffn, h))
            w.add_tensor(b + "ffn_down.weight", mat(h, ffn))

    layers("talker", s.layers, s.hidden, s.heads, s.kv_heads, s.head_dim, s.ffn)
    layers(
        "code_pred", s.cp_layers, s.cp_hidden, s.cp_heads, s.cp_kv_heads, s.cp_head_dim, s.cp_ffn
    )
    for i in range(15):
        w.add_tensor(f"code_pred.codec_embd.{i}.weight", mat(2048, s.hidden, 0.5))
        w.add_tensor(f"code_pred.lm_head.{i}.weight", mat(2048, s.cp_hidden))
    w.add_tensor("code_pred.output_norm.weight", ones(s.cp_hidden))
    if s.cp_hidden != s.hidden:
        w.add_tensor("code_pred.small_to_mtp_projection.weight", mat(s.cp_hidden, s.hidden))
        w.add_tensor("code_pred.small_to_mtp_projection.bias", np.zeros(s.cp_hidden, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    path.with_suffix(".done").write_text("ok\n")
    return path


def _have(mod: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(mod) is not None


class _NoVocoder:
    """Stands in for the StreamingDecoder when ONNX Runtime is absent: counts frames only."""

    def __init__(self, first: int) -> None:
        self.first = first
        self.n = 0

    def push(self, frame: Any) -> np.ndarray | None:
        self.n += 1
        return np.zeros(1, np.float32) if self.n == self.first else None

    def flush(self) -> np.ndarray:
        return np.zeros(0, np.float32)


# -- our engine -------------------------------------------------------------------------------


@dataclass
class Run:
    frames: int
    wall_ms: float
    ttfa_ms: float
    frame1_ms: float  # first frame ready (lower bound of TTFA with a 1-frame first chunk)
    frame2_ms: float
    prefill_ms: float
    talker_ms: float
    code_predictor_ms: float
    vocoder_ms: float

    @property
    def audio_s(self) -> float:
        return self.frames / 12.5

    @property
    def frames_per_s(self) -> float:
        return self.frames / (self.wall_ms / 1e3) if self.wall_ms else 0.0

    @property
    def x_realtime(self) -> float:
        return self.audio_s / (self.wall_ms / 1e3) if self.wall_ms else 0.0


def run_engine(
    shape: Shape,
    *,
    work: Path,
    device: str,
    dtype: str,
    frames: int,
    repeat: int,
    text: str,
    chunk_frames: int,
    first_chunk_frames: int | None,
    vocoder_onnx: Path | None,
    mode: str,
) -> dict[str, Any]:
    import torch

    from engines.qwen3.modes import PresetSpeaker, QtsMode
    from engines.qwen3.serving.frame_generator import FrameGenerator
    from engines.qwen3.serving.request import ModeSynthesizeRequest
    from engines.qwen3.weights.paths import VOCODER_FILE, ModeModelPaths

    torch.set_flush_denormal(True)
    mdir = work / shape.name
    t0 = time.perf_counter()
    gguf_path = write_random_model(mdir, shape, mode)
    gen_s = time.perf_counter() - t0
    voc_path = vocoder_onnx
    if voc_path is None and _have("onnx") and _have("onnxruntime"):
        from qwen3_vocoder_fixture import export_tiny_vocoder

        voc_path = export_tiny_vocoder(mdir / VOCODER_FILE)
    paths = ModeModelPaths.from_files(gguf_path, vocoder_onnx=voc_path or mdir / VOCODER_FILE)
    t1 = time.perf_counter()
    qmode = QtsMode.parse(mode)
    engine = FrameGenerator.load_mode(paths, qmode, device=device, dtype=dtype)
    load_s = time.perf_counter() - t1
    vocoder = None
    if voc_path is not None:
        from engines.qwen3.serving.vocoder import Vocoder

        vocoder = Vocoder(voc_path, device=device)
    else:
        print("  (onnx/onnxruntime missing: no vocoder; TTFA = first chunk's frames ready)")
    speaker = PresetSpeaker.Vivian if qmode is QtsMode.CustomVoice else None
    runs: list[Run] = []
    for r in range(repeat + 1):  # run 0 is warm-up
        req = ModeSynthesizeRequest(
            text=text, mode=qmode, speaker=speaker, max_frames=frames, seed=r, language="english"
        )
        dec = (
            vocoder.streaming(chunk_frames=chunk_frames, first_chunk_frames=first_chunk_frames)
            if vocoder is not None
            else _NoVocoder(first_chunk_frames or chunk_frames)
        )
        n = 0
        voc_ms = 0.0
        ttfa = -1.0
        ready: list[float] = []
        start = time.perf_counter()
        for frame in engine.iter_frames(req):
            n += 1
            if n <= 2:
                ready.append((time.perf_counter() - start) * 1e3)
            tv = time.perf_counter()
            out = dec.push(frame)
            voc_ms += (time.perf_counter() - tv) * 1e3
            if out is not None and ttfa < 0:
                ttfa = (time.perf_counter() - start) * 1e3
        tv = time.perf_counter()
        rest = dec.flush()
        voc_ms += (time.perf_counter() - tv) * 1e3
        if rest.size and ttfa < 0:
            ttfa = (time.perf_counter() - start) * 1e3
        wall = (time.perf_counter() - start) * 1e3
        tm = dict(engine.timings)
        run = Run(
            frames=n,
            wall_ms=wall,
            ttfa_ms=ttfa,
            frame1_ms=ready[0] if ready else -1.0,
            frame2_ms=ready[1] if len(ready) > 1 else -1.0,
            prefill_ms=float(tm.get("prefill", 0.0)),
            talker_ms=float(tm.get("talker", 0.0)),
            code_predictor_ms=float(tm.get("code_predictor", 0.0)),
            vocoder_ms=voc_ms,
        )
        tag = "warm-up" if r == 0 else f"run {r}"
        print(
            f"  {tag:8s} frames={n:4d} wall={wall:8.1f}ms frames/s={run.frames_per_s:7.2f} "
            f"x_rt={run.x_realtime:6.2f} ttfa={ttfa:7.1f}ms prefill={run.prefill_ms:6.1f} "
            f"talker={run.talker_ms:7.1f} cp={run.code_predictor_ms:7.1f} voc={voc_ms:6.1f}",
            flush=True,
        )
        if r > 0:
            runs.append(run)
    med = {
        "frames_per_s": statistics.median(r.frames_per_s for r in runs),
        "x_realtime": statistics.median(r.x_realtime for r in runs),
        "rtf": statistics.median(1 / r.x_realtime for r in runs if r.x_realtime),
        "ttfa_ms": statistics.median(r.ttfa_ms for r in runs),
        "frame1_ms": statistics.median(r.frame1_ms for r in runs),
        "frame2_ms": statistics.median(r.frame2_ms for r in runs),
        "talker_ms_per_frame": statistics.median(r.talker_ms / max(r.frames, 1) for r in runs),
        "cp_ms_per_frame": statistics.median(r.code_predictor_ms / max(r.frames, 1) for r in runs),
        "prefill_ms": statistics.median(r.prefill_ms for r in runs),
    }
    return {
        "engine": "ttsdock",
        "config": shape.name,
        "device": device,
        "dtype": dtype,
        "mode": mode,
        "gguf_write_s": round(gen_s, 2),
        "load_s": round(load_s, 2),
        "frames_requested": frames,
        "runs": [asdict(r) for r in runs],
        "median": {k: round(v, 3) for k, v in med.items()},
    }


# -- official qwen_tts (optional) -------------------------------------------------------------


def _stub_torchaudio() -> None:
    import importlib.machinery
    import types

    names = ["torchaudio", "torchaudio.compliance", "torchaudio.compliance.kaldi"]
    mods = {n: types.ModuleType(n) for n in names}
    mods["torchaudio"].__path__ = []
    mods["torchaudio.compliance"].__path__ = []
    mods["torchaudio"].compliance = mods["torchaudio.compliance"]  # type: ignore[attr-defined]
    mods["torchaudio.compliance"].kaldi = mods["torchaudio.compliance.kaldi"]  # type: ignore[attr-defined]
    for n, m in mods.items():
        m.__spec__ = importlib.machinery.ModuleSpec(n, None, is_package=hasattr(m, "__path__"))
        sys.modules.setdefault(n, m)


def official_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("qwen_tts") is not None


def build_official(shape: Shape, *, device: str, dtype: str) -> tuple[Any, float]:
    """The official model with random weights: ``(once(frames) -> (n, wall_ms), build_s)``."""
    try:
        import torchaudio  # noqa: F401
    except Exception:
        _stub_torchaudio()
    import torch
    from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSConfig
    from qwen_tts.core.models.modeling_qwen3_tts import Qwen3TTSForConditionalGeneration

    torch.set_flush_denormal(True)
    torch.manual_seed(0)
    s = shape
    half = s.head_dim // 2
    sec = [half - 2 * (half * 5 // 16), half * 5 // 16, half * 5 // 16]  # 128 -> [24,20,20]
    cfg = Qwen3TTSConfig(
        tts_model_type="custom_voice",
        tts_model_size="0b6" if s.size == "0.6b" else "1b7",
        tokenizer_type="qwen3_tts_tokenizer_12hz",
        im_start_token_id=151644,
        im_end_token_id=151645,
        tts_pad_token_id=151671,
        tts_bos_token_id=151672,
        tts_eos_token_id=151673,
        talker_config=dict(
            vocab_size=3072,
            hidden_size=s.hidden,
            intermediate_size=s.ffn,
            num_hidden_layers=s.layers,
            num_attention_heads=s.heads,
            num_key_value_heads=s.kv_heads,
            head_dim=s.head_dim,
            rms_norm_eps=1e-6,
            rope_theta=1000000,
            max_position_embeddings=32768,
            rope_scaling={
                "rope_type": "default",
                "type": "default",
                "interleaved": True,
                "mrope_section": sec,
            },
            num_code_groups=16,
            text_hidden_size=s.text_hidden,
            text_vocab_size=TEXT_VOCAB,
            codec_eos_token_id=EOS_ID,
            codec_think_id=2154,
            codec_nothink_id=2155,
            codec_think_bos_id=2156,
            codec_think_eos_id=2157,
            codec_pad_id=2148,
            codec_bos_id=2149,
            codec_language_id=dict(LANGUAGES),
            spk_id={"vivian": 3000},
            spk_is_dialect={"vivian": False},
            code_predictor_config=dict(
                vocab_size=2048,
                hidden_size=s.cp_hidden,
                intermediate_size=s.cp_ffn,
                num_hidden_layers=s.cp_layers,
                num_attention_heads=s.cp_heads,
                num_key_value_heads=s.cp_kv_heads,
                head_dim=s.cp_head_dim,
                rope_theta=1000000,
                num_code_groups=16,
                rms_norm_eps=1e-6,
            ),
        ),
    )
    t0 = time.perf_counter()
    tdtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
    model = Qwen3TTSForConditionalGeneration(cfg).eval().to(device=device, dtype=tdtype)
    with torch.no_grad():
        model.talker.codec_head.weight[EOS_ID].zero_()
    build_s = time.perf_counter() - t0
    text_ids = [9707 % 256 + 32 for _ in range(40)]
    ids = torch.tensor(
        [[151644, ASSISTANT_ID, 198, *text_ids, 151645, 198, 151644, ASSISTANT_ID, 198]]
    )
    ids = ids.to(device)

    def once(frames: int) -> tuple[int, float]:
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.no_grad():
            codes, _ = model.generate(
                input_ids=[ids],
                languages=["english"],
                speakers=["vivian"],
                non_streaming_mode=False,
                max_new_tokens=frames,
                do_sample=True,
                top_k=50,
                top_p=1.0,
                temperature=0.9,
                subtalker_dosample=True,
                subtalker_top_k=50,
                subtalker_top_p=1.0,
                subtalker_temperature=0.9,
                repetition_penalty=1.05,
            )
        if device == "cuda":
            torch.cuda.synchronize()
        return int(codes[0].shape[0]), (time.perf_counter() - start) * 1e3

    return once, build_s


def run_official(
    shape: Shape, *, device: str, dtype: str, frames: int, repeat: int
) -> dict[str, Any]:
    """The official ``Qwen3TTSForConditionalGeneration.generate`` on the same shapes."""
    once, build_s = build_official(shape, device=device, dtype=dtype)
    out: list[dict[str, float]] = []
    for r in range(repeat + 1):
        n, wall = once(frames)
        fps = n / (wall / 1e3)
        tag = "warm-up" if r == 0 else f"run {r}"
        print(
            f"  {tag:8s} frames={n:4d} wall={wall:8.1f}ms frames/s={fps:7.2f} "
            f"x_rt={fps / 12.5:6.2f}"
        )
        if r > 0:
            out.append({"frames": n, "wall_ms": wall, "frames_per_s": fps})
    return {
        "engine": "official qwen_tts",
        "config": shape.name,
        "device": device,
        "dtype": dtype,
        "build_s": round(build_s, 2),
        "runs": out,
        "median": {
            "frames_per_s": round(statistics.median(o["frames_per_s"] for o in out), 3),
            "x_realtime": round(statistics.median(o["frames_per_s"] for o in out) / 12.5, 3),
        },
    }


def run_compare(
    shape: Shape, *, work: Path, device: str, dtype: str, frames: int, repeat: int, text: str
) -> dict[str, Any]:
    """Ours (codes only, no vocoder) and the official model, runs interleaved in one process.

    Both see the same load; the ratio of the medians is the number to quote.
    """
    import torch

    from engines.qwen3.modes import PresetSpeaker, QtsMode
    from engines.qwen3.serving.frame_generator import FrameGenerator
    from engines.qwen3.serving.request import ModeSynthesizeRequest
    from engines.qwen3.weights.paths import VOCODER_FILE, ModeModelPaths

    threads = torch.get_num_threads()
    gguf_path = write_random_model(work / shape.name, shape)
    paths = ModeModelPaths.from_files(gguf_path, vocoder_onnx=work / shape.name / VOCODER_FILE)
    engine = FrameGenerator.load_mode(paths, QtsMode.CustomVoice, device=device, dtype=dtype)
    ours_threads = torch.get_num_threads()
    torch.set_num_threads(threads)  # the official model keeps the process default
    official, _ = build_official(shape, device=device, dtype=dtype)
    ours_fps: list[float] = []
    off_fps: list[float] = []
    for r in range(repeat + 1):
        req = ModeSynthesizeRequest(
            text=text,
            speaker=PresetSpeaker.Vivian,
            max_frames=frames,
            seed=r,
            language="english",
        )
        torch.set_num_threads(ours_threads)
        t0 = time.perf_counter()
        codes, _ = engine.generate_codes(req)
        wall = time.perf_counter() - t0
        torch.set_num_threads(threads)
        n_off, wall_off = official(frames)
        if r == 0:
            continue  # warm-up pair
        ours_fps.append(codes.shape[0] / wall)
        off_fps.append(n_off / (wall_off / 1e3))
        print(
            f"  pair {r}: ours {ours_fps[-1]:8.2f} frames/s ({ours_threads} thr)   "
            f"official {off_fps[-1]:7.2f} frames/s ({threads} thr)   "
            f"ratio {ours_fps[-1] / off_fps[-1]:6.2f}",
            flush=True,
        )
    ours_m, off_m = statistics.median(ours_fps), statistics.median(off_fps)
    pair_ratios = [a / b for a, b in zip(ours_fps, off_fps, strict=True)]
    return {
        "engine": "compare",
        "config": shape.name,
        "device": device,
        "dtype": dtype,
        "ours_threads": ours_threads,
        "official_threads": threads,
        "ours_fps": ours_fps,
        "official_fps": off_fps,
        "median": {
            "frames_per_s": round(ours_m, 3),
            "official_frames_per_s": round(off_m, 3),
            "ratio": round(ours_m / off_m, 3),
            "ratio_of_pairs": round(statistics.median(pair_ratios), 3),
            "x_realtime": round(ours_m / 12.5, 3),
        },
    }


# -- main -------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--config", default="tiny,0.6b", help="comma list of tiny, 0.6b, 1.7b, all")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default="float32")
    ap.add_argument("--frames", type=int, default=16, help="frames per run (12.5 = 1 s audio)")
    ap.add_argument("--repeat", type=int, default=2, help="timed runs after the warm-up run")
    ap.add_argument("--mode", default="customvoice", choices=["base", "customvoice", "voicedesign"])
    ap.add_argument("--text", default=DEFAULT_TEXT)
    ap.add_argument("--chunk-frames", type=int, default=4)
    ap.add_argument("--first-chunk-frames", type=int, default=None)
    ap.add_argument("--vocoder-onnx", type=Path, help="a real vocoder ONNX (default: tiny fixture)")
    ap.add_argument("--work-dir", type=Path, help="where the random GGUFs go (kept; reused)")
    ap.add_argument("--threads", type=int, help="torch CPU threads")
    ap.add_argument("--official", action="store_true", help="also run the official qwen_tts model")
    ap.add_argument("--official-only", action="store_true", help="only the official model")
    ap.add_argument(
        "--compare",
        action="store_true",
        help="ours (codes only) and official, interleaved pairs in one process (oracle venv)",
    )
    ap.add_argument("--json", type=Path, help="also write the results as JSON")
    a = ap.parse_args(argv)
    names = list(SHAPES) if a.config == "all" else [c.strip() for c in a.config.split(",")]
    for n in names:
        if n not in SHAPES:
            ap.error(f"unknown config {n!r}; expected tiny, 0.6b, 1.7b or all")
    if a.threads:
        import torch

        torch.set_num_threads(a.threads)
    results: list[dict[str, Any]] = []
    tmp = None
    work = a.work_dir
    if work is None:
        tmp = tempfile.TemporaryDirectory(prefix="qwen3bench-")
        work = Path(tmp.name)
    try:
        for n in names:
            shape = SHAPES[n]
            if a.compare:
                if not official_available():
                    ap.error("--compare needs the official qwen_tts package (oracle venv)")
                print(f"== ours vs official qwen_tts, interleaved, {n}, {a.device}, {a.dtype}")
                results.append(
                    run_compare(
                        shape,
                        work=work,
                        device=a.device,
                        dtype=a.dtype,
                        frames=a.frames,
                        repeat=a.repeat,
                        text=a.text,
                    )
                )
                print("  median:", json.dumps(results[-1]["median"]), flush=True)
                continue
            if not a.official_only:
                print(f"== ttsdock qwen3 engine, {n}, {a.device}, {a.dtype}, {a.frames} frames")
                results.append(
                    run_engine(
                        shape,
                        work=work,
                        device=a.device,
                        dtype=a.dtype,
                        frames=a.frames,
                        repeat=a.repeat,
                        text=a.text,
                        chunk_frames=a.chunk_frames,
                        first_chunk_frames=a.first_chunk_frames,
                        vocoder_onnx=a.vocoder_onnx,
                        mode=a.mode,
                    )
                )
                print("  median:", json.dumps(results[-1]["median"]), flush=True)
            if a.official or a.official_only:
                if not official_available():
                    print("== official qwen_tts not importable here; skipped")
                    continue
                print(f"== official qwen_tts, {n}, {a.device}, {a.dtype}, {a.frames} frames")
                results.append(
                    run_official(
                        shape, device=a.device, dtype=a.dtype, frames=a.frames, repeat=a.repeat
                    )
                )
                print("  median:", json.dumps(results[-1]["median"]), flush=True)
    finally:
        if tmp is not None:
            tmp.cleanup()
    print("== summary")
    for r in results:
        m = r["median"]
        if r["engine"] == "compare":
            print(
                f"  ours vs official   {r['config']:5s} {r['device']:4s} {r['dtype']:8s} "
                f"ours={m['frames_per_s']:.2f} official={m['official_frames_per_s']:.2f} "
                f"frames/s  ratio={m['ratio']:.2f} (median of pair ratios "
                f"{m['ratio_of_pairs']:.2f})"
            )
            continue
        extra = (
            f" ttfa={m['ttfa_ms']:.0f}ms (frame1 {m['frame1_ms']:.0f}ms, frame2 "
            f"{m['frame2_ms']:.0f}ms) rtf={m['rtf']:.3f}"
            if "ttfa_ms" in m
            else ""
        )
        print(
            f"  {r['engine']:18s} {r['config']:5s} {r['device']:4s} {r['dtype']:8s} "
            f"frames/s={m['frames_per_s']:.2f} x_realtime={m['x_realtime']:.2f}{extra}"
        )
    if a.json:
        a.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
