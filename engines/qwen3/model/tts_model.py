"""Talker and code predictor weights on one device: two ``DecoderStack`` plus their tables.

Both networks are the one decoder implementation of ``engines.qwen3.model.transformer``;
this module holds what surrounds them: the text projection, the code
embeddings (one table for all 16 codebooks), the codec head, the predictor
heads and the predictor-width input tables (pre-projected when the talker and
predictor widths differ, 1.7B: 2048 -> 1024, so one predictor step is one row
gather plus the stack).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from engines.qwen3.model.config import ModelMetadata, TtsWeights
from engines.qwen3.model.transformer import DecoderStack

Tensor = torch.Tensor

_DTYPES = {
    "float32": torch.float32,
    "f32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "f16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return _DTYPES[dtype.strip().lower()]
    except KeyError:
        raise ValueError(
            f"unknown dtype {dtype!r}; expected float32, float16 or bfloat16"
        ) from None


def resolve_device(device: str | torch.device) -> torch.device:
    if isinstance(device, torch.device):
        return device
    d = device.strip().lower()
    if d == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(d)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available")
    return dev


class TtsModel:
    """Talker + code predictor + text projection, on one device and dtype."""

    def __init__(
        self,
        weights: TtsWeights,
        *,
        device: str | torch.device = "cpu",
        dtype: str | torch.dtype = "float32",
    ) -> None:
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype)
        self.meta: ModelMetadata = weights.meta
        tc, pc = self.meta.talker, self.meta.predictor
        dev, dt = self.device, self.dtype

        def t(a: np.ndarray) -> Tensor:
            return torch.from_numpy(np.array(a, dtype=np.float32)).to(device=dev, dtype=dt)

        self.text_embd = weights.text_embd
        self.fc1_w, self.fc1_b = t(weights.text_fc1_w), t(weights.text_fc1_b)
        self.fc2_w, self.fc2_b = t(weights.text_fc2_w), t(weights.text_fc2_b)
        # One table for every code embedding (talker width): codebook 0 rows, then the 15
        # predictor codebooks, so a frame's input sum is one gather (``frame_embedding``).
        n_cb0 = int(weights.codec_embd.shape[0])
        self.embd_table = t(np.concatenate([weights.codec_embd, *weights.cp_embd], axis=0))
        self.codec_embd = self.embd_table[:n_cb0]  # [V, H] (a view)
        n_cp = len(weights.cp_embd)
        vc = int(weights.cp_embd[0].shape[0]) if n_cp else 0
        self.cp_embd = self.embd_table[n_cb0:].view(n_cp, vc, -1)  # [G, Vc, H] (a view)
        self.code_offsets = torch.tensor(
            [0, *(n_cb0 + g * vc for g in range(n_cp))], dtype=torch.long, device=dev
        )
        self.codec_head = t(weights.codec_head)  # [V, H]
        self.codec_head_t = self.codec_head.t()  # [H, V] view (``mm`` operand)
        self.talker = DecoderStack(
            weights.talker_layers,
            weights.talker_norm,
            n_heads=tc.n_attention_heads,
            n_kv_heads=tc.n_key_value_heads,
            head_dim=tc.head_dim,
            eps=tc.rms_norm_eps,
            rope_theta=tc.rope_theta,
            max_positions=256,
            device=dev,
            dtype=dt,
        )
        self.cp = DecoderStack(
            weights.cp_layers,
            weights.cp_norm,
            n_heads=pc.n_attention_heads,
            n_kv_heads=pc.n_key_value_heads,
            head_dim=pc.head_dim,
            eps=pc.rms_norm_eps,
            rope_theta=pc.rope_theta,
            max_positions=tc.num_code_groups + 1,
            device=dev,
            dtype=dt,
        )
        # Predictor heads stored [G, Hc, Vc] (``mm`` operands); ``cp_heads``: the [G, Vc, Hc] view.
        self.cp_heads_t = t(np.stack([np.asarray(e, np.float32).T for e in weights.cp_heads]))
        self.cp_heads = self.cp_heads_t.transpose(1, 2)
        self.proj_w = t(weights.proj_w) if weights.proj_w is not None else None
        self.proj_b = t(weights.proj_b) if weights.proj_b is not None else None
        # Predictor-width input tables, projected once (identity when widths match).
        with torch.inference_mode():
            self.cp_embd_in = self.project_to_predictor(self.cp_embd)  # [G, Vc, Hc]
            self.codec_embd_in = self.project_to_predictor(self.codec_embd)  # [V, Hc]
        self.group_index = torch.arange(tc.num_code_groups - 1, device=dev)

    @property
    def has_projection(self) -> bool:
        return self.proj_w is not None

    def project_to_predictor(self, x: Tensor) -> Tensor:
        """``small_to_mtp_projection`` (Linear with bias) or identity."""
        if self.proj_w is None:
            return x
        return F.linear(x, self.proj_w, self.proj_b)

    def project_text(self, ids: Sequence[int]) -> Tensor:
        """``text_projection(text_embedding(ids))`` -> ``[len(ids), H]`` (rows gathered lazily)."""
        rows = self.text_embd.rows(np.asarray(list(ids), dtype=np.int64))
        x = torch.from_numpy(rows).to(device=self.device, dtype=self.dtype)
        return F.linear(F.silu(F.linear(x, self.fc1_w, self.fc1_b)), self.fc2_w, self.fc2_b)

    def codec_rows(self, ids: Sequence[int]) -> Tensor:
        return self.codec_embd[torch.as_tensor(list(ids), dtype=torch.long, device=self.device)]

    def frame_embedding(self, codes: Tensor) -> Tensor:
        """Sum of the talker-width embeddings of one frame ``[16]`` (talker input / ICL rows)."""
        return self.embd_table.index_select(0, codes + self.code_offsets).sum(0)

    def frames_embedding(self, codes: Tensor) -> Tensor:
        """Row-wise ``frame_embedding`` of ``[R, 16]`` codes -> ``[R, H]``."""
        first = self.codec_embd[codes[:, 0]].unsqueeze(1)  # [R, 1, H]
        rest = self.cp_embd[self.group_index[None, :], codes[:, 1:]]  # [R, G, H]
        return torch.cat((first, rest), dim=1).sum(1)
