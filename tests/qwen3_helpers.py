"""Tiny Qwen3-TTS fixtures: deterministic weights, official-format checkpoints, tiny tokenizer.

Everything here is generated, nothing is downloaded. Weights come from a
counter-based hash (splitmix64), so the official reference code (in the
oracle venv, ``tests/qwen3_oracle_gen.py``) and our tests build bit-identical
checkpoints from a ``config.json`` alone; the golden directory stores only
configs, tokenizer files and expected outputs.

The tiny tokenizer is a byte-level BPE whose special tokens carry the real
Qwen2 ids (``<|im_start|>`` 151644, ``<tts_pad>`` 151671, ...), with
``assistant`` = 77091 and ``user`` = 872 built through merges, and the GPT-2
byte order for ids 0-255 (so ``Ċ`` = ``\\n`` is 198).

This module imports only numpy at import time (the oracle venv imports it too).
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden" / "qwen3"

SPECIAL_TOKENS = {
    151643: "<|endoftext|>",
    151644: "<|im_start|>",
    151645: "<|im_end|>",
    151671: "<tts_pad>",
    151672: "<tts_text_bos>",
    151673: "<tts_text_eod>",
}
FIXED_WORD_IDS = {"assistant": 77091, "user": 872}
#: Words (byte-level spelling) that get merges, in rank order after the fixed ones.
WORDS = [
    "Hello",
    "Ġworld",
    "Ġthe",
    "Ġquick",
    "Ġbrown",
    "Ġfox",
    "Ġspeak",
    "Ġwarmly",
    "Ġslowly",
    "Ġvoice",
    "Ġcalm",
    "Ġdeep",
    "Ġis",
    "Ġa",
    "Ġtest",
    "Ġof",
    "Ġspeech",
    "Ġreference",
    "Ġtext",
    "Ġtoday",
    "Ġhello",
    "Ġhow",
    "Ġare",
    "Ġyou",
    "Ġand",
    "ing",
    "er",
    "The",
    "ĠHallo",
    "ĠWelt",
]


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (the Qwen2 byte alphabet)."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs), strict=True))


def byte_vocab() -> dict[str, int]:
    """Ids 0-255 in GPT-2 order: the printable bytes first, then the rest (``Ċ`` = 198)."""
    m = bytes_to_unicode()
    order = sorted(m, key=lambda b: (b not in _printable(), _printable_index(b)))
    return {m[b]: i for i, b in enumerate(order)}


def _printable() -> set[int]:
    return (
        set(range(ord("!"), ord("~") + 1))
        | set(range(ord("¡"), ord("¬") + 1))
        | set(range(ord("®"), ord("ÿ") + 1))
    )


def _printable_index(b: int) -> int:
    return b


def tiny_vocab_and_merges() -> tuple[dict[str, int], list[str]]:
    vocab = byte_vocab()
    merges: list[str] = []
    next_id = 300

    def add_word(word: str, final_id: int | None) -> None:
        nonlocal next_id
        cur = word[0]
        for ch in word[1:]:
            merged = cur + ch
            rule = f"{cur} {ch}"
            if rule not in merges:
                merges.append(rule)
            if merged not in vocab:
                if merged == word and final_id is not None:
                    vocab[merged] = final_id
                else:
                    while next_id in vocab.values() or next_id in FIXED_WORD_IDS.values():
                        next_id += 1
                    vocab[merged] = next_id
                    next_id += 1
            cur = merged

    for word, wid in FIXED_WORD_IDS.items():
        add_word(word, wid)
    for word in WORDS:
        add_word(word, None)
    return vocab, merges


def write_tiny_tokenizer(out_dir: Path) -> None:
    """``vocab.json``, ``merges.txt`` and ``tokenizer_config.json`` (Qwen2 style)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    vocab, merges = tiny_vocab_and_merges()
    # The special tokens sit in vocab.json too: with sparse ids, both the Hugging Face
    # slow->fast conversion and ``tokenizers`` otherwise number added tokens after the
    # vocabulary instead of using their ids.
    vocab.update({tok: i for i, tok in SPECIAL_TOKENS.items()})
    (out_dir / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (out_dir / "merges.txt").write_text(
        "#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8"
    )
    added = {
        str(i): {
            "content": tok,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for i, tok in SPECIAL_TOKENS.items()
    }
    cfg = {
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "model_max_length": 32768,
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1), encoding="utf-8")


# -- deterministic weights --------------------------------------------------------------------

_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def hash_uniform(name: str, shape: tuple[int, ...] | list[int]) -> np.ndarray:
    """Deterministic float32 values in [-1, 1) (multiples of 2^-23) for tensor ``name``."""
    n = int(np.prod(shape)) if len(shape) else 1
    key = np.uint64(zlib.crc32(name.encode("utf-8")))
    with np.errstate(over="ignore"):
        x = np.arange(n, dtype=np.uint64) + key * np.uint64(0x9E3779B97F4A7C15)
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    k = (z >> np.uint64(40)).astype(np.int64)  # 24 bits
    v = (k.astype(np.float64) / float(1 << 23)) - 1.0
    return v.astype(np.float32).reshape(tuple(shape))


def tensor_value(name: str, shape: tuple[int, ...] | list[int]) -> np.ndarray:
    """The value of one checkpoint tensor: norms near 1, small biases, unit-ish linears."""
    u = hash_uniform(name, shape)
    if len(shape) == 1:
        if "norm" in name:
            return (1.0 + 0.25 * u.astype(np.float64)).astype(np.float32)
        return (0.1 * u.astype(np.float64)).astype(np.float32)
    if "embedding" in name:
        return u
    fan_in = shape[-1]
    scale = np.sqrt(3.0 / fan_in)
    if "codec_head" in name or "lm_head" in name:
        scale *= 2.0
    return (u.astype(np.float64) * scale).astype(np.float32)


def hf_tensor_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the talker/predictor tensors of an official checkpoint."""
    tc = config["talker_config"]
    cp = tc["code_predictor_config"]
    h, th = tc["hidden_size"], tc["text_hidden_size"]
    out: dict[str, tuple[int, ...]] = {
        "talker.model.codec_embedding.weight": (tc["vocab_size"], h),
        "talker.model.text_embedding.weight": (tc["text_vocab_size"], th),
        "talker.text_projection.linear_fc1.weight": (th, th),
        "talker.text_projection.linear_fc1.bias": (th,),
        "talker.text_projection.linear_fc2.weight": (h, th),
        "talker.text_projection.linear_fc2.bias": (h,),
        "talker.codec_head.weight": (tc["vocab_size"], h),
        "talker.model.norm.weight": (h,),
    }

    def layers(prefix: str, c: dict[str, Any]) -> None:
        w, hd = c["hidden_size"], c["head_dim"]
        nh, nkv, ffn = c["num_attention_heads"], c["num_key_value_heads"], c["intermediate_size"]
        for i in range(c["num_hidden_layers"]):
            p = f"{prefix}.layers.{i}."
            out[p + "input_layernorm.weight"] = (w,)
            out[p + "self_attn.q_proj.weight"] = (nh * hd, w)
            out[p + "self_attn.k_proj.weight"] = (nkv * hd, w)
            out[p + "self_attn.v_proj.weight"] = (nkv * hd, w)
            out[p + "self_attn.o_proj.weight"] = (w, nh * hd)
            out[p + "self_attn.q_norm.weight"] = (hd,)
            out[p + "self_attn.k_norm.weight"] = (hd,)
            out[p + "post_attention_layernorm.weight"] = (w,)
            out[p + "mlp.gate_proj.weight"] = (ffn, w)
            out[p + "mlp.up_proj.weight"] = (ffn, w)
            out[p + "mlp.down_proj.weight"] = (w, ffn)

    layers("talker.model", tc)
    layers("talker.code_predictor.model", cp)
    hc = cp["hidden_size"]
    out["talker.code_predictor.model.norm.weight"] = (hc,)
    for g in range(tc["num_code_groups"] - 1):
        out[f"talker.code_predictor.model.codec_embedding.{g}.weight"] = (cp["vocab_size"], h)
        out[f"talker.code_predictor.lm_head.{g}.weight"] = (cp["vocab_size"], hc)
    if hc != h:
        out["talker.code_predictor.small_to_mtp_projection.weight"] = (hc, h)
        out["talker.code_predictor.small_to_mtp_projection.bias"] = (hc,)
    return out


def state_dict_arrays(config: dict[str, Any]) -> dict[str, np.ndarray]:
    return {n: tensor_value(n, s) for n, s in hf_tensor_shapes(config).items()}


CODEC_LANGUAGES = {
    "english": 2050,
    "german": 2053,
    "chinese": 2055,
    "japanese": 2058,
    "sichuan_dialect": 2062,
    "beijing_dialect": 2074,
}


def tiny_config(
    kind: str,
    *,
    size: str = "1b7",
    hidden: int = 64,
    cp_hidden: int = 32,
    layers: int = 2,
    text_hidden: int = 32,
) -> dict[str, Any]:
    """An official-format ``config.json`` dict for a tiny model of ``kind``."""
    speakers: dict[str, Any] = {}
    dialects: dict[str, Any] = {}
    if kind == "custom_voice":
        speakers = {"ryan": 3061, "eric": 2875, "vivian": 3065, "dylan": 2878}
        dialects = {
            "ryan": False,
            "eric": "sichuan_dialect",
            "vivian": False,
            "dylan": "beijing_dialect",
        }
    head_dim = 16
    cfg: dict[str, Any] = {
        "model_type": "qwen3_tts",
        "tts_model_type": kind,
        "tts_model_size": size,
        "tokenizer_type": "qwen3_tts_tokenizer_12hz",
        "im_start_token_id": 151644,
        "im_end_token_id": 151645,
        "tts_pad_token_id": 151671,
        "tts_bos_token_id": 151672,
        "tts_eos_token_id": 151673,
        "talker_config": {
            "vocab_size": 3072,
            "hidden_size": hidden,
            "intermediate_size": 2 * hidden,
            "num_hidden_layers": layers,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": head_dim,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1000000,
            "max_position_embeddings": 4096,
            "rope_scaling": {
                "rope_type": "default",
                "type": "default",
                "interleaved": True,
                "mrope_section": [3, 3, 2],
            },
            "num_code_groups": 16,
            "text_hidden_size": text_hidden,
            "text_vocab_size": 151936,
            "codec_eos_token_id": 2150,
            "codec_think_id": 2154,
            "codec_nothink_id": 2155,
            "codec_think_bos_id": 2156,
            "codec_think_eos_id": 2157,
            "codec_pad_id": 2148,
            "codec_bos_id": 2149,
            "codec_language_id": dict(CODEC_LANGUAGES),
            "spk_id": speakers,
            "spk_is_dialect": dialects,
            "code_predictor_config": {
                "vocab_size": 2048,
                "hidden_size": cp_hidden,
                "intermediate_size": 2 * cp_hidden,
                "num_hidden_layers": layers,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "head_dim": 8,
                "rope_theta": 1000000,
                "num_code_groups": 16,
                "rms_norm_eps": 1e-6,
                "max_position_embeddings": 65536,
            },
        },
    }
    if kind == "base":
        cfg["speaker_encoder_config"] = {"enc_dim": hidden, "sample_rate": 24000}
    return cfg


def write_checkpoint(
    out_dir: Path,
    config: dict[str, Any],
    *,
    dtype: str = "float32",
    extra: dict[str, np.ndarray] | None = None,
) -> Path:
    """An official-style checkpoint dir: config.json, model.safetensors, tokenizer files."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    arrays = state_dict_arrays(config)
    if extra:
        arrays.update(extra)
    if dtype == "float32":
        from safetensors.numpy import save_file

        save_file(arrays, str(out_dir / "model.safetensors"))
    else:
        import torch
        from safetensors.torch import save_file as save_pt

        tdt = {"bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
        save_pt(
            {k: torch.from_numpy(v).to(tdt) for k, v in arrays.items()},
            str(out_dir / "model.safetensors"),
        )
    write_tiny_tokenizer(out_dir)
    return out_dir


def xvector(width: int, name: str = "xvector") -> np.ndarray:
    return hash_uniform(name, (width,))


def ref_codes(n_frames: int, name: str = "ref_code") -> np.ndarray:
    u = hash_uniform(name, (n_frames, 16)).astype(np.float64)
    return np.clip(((u + 1.0) * 1024.0).astype(np.int64), 0, 2047)


def convert_checkpoint(hf_dir: Path, out_dir: Path, *, dtype: str = "f32", bundled: bool = False):
    """Run our converter; returns ``ModeModelPaths`` of the result (vocoder path unused)."""
    from engines.qwen3.conversion.gguf_convert import convert
    from engines.qwen3.weights.paths import ModeModelPaths

    files = convert(hf_dir, out_dir, dtype=dtype, bundled=bundled)
    return ModeModelPaths(
        talker_gguf=files.talker,
        code_predictor_gguf=files.code_predictor,
        tokenizer_gguf=files.tokenizer,
        vocoder_onnx=out_dir / "qwen3-tts-vocoder.onnx",
    )


def load_golden_cases() -> dict[str, Any]:
    return json.loads((GOLDEN / "cases.json").read_text(encoding="utf-8"))


def write_gguf(
    path: Path,
    kv: dict[str, Any] | None = None,
    tensors: dict[str, Any] | None = None,
) -> Path:
    """A hand-made GGUF: ``kv`` values typed by Python type (int -> u32, float -> f32,
    bool, str, list[str]); ``tensors`` map a name to a float32 array (torch order) or to
    ``(raw_bytes_or_array, GGMLQuantizationType)``."""
    import gguf

    w = gguf.GGUFWriter(str(path), arch="qwen3-tts")
    for key, v in (kv or {}).items():
        if isinstance(v, bool):
            w.add_bool(key, v)
        elif isinstance(v, int):
            w.add_uint32(key, v)
        elif isinstance(v, float):
            w.add_float32(key, v)
        elif isinstance(v, str):
            w.add_string(key, v)
        else:
            w.add_array(key, v)
    for name, t in (tensors or {}).items():
        if isinstance(t, tuple):
            data, qtype = t
            w.add_tensor(name, data, raw_dtype=qtype)
        else:
            w.add_tensor(name, np.asarray(t, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def build_tiny_engine(
    root: Path,
    kind: str = "custom_voice",
    *,
    dtype: str = "f32",
    bundled: bool = False,
    config_overrides: dict[str, Any] | None = None,
    **cfg_kw: Any,
):
    """Checkpoint -> our converter -> ``FrameGenerator`` (small text width for speed)."""
    from engines.qwen3.serving.frame_generator import FrameGenerator

    cfg_kw.setdefault("text_hidden", 8)
    cfg = tiny_config(kind, **cfg_kw)
    if config_overrides:
        for k, v in config_overrides.items():
            cfg["talker_config"][k] = v
    hf = write_checkpoint(root / f"{kind}-hf", cfg)
    paths = convert_checkpoint(hf, root / f"{kind}-gguf", dtype=dtype, bundled=bundled)
    mode = {"custom_voice": "customvoice", "voice_design": "voicedesign", "base": "base"}[kind]
    return FrameGenerator.load_mode(paths, mode), paths, cfg
