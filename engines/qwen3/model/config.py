"""The model's own types: network sizes, control ids, metadata and weights in numpy order.

The GGUF loader (``engines.qwen3.weights.gguf_loader``) fills them; the model,
the prefill layout and the request checks read them, without knowing the file format.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt

F32Array = npt.NDArray[np.float32]


class LazyRows(Protocol):
    """A table read row by row on demand (the huge text embedding stays in the file)."""

    def rows(self, ids: Sequence[int] | npt.NDArray[np.int64]) -> F32Array: ...


@dataclass(frozen=True)
class TalkerConfig:
    hidden_size: int
    n_layers: int
    n_attention_heads: int
    n_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    vocab_size: int
    text_vocab_size: int
    text_hidden_size: int
    num_code_groups: int
    context_length: int


@dataclass(frozen=True)
class CodePredictorConfig:
    hidden_size: int
    n_layers: int
    n_attention_heads: int
    n_key_value_heads: int
    intermediate_size: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    vocab_size: int


@dataclass(frozen=True)
class CodecIds:
    pad: int
    bos: int
    eos: int
    think: int
    nothink: int
    think_bos: int
    think_eos: int


@dataclass(frozen=True)
class TextIds:
    im_start: int
    im_end: int
    tts_pad: int
    tts_bos: int
    tts_eos: int
    assistant: int
    newline: int


@dataclass(frozen=True)
class ModelMetadata:
    talker: TalkerConfig
    predictor: CodePredictorConfig
    codec: CodecIds
    text: TextIds
    languages: dict[str, int] = field(default_factory=dict)
    speakers: dict[str, int] = field(default_factory=dict)
    dialects: dict[str, str] = field(default_factory=dict)
    model_type: str | None = None  # base / custom_voice / voice_design
    model_size: str | None = None  # 0.6b / 1.7b

    @property
    def has_projection_widths(self) -> bool:
        return self.talker.hidden_size != self.predictor.hidden_size


@dataclass
class LayerWeights:
    attn_norm: F32Array
    q: F32Array
    k: F32Array
    v: F32Array
    o: F32Array
    q_norm: F32Array
    k_norm: F32Array
    ffn_norm: F32Array
    gate: F32Array
    up: F32Array
    down: F32Array


@dataclass
class TtsWeights:
    """All weights in numpy/torch order, float32; the text embedding stays lazy."""

    meta: ModelMetadata
    text_embd: LazyRows
    text_fc1_w: F32Array
    text_fc1_b: F32Array
    text_fc2_w: F32Array
    text_fc2_b: F32Array
    codec_embd: F32Array
    codec_head: F32Array
    talker_norm: F32Array
    talker_layers: list[LayerWeights]
    cp_embd: list[F32Array]
    cp_heads: list[F32Array]
    cp_norm: F32Array
    cp_layers: list[LayerWeights]
    proj_w: F32Array | None
    proj_b: F32Array | None
