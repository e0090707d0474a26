"""The QTS GGUF metadata schema, once: what ``qwen3-convert`` writes and the loader reads.

Rule 1: every scalar metadata key lives in one ``MetaKey`` row below: the
config field it is filled from (writer), the keys it is looked up under in
order (reader; ``keys[0]`` is the one written), its type, and what the reader
falls back to when it is absent (a constant, another field, or a fact derived
from the tensors). Rule 2: this file touches no file: ``write_items`` turns a
``config.json`` dict into ``(kind, key, value)`` items and ``read_group``
takes a lookup function and a tensor-facts object, so both sides stay thin.

Key families (one key per language / speaker / dialect) are named by their
prefixes here and spelled by both sides from these constants.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

NS = "qwen3-tts."
TALKER_NS = "qwen3-tts.talker."
PRED_NAMESPACES = ("qwen3-tts.code_pred.", "qwen3-tts.code_predictor.")
LANGUAGE_PREFIX = TALKER_NS + "codec_language_id."
SPEAKER_PREFIX = TALKER_NS + "spk_id."
DIALECT_PREFIX = TALKER_NS + "spk_is_dialect."
MODEL_TYPE_KEYS = (NS + "tts_model_type", NS + "model_type")
MODEL_SIZE_KEYS = (NS + "tts_model_size", NS + "model_size")

Kind = Literal["u32", "f32"]
Source = str | Callable[[dict[str, Any]], Any] | None


@dataclass(frozen=True)
class FromTensor:
    """Derive a value from a tensor's GGML shape: ``shape[dim]`` (divided by field ``per``).

    ``fallback`` (a constant, or ``"=group.field"`` for an earlier value) applies when
    the tensor is absent; None makes a missing tensor an error.
    """

    tensor: str
    dim: int
    per: str | None = None
    fallback: int | str | None = None


@dataclass(frozen=True)
class LayerCount:
    """Derive a block count from the ``<prefix>.blk.N.*`` tensor names."""

    prefix: str


@dataclass(frozen=True)
class CountTensors:
    """Derive ``plus + count`` of tensors matching ``pattern`` (``fallback`` when none)."""

    pattern: str
    plus: int
    fallback: int


Derive = FromTensor | LayerCount | CountTensors


@dataclass(frozen=True)
class MetaKey:
    field: str
    kind: Kind
    keys: tuple[str, ...]
    source: Source = None  # dotted config.json path, or a function of the config
    default: int | float | str | None = None  # constant, or "=group.field" (inherit)
    derive: Derive | None = None
    read: bool = True  # False: written for other readers only
    what: str = ""  # the value in words, for errors (default: "<group> <field>")


@dataclass(frozen=True)
class MetaGroup:
    name: str
    keys: tuple[MetaKey, ...]
    prefer_predictor: bool = False  # look in the predictor file first


def _talker(name: str, *extra: str) -> tuple[str, ...]:
    return (TALKER_NS + name, *extra, NS + name)


def _pred(*names: str) -> tuple[str, ...]:
    return tuple(ns + n for ns in PRED_NAMESPACES for n in names)


def _head_dim(cfg: dict[str, Any]) -> Any:
    tc = cfg.get("talker_config") or {}
    if tc.get("head_dim"):
        return tc["head_dim"]
    if "hidden_size" in tc and tc.get("num_attention_heads"):
        return tc["hidden_size"] // tc["num_attention_heads"]
    return None


_T = "talker_config."
_P = "talker_config.code_predictor_config."

TALKER = MetaGroup(
    "talker",
    (
        MetaKey(
            "hidden_size",
            "u32",
            _talker("embedding_length", TALKER_NS + "hidden_size"),
            _T + "hidden_size",
            derive=FromTensor("talker.output_norm.weight", 0),
            what="talker width",
        ),
        MetaKey(
            "n_layers",
            "u32",
            _talker("block_count"),
            _T + "num_hidden_layers",
            derive=LayerCount("talker"),
        ),
        MetaKey(
            "head_dim",
            "u32",
            _talker("attention.key_length"),
            _head_dim,
            derive=FromTensor("talker.blk.0.attn_q_norm.weight", 0, fallback=128),
        ),
        MetaKey(
            "n_attention_heads",
            "u32",
            _talker("attention.head_count"),
            _T + "num_attention_heads",
            derive=FromTensor("talker.blk.0.attn_q.weight", 1, per="head_dim"),
            what="talker head count",
        ),
        MetaKey(
            "n_key_value_heads",
            "u32",
            _talker("attention.head_count_kv"),
            _T + "num_key_value_heads",
            derive=FromTensor("talker.blk.0.attn_k.weight", 1, per="head_dim"),
            what="talker kv head count",
        ),
        MetaKey(
            "intermediate_size",
            "u32",
            _talker("feed_forward_length"),
            _T + "intermediate_size",
            derive=FromTensor("talker.blk.0.ffn_gate.weight", 1),
            what="talker FFN width",
        ),
        MetaKey(
            "vocab_size",
            "u32",
            _talker("vocab_size"),
            _T + "vocab_size",
            derive=FromTensor("talker.codec_embd.weight", 1),
            what="codec vocab",
        ),
        MetaKey(
            "text_vocab_size",
            "u32",
            _talker("text_vocab_size"),
            _T + "text_vocab_size",
            derive=FromTensor("talker.text_embd.weight", 1),
            what="text vocab",
        ),
        MetaKey(
            "text_hidden_size",
            "u32",
            _talker("text_hidden_size"),
            _T + "text_hidden_size",
            derive=FromTensor("talker.text_embd.weight", 0),
            what="text width",
        ),
        MetaKey(
            "context_length",
            "u32",
            _talker("context_length"),
            _T + "max_position_embeddings",
            default=32768,
        ),
        MetaKey(
            "rms_norm_eps",
            "f32",
            _talker("attention.layer_norm_rms_epsilon"),
            lambda c: (c.get("talker_config") or {}).get("rms_norm_eps", 1e-6),
            default=1e-6,
        ),
        MetaKey(
            "rope_theta",
            "f32",
            _talker("rope.freq_base"),
            lambda c: (c.get("talker_config") or {}).get("rope_theta", 1_000_000.0),
            default=1_000_000.0,
        ),
        MetaKey(
            "num_code_groups",
            "u32",
            (NS + "num_code_groups", TALKER_NS + "num_code_groups"),
            lambda c: (c.get("talker_config") or {}).get("num_code_groups", 16),
            derive=CountTensors(r"code_pred\.lm_head\.\d+\.weight$", plus=1, fallback=16),
        ),
    ),
)

PREDICTOR = MetaGroup(
    "predictor",
    (
        MetaKey(
            "hidden_size",
            "u32",
            _pred("embedding_length", "hidden_size"),
            _P + "hidden_size",
            derive=FromTensor("code_pred.output_norm.weight", 0),
            what="predictor width",
        ),
        MetaKey(
            "head_dim",
            "u32",
            _pred("attention.key_length"),
            _P + "head_dim",
            derive=FromTensor("code_pred.blk.0.attn_q_norm.weight", 0, fallback="=talker.head_dim"),
        ),
        MetaKey(
            "n_layers",
            "u32",
            _pred("layer_count", "block_count"),
            _P + "num_hidden_layers",
            derive=LayerCount("code_pred"),
        ),
        MetaKey(
            "n_attention_heads",
            "u32",
            _pred("attention.head_count"),
            _P + "num_attention_heads",
            derive=FromTensor("code_pred.blk.0.attn_q.weight", 1, per="head_dim"),
            what="predictor head count",
        ),
        MetaKey(
            "n_key_value_heads",
            "u32",
            _pred("attention.head_count_kv"),
            _P + "num_key_value_heads",
            derive=FromTensor("code_pred.blk.0.attn_k.weight", 1, per="head_dim"),
            what="predictor kv head count",
        ),
        MetaKey(
            "intermediate_size",
            "u32",
            _pred("feed_forward_length"),
            _P + "intermediate_size",
            derive=FromTensor("code_pred.blk.0.ffn_gate.weight", 1),
            what="predictor FFN width",
        ),
        MetaKey(
            "vocab_size",
            "u32",
            _pred("vocab_size"),
            _P + "vocab_size",
            derive=FromTensor("code_pred.lm_head.0.weight", 1, fallback=2048),
        ),
        MetaKey(
            "context_length",
            "u32",
            _pred("context_length"),
            _P + "max_position_embeddings",
            read=False,
        ),
        MetaKey(
            "rms_norm_eps",
            "f32",
            _pred("attention.layer_norm_rms_epsilon"),
            _P + "rms_norm_eps",
            default="=talker.rms_norm_eps",
        ),
        MetaKey(
            "rope_theta",
            "f32",
            _pred("rope.freq_base"),
            _P + "rope_theta",
            default="=talker.rope_theta",
        ),
    ),
    prefer_predictor=True,
)

_CODEC_DEFAULTS = {
    "pad": 2148,
    "bos": 2149,
    "eos": 2150,
    "think": 2154,
    "nothink": 2155,
    "think_bos": 2156,
    "think_eos": 2157,
}
CODEC = MetaGroup(
    "codec",
    tuple(
        MetaKey(
            name,
            "u32",
            (f"{NS}codec.{name}_id", f"{TALKER_NS}codec_{name}_id"),
            _T + ("codec_eos_token_id" if name == "eos" else f"codec_{name}_id"),
            default=d,
        )
        for name, d in _CODEC_DEFAULTS.items()
    ),
)

_TEXT_DEFAULTS = {
    "im_start": (151644, "im_start_token_id"),
    "im_end": (151645, "im_end_token_id"),
    "tts_pad": (151671, "tts_pad_token_id"),
    "tts_bos": (151672, "tts_bos_token_id"),
    "tts_eos": (151673, "tts_eos_token_id"),
    "assistant": (77091, "assistant_token_id"),
    "newline": (198, None),
}
TEXT = MetaGroup(
    "text",
    tuple(
        MetaKey(name, "u32", (f"{NS}text.{name}_id",), src, default=d)
        for name, (d, src) in _TEXT_DEFAULTS.items()
    ),
)


# -- writer ---------------------------------------------------------------------------------


def _config_value(cfg: dict[str, Any], source: Source) -> Any:
    if source is None:
        return None
    if callable(source):
        return source(cfg)
    cur: Any = cfg
    for part in source.split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(part)
    return cur


def write_items(cfg: dict[str, Any], groups: Sequence[MetaGroup]) -> list[tuple[str, str, Any]]:
    """``(kind, key, value)`` for every key of ``groups`` whose config value is present."""
    out: list[tuple[str, str, Any]] = []
    for g in groups:
        for k in g.keys:
            v = _config_value(cfg, k.source)
            if v is not None:
                out.append((k.kind, k.keys[0], int(v) if k.kind == "u32" else float(v)))
    return out


# -- reader ---------------------------------------------------------------------------------


class TensorFacts(Protocol):
    """What the reader may ask about the tensors (no data is read)."""

    def ggml_shape(self, name: str) -> tuple[int, ...] | None: ...

    def names(self) -> Sequence[str]: ...


class MetaError(Exception):
    """A metadata value is unusable: ``key`` and ``reason``; the caller adds the file."""

    def __init__(self, key: str, reason: str, *, predictor: bool = False) -> None:
        super().__init__(f"{key}: {reason}")
        self.key = key
        self.reason = reason
        self.predictor = predictor


def _as_int(key: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise MetaError(key, f"metadata {key!r} must be a number, got {v!r}")
    if isinstance(v, float) and not v.is_integer():
        raise MetaError(key, f"metadata {key!r} must be an integer, got {v!r}")
    return int(v)


def _as_float(key: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise MetaError(key, f"metadata {key!r} must be a number, got {v!r}")
    return float(v)


def read_group(
    group: MetaGroup,
    lookup: Callable[[str, bool], Any],
    tensors: TensorFacts,
    done: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    """The values of ``group`` (field -> value): metadata first, then default or derivation.

    ``lookup(key, prefer_predictor)`` returns a key's value or None; ``done`` holds
    groups read before (for ``"=group.field"`` references). Raises ``MetaError``.
    """
    vals: dict[str, Any] = {}
    pred = group.prefer_predictor

    def ref(r: int | float | str) -> Any:
        if isinstance(r, str) and r.startswith("="):
            g, f = r[1:].split(".", 1)
            return vals[f] if g == group.name else done[g][f]
        return r

    for k in group.keys:
        if not k.read:
            continue
        v = None
        for key in k.keys:
            v = lookup(key, pred)
            if v is not None:
                break
        if v is not None:
            vals[k.field] = _as_int(k.keys[0], v) if k.kind == "u32" else _as_float(k.keys[0], v)
            continue
        d = k.derive
        if isinstance(d, FromTensor):
            shape = tensors.ggml_shape(d.tensor)
            if shape is None:
                if d.fallback is None:
                    what = k.what or f"{group.name} {k.field}"
                    raise MetaError(
                        k.keys[0],
                        f"metadata for {what} is missing and tensor {d.tensor!r} is absent",
                        predictor=pred,
                    )
                vals[k.field] = ref(d.fallback)
            else:
                n = int(shape[d.dim])
                vals[k.field] = n // int(vals[d.per]) if d.per else n
        elif isinstance(d, LayerCount):
            pat = re.compile(re.escape(d.prefix) + r"\.blk\.(\d+)\.")
            idx = {int(m.group(1)) for n in tensors.names() if (m := pat.match(n))}
            if not idx:
                raise MetaError(
                    k.keys[0],
                    f"metadata for {group.name} {k.keys[0].rsplit('.', 1)[-1]} is missing "
                    f"(and no {d.prefix}.blk.* tensors)",
                    predictor=pred,
                )
            vals[k.field] = max(idx) + 1
        elif isinstance(d, CountTensors):
            n = sum(1 for name in tensors.names() if re.match(d.pattern, name))
            vals[k.field] = n + d.plus if n else d.fallback
        elif k.default is not None:
            vals[k.field] = ref(k.default)
        else:
            raise MetaError(k.keys[0], f"metadata {k.keys[0]!r} is missing", predictor=pred)
    return vals
