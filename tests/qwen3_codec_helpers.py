"""Tiny official-layout 12 Hz codec (``speech_tokenizer/``) and speaker encoder for tests.

Weights are re-derived from the configs by name (``qwen3_helpers.hash_uniform``),
so the golden files store only configs, inputs and the official outputs; the
oracle (tests/qwen3_codec_oracle_gen.py) loads the same values into the
official classes. The tiny decoder keeps the real frame rate (upsample rates
8*5*4*3 and 2*2 = 1920 samples per frame), codebook size 2048 and the real
72-frame attention window, with narrow widths.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import qwen3_helpers as qh

GOLDEN_CODEC = qh.GOLDEN / "codec"

TINY_DECODER: dict[str, Any] = {
    "codebook_size": 2048,
    "codebook_dim": 16,
    "hidden_size": 16,
    "latent_dim": 16,
    "max_position_embeddings": 8000,
    "rope_theta": 10000,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "attention_bias": False,
    "sliding_window": 72,
    "intermediate_size": 32,
    "hidden_act": "silu",
    "layer_scale_initial_scale": 0.01,
    "rms_norm_eps": 1e-5,
    "num_hidden_layers": 2,
    "num_quantizers": 16,
    "upsample_rates": [8, 5, 4, 3],
    "upsampling_ratios": [2, 2],
    "decoder_dim": 32,
    "attention_dropout": 0.0,
}

TINY_ENCODER: dict[str, Any] = {  # a MimiConfig
    "model_type": "mimi",
    "sampling_rate": 24000,
    "frame_rate": 12.5,
    "audio_channels": 1,
    "hidden_size": 16,
    "num_filters": 4,
    "num_residual_layers": 1,
    "upsampling_ratios": [8, 6, 5, 4],
    "kernel_size": 7,
    "last_kernel_size": 3,
    "residual_kernel_size": 3,
    "dilation_growth_rate": 2,
    "use_causal_conv": True,
    "pad_mode": "constant",
    "compress": 2,
    "trim_right_ratio": 1.0,
    "codebook_size": 2048,
    "codebook_dim": 8,
    "num_quantizers": 16,
    "use_conv_shortcut": False,
    "vector_quantization_hidden_dimension": 8,
    "num_semantic_quantizers": 1,
    "upsample_groups": 16,
    "num_hidden_layers": 2,
    "intermediate_size": 32,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "hidden_act": "gelu",
    "max_position_embeddings": 8000,
    "norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "sliding_window": 250,
    "layer_scale_initial_scale": 0.01,
    "attention_bias": False,
}

TINY_SPEAKER: dict[str, Any] = {
    "mel_dim": 128,
    "enc_channels": [16, 16, 16, 16, 48],
    "enc_kernel_sizes": [5, 3, 3, 3, 1],
    "enc_dilations": [1, 2, 3, 4, 1],
    "enc_attention_channels": 8,
    "enc_res2net_scale": 4,
    "enc_se_channels": 8,
    "sample_rate": 24000,
}


def codec_config(decoder: dict[str, Any] | None = None) -> dict[str, Any]:
    """``speech_tokenizer/config.json``."""
    return {
        "model_type": "qwen3_tts_tokenizer_12hz",
        "encoder_config": dict(TINY_ENCODER),
        "decoder_config": dict(decoder or TINY_DECODER),
        "encoder_valid_num_quantizers": 16,
        "input_sample_rate": 24000,
        "output_sample_rate": 24000,
        "decode_upsample_rate": 1920,
        "encode_downsample_rate": 1920,
    }


def codec_value(name: str, shape: tuple[int, ...]) -> np.ndarray:
    """Deterministic, numerically tame values for one codec/speaker-encoder tensor."""
    u = qh.hash_uniform(name, shape).astype(np.float64)
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "embedding_sum":
        v = u
    elif leaf == "cluster_usage":
        v = 1.5 + 0.5 * u
    elif leaf in ("alpha", "beta"):
        v = 0.1 * u
    elif leaf in ("gamma", "scale"):
        v = 0.5 + 0.25 * u
    elif len(shape) == 1:
        v = 1.0 + 0.25 * u if "norm" in name else 0.1 * u
    else:
        fan_in = math.prod(shape[1:])
        if len(shape) == 3:  # transposed convs are [in, out, k]: use the larger fan
            fan_in = max(fan_in, shape[0] * shape[2])
        v = u * math.sqrt(3.0 / fan_in)
    return v.astype(np.float32)


def decoder_arrays(decoder: dict[str, Any] | None = None) -> dict[str, np.ndarray]:
    """``decoder.*`` tensors (official names) plus the quantizer input projections."""
    from engines.qwen3.conversion.codec_decoder import CodecDecoder, DecoderConfig

    dc = dict(decoder or TINY_DECODER)
    model = CodecDecoder(DecoderConfig.from_dict(dc))
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    dim, cdim = dc["codebook_dim"] // 2, dc["codebook_dim"]
    for g in ("rvq_first", "rvq_rest"):  # unused by decode, present in official checkpoints
        shapes[f"quantizer.{g}.input_proj.weight"] = (dim, cdim, 1)
    out = {f"decoder.{k}": codec_value(f"decoder.{k}", s) for k, s in shapes.items()}
    last = max((k for k in out if k.startswith("decoder.decoder.")), key=_layer_index)
    out[last] = out[last] * np.float32(0.04)  # keep the tiny decoder's output mostly unclipped
    return out


def _layer_index(name: str) -> tuple[int, str]:
    return int(name.split(".")[2]), name


def encoder_arrays() -> dict[str, np.ndarray]:
    """``encoder.*`` tensors (official Mimi names) of the tiny codec encoder."""
    from engines.qwen3.conversion.codec_encoder import CodecEncoder, EncoderConfig

    model = CodecEncoder(EncoderConfig.from_dict(TINY_ENCODER))
    out = {}
    for k, v in model.state_dict().items():
        name = f"encoder.{k}"
        if k.endswith("initialized"):
            out[name] = np.ones(tuple(v.shape), np.float32)
        else:
            out[name] = codec_value(name, tuple(v.shape))
    return out


def speaker_arrays(enc_dim: int, spk: dict[str, Any] | None = None) -> dict[str, np.ndarray]:
    from engines.qwen3.conversion.speaker_encoder import SpeakerEncoderConfig, build_speaker_encoder

    cfg = dict(spk or TINY_SPEAKER)
    cfg["enc_dim"] = enc_dim
    model = build_speaker_encoder(SpeakerEncoderConfig.from_dict(cfg))
    return {
        f"speaker_encoder.{k}": codec_value(f"speaker_encoder.{k}", tuple(v.shape))
        for k, v in model.state_dict().items()
    }


def write_speech_tokenizer(st_dir: Path, decoder: dict[str, Any] | None = None) -> Path:
    from safetensors.numpy import save_file

    st_dir.mkdir(parents=True, exist_ok=True)
    (st_dir / "config.json").write_text(json.dumps(codec_config(decoder), indent=1))
    save_file({**encoder_arrays(), **decoder_arrays(decoder)}, str(st_dir / "model.safetensors"))
    return st_dir


def write_full_checkpoint(
    out_dir: Path, kind: str = "base", *, with_codec: bool = True, **cfg_kw: Any
) -> tuple[Path, dict[str, Any]]:
    """A tiny official-layout checkpoint: talker, speaker encoder (Base), speech_tokenizer/."""
    cfg_kw.setdefault("text_hidden", 8)
    if kind == "base":
        cfg_kw.setdefault("size", "0b6")
        cfg_kw.setdefault("hidden", 32)
        cfg_kw.setdefault("cp_hidden", 32)
    cfg = qh.tiny_config(kind, **cfg_kw)
    extra: dict[str, np.ndarray] = {}
    if kind == "base":
        width = cfg["talker_config"]["hidden_size"]
        cfg["speaker_encoder_config"] = {**TINY_SPEAKER, "enc_dim": width}
        extra = speaker_arrays(width)
    qh.write_checkpoint(out_dir, cfg, extra=extra)
    if with_codec:
        write_speech_tokenizer(out_dir / "speech_tokenizer")
    return out_dir, cfg


def test_audio(seconds: float = 2.0, seed: int = 0) -> np.ndarray:
    """A deterministic voiced-like 24 kHz signal (harmonics with vibrato plus a little noise)."""
    n = int(seconds * 24000)
    t = np.arange(n) / 24000.0
    f0 = 140.0 + 20.0 * np.sin(2 * np.pi * 3.0 * t)
    phase = 2 * np.pi * np.cumsum(f0) / 24000.0
    y = sum((0.3 / k) * np.sin(k * phase) for k in range(1, 8))
    env = 0.6 + 0.4 * np.sin(2 * np.pi * 1.5 * t) ** 2
    noise = np.random.default_rng(seed).normal(0.0, 0.01, n)
    return (y * env + noise).astype(np.float32)


def golden_codes(frames: int, name: str = "codec_codes") -> np.ndarray:
    return qh.ref_codes(frames, name=name)
