"""The one Qwen3 decoder implementation: a batch of rows, each at its own position.

Rule 1: every decoder computation (talker prefill, talker decode step, code
predictor prefill and steps; eager, CUDA-graph and tests) goes through
``DecoderStack.forward``. Rule 2: this file knows nothing of requests, sampling
or scheduling: it sees rows, positions and a KV cache.

The stack is pre-norm with per-head q/k RMSNorm before RoPE, GQA and SwiGLU,
no biases, plain 1-D NEOX RoPE (the talker's interleaved MRoPE with three
equal position streams is exactly that). Weights are fused where
it saves kernel launches (q|k|v, gate|up); the RMSNorm weights that precede a
matmul are folded into it, the attention scale and the q/k norm weights into
the RoPE factors. Attention is SDPA with a per-row causal mask built from the
positions, so batch row ``b`` attends to cache positions ``0..pos[b]+i`` of its
own cache row only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from engines.qwen3.model.config import LayerWeights

Tensor = torch.Tensor


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
    """Preallocated keys and values: ``[layers, batch, length, 2 * kv_heads, head_dim]``.

    ``kv[l, b, p]`` holds the keys (first ``kv_heads`` rows) and then the values
    of position ``p`` of batch row ``b``, so one write stores both. The last
    position (``length - 1``) is scratch: rows that only pad a batch write there.
    """

    kv: Tensor

    @property
    def batch(self) -> int:
        return int(self.kv.shape[1])

    @property
    def length(self) -> int:
        return int(self.kv.shape[2])

    def rows(self, start: int, stop: int) -> KVCache:
        """A view on batch rows ``start..stop-1`` (for example one newcomer's prefill)."""
        return KVCache(kv=self.kv[:, start:stop])


@dataclass
class _Layer:
    wqkv: Tensor  # [H, q+k+v]: attn_norm folded in, pre-transposed for ``matmul``
    qk_norm: Tensor  # [n_heads + n_kv_heads, head_dim]: q_norm rows (x 1/sqrt(d)), k_norm rows
    wo: Tensor  # [q, H]
    w_gate_up: Tensor  # [H, 2F]: ffn_norm folded in
    w_down: Tensor  # [F, H]


class DecoderStack:
    """A Qwen3 decoder stack over a batch of rows with an explicit, static KV cache."""

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

        def folded(w: np.ndarray, norm: np.ndarray) -> Tensor:
            # linear(norm_w * xn, W) == linear(xn, W * norm_w): W [out, in] -> [in, out]
            f = np.asarray(w, dtype=np.float32) * np.asarray(norm, dtype=np.float32)[None, :]
            return t(np.ascontiguousarray(f.T))

        half = head_dim // 2
        # RoPE pairs (i, i + d/2) are made adjacent by permuting the q and k rows of every
        # head alike: q.k is invariant, and RoPE acts on adjacent pairs.
        perm = np.stack([np.arange(half), np.arange(half) + half], axis=1).reshape(-1)

        def heads(w: np.ndarray, n: int) -> np.ndarray:
            w = np.asarray(w, np.float32)
            return w.reshape(n, head_dim, -1)[:, perm].reshape(n * head_dim, -1)

        self.layers: list[_Layer] = []
        for lw in layers:
            qkn = np.concatenate(
                [
                    np.tile(np.asarray(lw.q_norm, np.float32)[perm] * self.scale, (n_heads, 1)),
                    np.tile(np.asarray(lw.k_norm, np.float32)[perm], (n_kv_heads, 1)),
                ]
            )
            wqkv = np.concatenate([heads(lw.q, n_heads), heads(lw.k, n_kv_heads), lw.v], axis=0)
            self.layers.append(
                _Layer(
                    wqkv=folded(wqkv, lw.attn_norm),
                    qk_norm=t(qkn),
                    wo=t(np.ascontiguousarray(np.asarray(lw.o, np.float32).T)),
                    w_gate_up=folded(np.concatenate([lw.gate, lw.up], axis=0), lw.ffn_norm),
                    w_down=t(np.ascontiguousarray(np.asarray(lw.down, np.float32).T)),
                )
            )
        self.ffn = int(self.layers[0].w_down.shape[0]) if self.layers else 0
        self.width = int(final_norm.shape[0])
        self.norm = t(final_norm)
        self.eps_t = torch.tensor(eps, device=device, dtype=torch.float32)
        self._max_pos = 0
        self.cos = self.sin = self.cis = torch.empty(0)
        self.ensure_positions(max_positions)

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    def ensure_positions(self, n: int) -> None:
        """Grow the RoPE tables to ``n`` positions (not while a CUDA graph uses them)."""
        if n > self._max_pos:
            size = max(n, 2 * self._max_pos)
            cos, sin = rope_tables(self.head_dim, self.theta, size, self.device, torch.float32)
            half = self.head_dim // 2
            c, s = cos[:, :half], sin[:, :half]
            # interleaved pairs (a, b) -> (a*c - b*s, b*c + a*s): a complex multiply
            self.cis = torch.complex(c, s)  # [P, d/2] complex64 (float32 stacks)
            self.cos = torch.stack((c, c), dim=-1).reshape(size, -1).to(self.dtype)
            self.sin = torch.stack((-s, s), dim=-1).reshape(size, -1).to(self.dtype)
            self._max_pos = size

    def new_cache(self, length: int, batch: int = 1) -> KVCache:
        """A zeroed cache of ``batch`` rows by ``length`` positions (the last one is scratch)."""
        self.ensure_positions(length)
        shape = (self.n_layers, batch, length, 2 * self.n_kv, self.head_dim)
        return KVCache(kv=torch.zeros(shape, device=self.device, dtype=self.dtype))

    def _inv_rms(self, x: Tensor) -> Tensor:
        """``1/sqrt(mean(x^2) + eps)`` over the last dim (keepdim), in float32, cast back."""
        n = torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=torch.float32)
        r = torch.addcmul(self.eps_t, n, n, value=1.0 / x.shape[-1]).rsqrt_()
        return r if x.dtype == torch.float32 else r.to(x.dtype)

    def forward(
        self,
        x: Tensor,
        pos: Tensor,
        cache: KVCache,
        kv_len: int | None = None,
        lengths: Tensor | None = None,
        rows: Tensor | None = None,
    ) -> Tensor:
        """Rows ``x [B, L, H]``: row ``b`` at positions ``pos[b]..pos[b]+L-1`` of cache row ``b``.

        Returns the final-normed ``[B, L, H]``. Keys and values are written to the
        cache, then each query attends to its own row's positions ``<=`` its own.
        ``kv_len`` bounds the keys read (default: the largest ``pos + L``; a CUDA
        graph passes the whole cache so that shapes stay static). ``lengths[b]``
        (default ``L``) is how many rows of batch row ``b`` are real: the others only
        pad (several prompts of different lengths in one call; a length of 0 pads a
        whole batch row) and write to the scratch position; their outputs are
        meaningless but finite. ``rows`` names the cache rows of the batch rows
        (default ``0..B-1``: ``cache`` is then read as a view; with ``rows`` the keys
        are gathered, which suits prefill, not decode). The caller guarantees
        ``pos + length <= cache.length - 1``; nothing here syncs with the host.
        """
        bsz, seq, _ = x.shape
        kv = cache.kv
        if kv_len is None:
            kv_len = int(pos.max()) + seq
        hd, nh, nkv = self.head_dim, self.n_heads, self.n_kv
        qd, kd, ffn = self.q_dim, self.kv_dim, self.ffn
        steps = torch.arange(seq, device=x.device)
        qpos = pos[:, None] + steps[None, :]  # [B, L]
        wpos = qpos
        if lengths is not None:
            wpos = torch.where(steps[None, :] < lengths[:, None], qpos, cache.length - 1)
        if rows is None:
            brow = torch.arange(bsz, device=x.device)[:, None].expand(bsz, seq)
        else:
            brow = rows[:, None].expand(bsz, seq)
        keys = torch.arange(kv_len, device=x.device)
        mask = (keys[None, None, :] <= qpos[:, :, None]).unsqueeze(1)  # [B, 1, L, T]
        rpos = qpos.clamp_max(self._max_pos - 1)  # padding rows may run past the tables
        if self.dtype == torch.float32:  # RoPE as one complex multiply
            cis = self.cis[rpos].unsqueeze(2)  # [B, L, 1, d/2]
        else:
            cos = self.cos[rpos].unsqueeze(2)  # [B, L, 1, d]
            sin = self.sin[rpos].unsqueeze(2)
        x = x.reshape(bsz * seq, -1)  # the linear parts run on 2-D rows
        mm = torch.mm
        for li, ly in enumerate(self.layers):
            qkv = mm(x, ly.wqkv).mul_(self._inv_rms(x))
            qk = qkv[:, : qd + kd].view(bsz, seq, nh + nkv, hd)
            z = qk * ly.qk_norm
            if self.dtype == torch.float32:
                zc = torch.view_as_complex(z.view(bsz, seq, nh + nkv, -1, 2))
                rot = torch.view_as_real(zc * cis).view(z.shape)
            else:
                swap = z.view(bsz, seq, nh + nkv, -1, 2).flip(-1).view(z.shape)
                rot = torch.addcmul(z * cos, swap, sin)
            qk = rot.mul_(self._inv_rms(qk))
            new = torch.cat((qk[:, :, nh:], qkv[:, qd + kd :].view(bsz, seq, nkv, hd)), 2)
            layer_kv = kv[li]
            layer_kv[brow, wpos] = new
            past = layer_kv[:, :kv_len] if rows is None else layer_kv[rows, :kv_len]
            attn = F.scaled_dot_product_attention(
                qk[:, :, :nh].transpose(1, 2),
                past[:, :, :nkv].transpose(1, 2),
                past[:, :, nkv:].transpose(1, 2),
                attn_mask=mask,
                scale=1.0,
                enable_gqa=self.gqa,
            )
            x = torch.addmm(x, attn.transpose(1, 2).reshape(bsz * seq, qd), ly.wo)
            gu = mm(x, ly.w_gate_up).mul_(self._inv_rms(x))
            x = torch.addmm(x, F.silu(gu[:, :ffn]).mul_(gu[:, ffn:]), ly.w_down)
        return (x * self._inv_rms(x) * self.norm).view(bsz, seq, -1)
