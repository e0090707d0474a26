"""Official Hugging Face Qwen3-TTS checkpoint -> our three GGUF files (``ttsdock qwen3-convert``).

Input: a checkpoint directory with ``config.json``, ``*.safetensors`` (bf16/f16/f32)
and the Qwen2 tokenizer files (``tokenizer.json``, or ``vocab.json`` + ``merges.txt``
+ ``tokenizer_config.json``). Output (the file names of ``weights/paths.py``,
``mode`` in base/customvoice/voicedesign, ``size`` 0.6b/1.7b from ``tts_model_size``)::

    qwen3-tts-{size}-{mode}-talker-{dtype}.gguf           talker.* tensors + talker metadata
    qwen3-tts-{size}-{mode}-code-predictor-{dtype}.gguf   code_pred.* tensors (+ projection)
    qwen3-tts-{size}-{mode}-tokenizer.gguf                tokenizer.ggml.* metadata

or, with ``--bundled``, everything in ``qwen3-tts-{size}-{mode}-{dtype}.gguf``.
1-D tensors (norms, biases) stay F32; 2-D tensors get ``--dtype`` (q8_0 falls
back to F16 for rows not a multiple of 32). The projection tensors are written
whenever the checkpoint has them (they follow the tensors, not the size string).

When the checkpoint has ``speech_tokenizer/`` (the 12 Hz codec), the command
(``engines.qwen3.cli.convert``) also
exports ``qwen3-tts-vocoder.onnx`` and, for Base checkpoints, the speaker encoder
(and the codec encoder) for voice-clone prompts (``engines.qwen3.conversion.onnx_export``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from engines.qwen3.errors import ConversionError
from engines.qwen3.modes import MODES, QtsMode, mode_of_model_type_or_none, size_or_none
from engines.qwen3.weights import gguf_keys as keys

ARCH = "qwen3-tts"
DTYPES = ("f32", "f16", "q8_0")

_LAYER_MAP = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_FIXED_MAP = {
    "talker.model.codec_embedding.weight": "talker.codec_embd.weight",
    "talker.model.text_embedding.weight": "talker.text_embd.weight",
    "talker.text_projection.linear_fc1.weight": "talker.text_proj.fc1.weight",
    "talker.text_projection.linear_fc1.bias": "talker.text_proj.fc1.bias",
    "talker.text_projection.linear_fc2.weight": "talker.text_proj.fc2.weight",
    "talker.text_projection.linear_fc2.bias": "talker.text_proj.fc2.bias",
    "talker.codec_head.weight": "talker.codec_head.weight",
    "talker.model.norm.weight": "talker.output_norm.weight",
    "talker.code_predictor.model.norm.weight": "code_pred.output_norm.weight",
    "talker.code_predictor.small_to_mtp_projection.weight": (
        "code_pred.small_to_mtp_projection.weight"
    ),
    "talker.code_predictor.small_to_mtp_projection.bias": "code_pred.small_to_mtp_projection.bias",
}
_TALKER_LAYER = re.compile(r"talker\.model\.layers\.(\d+)\.(.+)\.weight$")
_CP_LAYER = re.compile(r"talker\.code_predictor\.model\.layers\.(\d+)\.(.+)\.weight$")
_CP_EMBD = re.compile(r"talker\.code_predictor\.model\.codec_embedding\.(\d+)\.weight$")
_CP_HEAD = re.compile(r"talker\.code_predictor\.lm_head\.(\d+)\.weight$")

TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED = 1, 3, 4, 5


def gguf_name(hf_name: str) -> str | None:
    """Our GGUF tensor name for an official tensor name (None: not converted)."""
    if hf_name in _FIXED_MAP:
        return _FIXED_MAP[hf_name]
    if m := _TALKER_LAYER.match(hf_name):
        suffix = _LAYER_MAP.get(m.group(2))
        return f"talker.blk.{m.group(1)}.{suffix}.weight" if suffix else None
    if m := _CP_LAYER.match(hf_name):
        suffix = _LAYER_MAP.get(m.group(2))
        return f"code_pred.blk.{m.group(1)}.{suffix}.weight" if suffix else None
    if m := _CP_EMBD.match(hf_name):
        return f"code_pred.codec_embd.{m.group(1)}.weight"
    if m := _CP_HEAD.match(hf_name):
        return f"code_pred.lm_head.{m.group(1)}.weight"
    return None


@dataclass(frozen=True)
class OutputFiles:
    talker: Path
    code_predictor: Path
    tokenizer: Path


def output_names(size: str, mode: str, dtype: str, bundled: bool = False) -> tuple[str, str, str]:
    stem = f"qwen3-tts-{size}-{mode}"
    if bundled:
        one = f"{stem}-{dtype}.gguf"
        return one, one, one
    return (
        f"{stem}-talker-{dtype}.gguf",
        f"{stem}-code-predictor-{dtype}.gguf",
        f"{stem}-tokenizer.gguf",
    )


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConversionError(f"{path}: file not found") from None
    except (OSError, ValueError) as exc:
        raise ConversionError(f"{path}: cannot read JSON: {exc}") from exc


def _iter_safetensors(hf_dir: Path) -> Iterator[tuple[str, npt.NDArray[np.float32]]]:
    from safetensors import safe_open

    files = sorted(hf_dir.glob("*.safetensors"))
    if not files:
        raise ConversionError(f"{hf_dir}: no *.safetensors files")
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as st:
                for name in st.keys():
                    t = st.get_tensor(name)
                    yield name, t.float().numpy()
        except ConversionError:
            raise
        except Exception as exc:
            raise ConversionError(f"{f}: cannot read safetensors: {exc}") from exc


def read_hf_tokenizer(hf_dir: Path) -> tuple[list[str], list[int], list[str]]:
    """Tokens (one per id, gaps filled), token types and merges of a Qwen2 tokenizer dir."""
    vocab: dict[str, int]
    merges: list[str]
    added: dict[int, tuple[str, bool]] = {}
    tj = hf_dir / "tokenizer.json"
    if tj.is_file():
        doc = _read_json(tj)
        model = doc.get("model", {})
        if model.get("type") != "BPE":
            raise ConversionError(f"{tj}: tokenizer model is {model.get('type')!r}, expected BPE")
        vocab = dict(model["vocab"])
        merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
        for tok in doc.get("added_tokens", []):
            added[int(tok["id"])] = (str(tok["content"]), bool(tok.get("special", False)))
    else:
        vocab = _read_json(hf_dir / "vocab.json")
        mpath = hf_dir / "merges.txt"
        try:
            lines = mpath.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            raise ConversionError(f"{mpath}: file not found") from None
        merges = [ln for ln in lines if ln and not ln.startswith("#version")]
    tc = hf_dir / "tokenizer_config.json"
    if tc.is_file():
        for sid, tok in (_read_json(tc).get("added_tokens_decoder") or {}).items():
            added.setdefault(int(sid), (str(tok["content"]), bool(tok.get("special", False))))
    n = max([*vocab.values(), *added.keys()]) + 1
    tokens = [f"[PAD{i}]" for i in range(n)]
    types = [TOKEN_UNUSED] * n
    for tok, i in vocab.items():
        tokens[i], types[i] = tok, TOKEN_NORMAL
    for i, (tok, special) in added.items():
        tokens[i], types[i] = tok, TOKEN_CONTROL if special else TOKEN_USER_DEFINED
    return tokens, types, merges


def _quantize(arr: npt.NDArray[np.float32], dtype: str) -> tuple[np.ndarray, Any]:
    import gguf

    if arr.ndim < 2 or dtype == "f32":
        return np.ascontiguousarray(arr, dtype=np.float32), gguf.GGMLQuantizationType.F32
    if dtype == "q8_0" and arr.shape[-1] % 32 == 0:
        q = gguf.quants.quantize(arr, gguf.GGMLQuantizationType.Q8_0)
        return q, gguf.GGMLQuantizationType.Q8_0
    return arr.astype(np.float16), gguf.GGMLQuantizationType.F16


def _talker_metadata(cfg: dict[str, Any]) -> list[tuple[str, str, Any]]:
    """Talker scalars from the one key table (``gguf_keys``), then the key families."""
    tc = cfg.get("talker_config") or {}
    out = keys.write_items(cfg, (keys.TALKER, keys.CODEC, keys.TEXT))
    for lang, lid in sorted((tc.get("codec_language_id") or {}).items()):
        out.append(("u32", f"{keys.LANGUAGE_PREFIX}{lang.lower()}", int(lid)))
    for spk, sid in sorted((tc.get("spk_id") or {}).items()):
        if isinstance(sid, list):
            if len(sid) != 1:
                raise ConversionError(f"config.json: spk_id[{spk!r}] must be one id, got {sid!r}")
            sid = sid[0]
        out.append(("u32", f"{keys.SPEAKER_PREFIX}{spk.lower()}", int(sid)))
    for spk, dia in sorted((tc.get("spk_is_dialect") or {}).items()):
        if isinstance(dia, str) and dia:
            out.append(("str", f"{keys.DIALECT_PREFIX}{spk.lower()}", dia.lower()))
        else:
            out.append(("bool", f"{keys.DIALECT_PREFIX}{spk.lower()}", False))
    return out


def _predictor_metadata(cfg: dict[str, Any]) -> list[tuple[str, str, Any]]:
    return keys.write_items(cfg, (keys.PREDICTOR,))


def _add_kv(w: Any, items: list[tuple[str, str, Any]]) -> None:
    for kind, key, v in items:
        if kind == "u32":
            w.add_uint32(key, v)
        elif kind == "f32":
            w.add_float32(key, v)
        elif kind == "bool":
            w.add_bool(key, v)
        else:
            w.add_string(key, v)


def convert(
    hf_dir: str | Path,
    out_dir: str | Path,
    *,
    dtype: str = "f16",
    size: str | None = None,
    mode: str | None = None,
    bundled: bool = False,
) -> OutputFiles:
    """Convert one checkpoint directory; returns the written paths."""
    import gguf

    src = Path(hf_dir)
    out = Path(out_dir)
    if dtype not in DTYPES:
        raise ConversionError(f"unknown --dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
    if not src.is_dir():
        raise ConversionError(f"{src}: not a directory")
    cfg = _read_json(src / "config.json")
    mtype = str(cfg.get("tts_model_type") or "")
    mode_slug = mode_of_model_type_or_none(mode or mtype)
    if mode_slug is None and mode in MODES:
        mode_slug = mode
    if mode_slug is None:
        raise ConversionError(
            f"{src / 'config.json'}: cannot tell the mode (tts_model_type={mtype!r}); pass --mode"
        )
    msize = str(cfg.get("tts_model_size") or "")
    size_slug = size_or_none((size or msize).lower())
    if size_slug is None:
        raise ConversionError(
            f"{src / 'config.json'}: cannot tell the size (tts_model_size={msize!r}); pass --size"
        )
    if "talker_config" not in cfg:
        raise ConversionError(f"{src / 'config.json'}: no talker_config (not a Qwen3-TTS model?)")
    tokens, types, merges = read_hf_tokenizer(src)
    out.mkdir(parents=True, exist_ok=True)
    names = output_names(size_slug, mode_slug, dtype, bundled)
    paths = OutputFiles(out / names[0], out / names[1], out / names[2])

    identity = [
        ("str", keys.MODEL_TYPE_KEYS[0], QtsMode(mode_slug).model_type),
        ("str", keys.MODEL_SIZE_KEYS[0], size_slug),
    ]
    tw = gguf.GGUFWriter(str(paths.talker), arch=ARCH)
    pw = tw if bundled else gguf.GGUFWriter(str(paths.code_predictor), arch=ARCH)
    kw = tw if bundled else gguf.GGUFWriter(str(paths.tokenizer), arch=ARCH)
    tw.add_name(f"Qwen3-TTS {size_slug} {mode_slug} talker")
    _add_kv(tw, identity + _talker_metadata(cfg))
    if pw is not tw:
        pw.add_name(f"Qwen3-TTS {size_slug} {mode_slug} code predictor")
        _add_kv(pw, identity)
    _add_kv(pw, _predictor_metadata(cfg))
    if kw is not tw:
        kw.add_name(f"Qwen3-TTS {size_slug} {mode_slug} tokenizer")
    kw.add_tokenizer_model("gpt2")
    kw.add_tokenizer_pre("qwen2")
    kw.add_token_list(tokens)
    kw.add_token_types(types)
    kw.add_token_merges(merges)
    if "<|endoftext|>" in tokens:
        kw.add_eos_token_id(tokens.index("<|endoftext|>"))

    n_talker = n_cp = 0
    skipped: list[str] = []
    for name, arr in _iter_safetensors(src):
        g = gguf_name(name)
        if g is None:
            skipped.append(name)
            continue
        data, qtype = _quantize(arr, dtype)
        writer = tw if g.startswith("talker.") else pw
        writer.add_tensor(g, data, raw_dtype=qtype)
        if g.startswith("talker."):
            n_talker += 1
        else:
            n_cp += 1
    if n_talker == 0 or n_cp == 0:
        raise ConversionError(
            f"{src}: found {n_talker} talker and {n_cp} code-predictor tensors; "
            "is this an official Qwen3-TTS checkpoint?"
        )
    unexpected = [s for s in skipped if not s.startswith("speaker_encoder.")]
    if unexpected:
        raise ConversionError(
            f"{src}: unknown tensors (not converted): {', '.join(unexpected[:5])}"
            + (" ..." if len(unexpected) > 5 else "")
        )
    for w in {id(x): x for x in (tw, pw, kw)}.values():
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    return paths
