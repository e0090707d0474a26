"""Talker and code predictor in plain torch: static KV cache, no Hugging Face ``generate``.

Both networks are Qwen3 decoder stacks (pre-norm, per-head q/k RMSNorm before
RoPE, GQA, SwiGLU, no biases) with plain 1-D NEOX RoPE: the talker's
interleaved MRoPE with three equal position streams is exactly that (brief
§1.2). Weights are fused where it saves kernel launches (q|k|v, gate|up);
the code predictor's inputs are pre-projected tables when the talker and
predictor widths differ (1.7B: 2048 -> 1024), so one predictor step is one
row gather plus the layer stack.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from engines.qwen3.gguf_model import LayerWeights, ModelMetadata, TtsWeights

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


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """Qwen3 RMSNorm: normalise in float32, cast back, then scale (no 1+w form)."""
    xf = x.to(torch.float32)
    var = xf.pow(2).mean(-1, keepdim=True)
    xf = xf * torch.rsqrt(var + eps)
    return weight * xf.to(x.dtype)


def rope_tables(
    head_dim: int, theta: float, length: int, device: torch.device, dtype: torch.dtype
) -> tuple[Tensor, Tensor]:
    """NEOX cos/sin tables ``[length, head_dim]`` computed as the reference does (float32)."""
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim)
    )
    pos = torch.arange(length, dtype=torch.float32)
    freqs = pos[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(device=device, dtype=dtype), emb.sin().to(device=device, dtype=dtype)


@dataclass
class KVCache:
    """Preallocated keys/values: ``[layers, kv_heads, length, head_dim]`` each."""

    k: Tensor
    v: Tensor

    @property
    def length(self) -> int:
        return int(self.k.shape[2])


@dataclass
class _Layer:
    attn_norm: Tensor
    wqkv: Tensor
    qk_norm: Tensor  # [n_heads + n_kv_heads, head_dim]: q_norm rows then k_norm rows
    wo: Tensor
    ffn_norm: Tensor
    w_gate_up: Tensor
    w_down: Tensor


class DecoderStack:
    """A Qwen3 decoder stack over one sequence (batch 1), with an explicit KV cache.

    Per layer the work is: one fused q|k|v matmul, one RMSNorm over all q and k
    heads at once, RoPE as ``x*cos + roll(x)*sin'`` (bit-identical to
    rotate-half), the cache write, SDPA, and a fused gate|up SwiGLU.
    """

    def __init__(
        self,
        layers: Sequence[LayerWeights],
        final_norm: np.ndarray,
        *,
        n_heads: int,
        n_kv_heads: int,
        head_dim: int,
        eps: float,
        rope_theta: float,
        max_positions: int,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        self.n_heads = n_heads
        self.n_kv = n_kv_heads
        self.head_dim = head_dim
        self.eps = eps
        self.theta = rope_theta
        self.device = device
        self.dtype = dtype
        self.q_dim = n_heads * head_dim
        self.kv_dim = n_kv_heads * head_dim
        self.scale = head_dim**-0.5
        self.gqa = n_heads != n_kv_heads

        def t(a: np.ndarray) -> Tensor:
            return torch.from_numpy(np.array(a, dtype=np.float32)).to(device=device, dtype=dtype)

        self.layers = [
            _Layer(
                attn_norm=t(lw.attn_norm),
                wqkv=t(np.concatenate([lw.q, lw.k, lw.v], axis=0)),
                qk_norm=t(
                    np.concatenate(
                        [np.tile(lw.q_norm, (n_heads, 1)), np.tile(lw.k_norm, (n_kv_heads, 1))]
                    )
                ),
                wo=t(lw.o),
                ffn_norm=t(lw.ffn_norm),
                w_gate_up=t(np.concatenate([lw.gate, lw.up], axis=0)),
                w_down=t(lw.down),
            )
            for lw in layers
        ]
        self.width = int(final_norm.shape[0])
        self.norm = t(final_norm)
        self._max_pos = 0
        self.cos = self.sin = torch.empty(0)
        self.ensure_positions(max_positions)

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    def ensure_positions(self, n: int) -> None:
        if n > self._max_pos:
            size = max(n, 2 * self._max_pos)
            cos, sin = rope_tables(self.head_dim, self.theta, size, self.device, self.dtype)
            half = self.head_dim // 2
            # rotate_half(x) * sin == roll(x, half) * [-sin_lo, sin_hi] exactly.
            sin = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)
            self.cos, self.sin = cos, sin
            self._max_pos = size

    def new_cache(self, length: int) -> KVCache:
        self.ensure_positions(length)
        shape = (self.n_layers, self.n_kv, length, self.head_dim)
        return KVCache(
            k=torch.zeros(shape, device=self.device, dtype=self.dtype),
            v=torch.zeros(shape, device=self.device, dtype=self.dtype),
        )

    def _norm(self, x: Tensor, w: Tensor) -> Tensor:
        if x.dtype != torch.float32:
            return rms_norm(x, w, self.eps)
        if w.dim() == 1:
            return F.rms_norm(x, (x.shape[-1],), w, self.eps)  # bit-identical in float32
        return F.rms_norm(x, (x.shape[-1],), None, self.eps) * w

    def forward(self, x: Tensor, pos: int, cache: KVCache) -> Tensor:
        """Run rows ``x [L, H]`` at positions ``pos..pos+L-1``; return the normed ``[L, H]``."""
        seq = x.shape[0]
        end = pos + seq
        if end > cache.length:
            raise ValueError(f"KV cache of {cache.length} positions is full (need {end})")
        cos = self.cos[pos:end].unsqueeze(1)
        sin = self.sin[pos:end].unsqueeze(1)
        if seq == 1:
            mask: Tensor | None = None
            causal = False
        elif pos == 0:
            mask, causal = None, True
        else:
            i = torch.arange(seq, device=x.device)[:, None]
            j = torch.arange(end, device=x.device)[None, :]
            mask, causal = j <= (i + pos), False
        hd, nh, nkv = self.head_dim, self.n_heads, self.n_kv
        half = hd // 2
        qd, kd = self.q_dim, self.kv_dim
        norm = self._norm
        for li, layer in enumerate(self.layers):
            qkv = F.linear(norm(x, layer.attn_norm), layer.wqkv)
            qk = norm(qkv[:, : qd + kd].reshape(seq, nh + nkv, hd), layer.qk_norm)
            qk = qk * cos + qk.roll(half, -1) * sin
            cache.k[li, :, pos:end] = qk[:, nh:].transpose(0, 1)
            cache.v[li, :, pos:end] = qkv[:, qd + kd :].reshape(seq, nkv, hd).transpose(0, 1)
            attn = F.scaled_dot_product_attention(
                qk[:, :nh].transpose(0, 1).unsqueeze(0),
                cache.k[li : li + 1, :, :end],
                cache.v[li : li + 1, :, :end],
                attn_mask=mask,
                is_causal=causal,
                scale=self.scale,
                enable_gqa=self.gqa,
            )
            x = x + F.linear(attn[0].transpose(0, 1).reshape(seq, qd), layer.wo)
            gate, up = F.linear(norm(x, layer.ffn_norm), layer.w_gate_up).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, layer.w_down)
        return norm(x, self.norm)


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
        self.codec_embd = t(weights.codec_embd)  # [V, H]
        self.codec_head = t(weights.codec_head)  # [V, H]
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
        # Talker-width predictor embeddings (for the next talker input) ...
        self.cp_embd = torch.stack([t(e) for e in weights.cp_embd])  # [G, Vc, H]
        self.cp_heads = torch.stack([t(e) for e in weights.cp_heads])  # [G, Vc, Hc]
        self.proj_w = t(weights.proj_w) if weights.proj_w is not None else None
        self.proj_b = t(weights.proj_b) if weights.proj_b is not None else None
        # ... and predictor-width copies, projected once (identity when widths match).
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
        parts = torch.cat(
            (self.codec_embd[codes[:1]], self.cp_embd[self.group_index, codes[1:]]), dim=0
        )
        return parts.sum(0)

    def frames_embedding(self, codes: Tensor) -> Tensor:
        """Row-wise ``frame_embedding`` of ``[R, 16]`` codes -> ``[R, H]``."""
        first = self.codec_embd[codes[:, 0]].unsqueeze(1)  # [R, 1, H]
        rest = self.cp_embd[self.group_index[None, :], codes[:, 1:]]  # [R, G, H]
        return torch.cat((first, rest), dim=1).sum(1)
