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


def _rope_complex(z: Tensor, cis: Tensor) -> Tensor:
    zc = torch.view_as_complex(z.view(*z.shape[:-1], -1, 2))
    return torch.view_as_real(zc * cis).view(z.shape)


def _rope_real(z: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    swap = z.view(*z.shape[:-1], -1, 2).flip(-1).view(z.shape)
    return torch.addcmul(z * cos, swap, sin)


@dataclass
class KVCache:
    """Preallocated keys and values, position-major: ``[layers, length, 2 * kv_heads, head_dim]``.

    Row ``kv[l, p]`` holds the keys (first ``kv_heads`` rows) and then the
    values of position ``p``, so a decode step writes both with one copy.
    """

    kv: Tensor

    @property
    def length(self) -> int:
        return int(self.kv.shape[1])


@dataclass
class _Layer:
    wqkv: Tensor  # [H, q+k+v]: attn_norm folded in, pre-transposed for ``mm``/``addmm``
    qk_norm: Tensor  # [n_heads + n_kv_heads, head_dim]: q_norm rows (x 1/sqrt(d)), k_norm rows
    wo: Tensor  # [q, H]
    w_gate_up: Tensor  # [H, 2F]: ffn_norm folded in
    w_down: Tensor  # [F, H]


class DecoderStack:
    """A Qwen3 decoder stack over one sequence (batch 1), with an explicit KV cache.

    Per layer the work is: one fused q|k|v matmul, one RMSNorm over all q and k
    heads at once, RoPE as ``x*cos + roll(x)*sin'`` (rotate-half), one cache
    write for k and v, attention, and a fused gate|up SwiGLU. The RMSNorm
    weights that precede a matmul are folded into it (the per-row ``1/rms`` is a
    scalar, so it is applied to the product), the attention scale and the q/k
    norm weights are folded into the RoPE factors, and residual adds ride on
    ``addmm``: one decode row costs about 20 small kernels per layer, which is
    what bounds tiny models. Multi-row chunks (prefill) use SDPA.
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

        def folded(w: np.ndarray, norm: np.ndarray) -> Tensor:
            # linear(norm_w * xn, W) == linear(xn, W * norm_w): W [out, in] -> [in, out]
            f = np.asarray(w, dtype=np.float32) * np.asarray(norm, dtype=np.float32)[None, :]
            return t(np.ascontiguousarray(f.T))

        half = head_dim // 2
        # RoPE pairs (i, i + d/2) are made adjacent by permuting the q and k rows of every
        # head alike: q.k is invariant, and RoPE becomes a complex multiply.
        perm = np.stack([np.arange(half), np.arange(half) + half], axis=1).reshape(-1)

        def heads(w: np.ndarray, n: int) -> np.ndarray:
            w = np.asarray(w, np.float32)
            return w.reshape(n, head_dim, -1)[:, perm].reshape(n * head_dim, -1)

        self.layers = []
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
        self.eps_t = torch.tensor(eps, device=device, dtype=dtype)
        self._max_pos = 0
        self.cos = self.sin = self.cis = torch.empty(0)
        self.ensure_positions(max_positions)

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    def ensure_positions(self, n: int) -> None:
        if n > self._max_pos:
            size = max(n, 2 * self._max_pos)
            cos, sin = rope_tables(self.head_dim, self.theta, size, self.device, torch.float32)
            half = self.head_dim // 2
            c, s = cos[:, :half], sin[:, :half]
            # interleaved pairs (a, b) -> (a*c - b*s, b*c + a*s)
            self.cis = torch.complex(c, s)  # [P, d/2] complex64 (float32 path)
            self.cos = torch.stack((c, c), dim=-1).reshape(size, -1).to(self.dtype)
            self.sin = torch.stack((-s, s), dim=-1).reshape(size, -1).to(self.dtype)
            self._max_pos = size

    def rope(self, z: Tensor, pos: int, end: int) -> Tensor:
        """RoPE on interleaved pairs of ``z [..., heads, d]`` for rows at ``pos..end-1``."""
        one = end == pos + 1 and z.dim() == 2
        if z.dtype == torch.float32:
            return _rope_complex(z, self.cis[pos] if one else self.cis[pos:end, None])
        if one:
            return _rope_real(z, self.cos[pos], self.sin[pos])
        return _rope_real(z, self.cos[pos:end, None], self.sin[pos:end, None])

    def new_cache(self, length: int) -> KVCache:
        self.ensure_positions(length)
        shape = (self.n_layers, length, 2 * self.n_kv, self.head_dim)
        return KVCache(kv=torch.zeros(shape, device=self.device, dtype=self.dtype))

    def inv_rms(self, x: Tensor) -> Tensor:
        """``1/sqrt(mean(x^2) + eps)`` over the last dim (keepdim)."""
        n = torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=torch.float32)
        r = torch.addcmul(self.eps_t.float(), n, n, value=1.0 / x.shape[-1]).rsqrt_()
        return r if x.dtype == torch.float32 else r.to(x.dtype)

    def final_norm(self, x: Tensor) -> Tensor:
        return x * self.inv_rms(x) * self.norm

    def forward(self, x: Tensor, pos: int, cache: KVCache) -> Tensor:
        """Run rows ``x [L, H]`` at positions ``pos..pos+L-1``; return the normed ``[L, H]``."""
        seq = x.shape[0]
        end = pos + seq
        if end > cache.length:
            raise ValueError(f"KV cache of {cache.length} positions is full (need {end})")
        if seq == 1:
            return self.step(x, pos, cache)
        if pos == 0:
            mask: Tensor | None = None
            causal = True
        else:
            i = torch.arange(seq, device=x.device)[:, None]
            j = torch.arange(end, device=x.device)[None, :]
            mask, causal = j <= (i + pos), False
        hd, nh, nkv = self.head_dim, self.n_heads, self.n_kv
        qd, kd, ffn = self.q_dim, self.kv_dim, self.ffn
        kv = cache.kv
        for li, ly in enumerate(self.layers):
            qkv = torch.mm(x, ly.wqkv).mul_(self.inv_rms(x))
            qk = qkv[:, : qd + kd].view(seq, nh + nkv, hd)
            qk = self.rope(qk * ly.qk_norm, pos, end).mul_(self.inv_rms(qk))
            kv[li, pos:end, :nkv] = qk[:, nh:]
            kv[li, pos:end, nkv:] = qkv[:, qd + kd :].view(seq, nkv, hd)
            attn = F.scaled_dot_product_attention(
                qk[:, :nh].transpose(0, 1).unsqueeze(0),
                kv[li, :end, :nkv].transpose(0, 1).unsqueeze(0),
                kv[li, :end, nkv:].transpose(0, 1).unsqueeze(0),
                attn_mask=mask,
                is_causal=causal,
                scale=1.0,
                enable_gqa=self.gqa,
            )
            x = torch.addmm(x, attn[0].transpose(0, 1).reshape(seq, qd), ly.wo)
            gu = torch.mm(x, ly.w_gate_up).mul_(self.inv_rms(x))
            x = torch.addmm(x, F.silu(gu[:, :ffn]).mul_(gu[:, ffn:]), ly.w_down)
        return self.final_norm(x)

    def step(self, x: Tensor, pos: int, cache: KVCache) -> Tensor:
        """One row ``x [1, H]`` at position ``pos`` (no bounds check); the normed ``[1, H]``.

        The same maths as ``forward`` with the per-kernel overhead cut: the row
        norms are one ``addmm`` (``eps + x.x/H``) and one ``rsqrt_``, k and v go
        to the cache with one ``cat``, and attention is two ``bmm`` and a softmax
        (one query row: cheaper than the SDPA kernel's setup).
        """
        hd, nh, nkv = self.head_dim, self.n_heads, self.n_kv
        qd, kd, ffn = self.q_dim, self.kv_dim, self.ffn
        group = nh // nkv
        end = pos + 1
        rope = self.rope
        eps = self.eps_t
        inv_h = 1.0 / x.shape[-1]
        inv_d = 1.0 / hd
        kv = cache.kv
        mm, addmm, bmm, baddbmm = torch.mm, torch.addmm, torch.bmm, torch.baddbmm
        for li, ly in enumerate(self.layers):
            r = addmm(eps, x, x.t(), alpha=inv_h).rsqrt_()
            qkv = mm(x, ly.wqkv).mul_(r)
            qk = qkv[0, : qd + kd].view(nh + nkv, hd)
            rq = baddbmm(eps, qk.unsqueeze(1), qk.unsqueeze(2), alpha=inv_d).rsqrt_().view(-1, 1)
            qk = rope(qk * ly.qk_norm, pos, end).mul_(rq)
            layer_kv = kv[li]
            torch.cat((qk[nh:], qkv[0, qd + kd :].view(nkv, hd)), out=layer_kv[pos])
            past = layer_kv[:end]
            p = bmm(qk[:nh].view(nkv, group, hd), past[:, :nkv].permute(1, 2, 0)).softmax(-1)
            o = bmm(p, past[:, nkv:].transpose(0, 1)).view(1, qd)
            x = addmm(x, o, ly.wo)
            r = addmm(eps, x, x.t(), alpha=inv_h).rsqrt_()
            gu = mm(x, ly.w_gate_up).mul_(r)
            x = addmm(x, F.silu(gu[:, :ffn]).mul_(gu[:, ffn:]), ly.w_down)
        r = addmm(eps, x, x.t(), alpha=inv_h).rsqrt_()
        return x.mul(r).mul_(self.norm)

    def step_at(self, x: Tensor, pos: Tensor, cache: KVCache, bias: Tensor) -> Tensor:
        """``step`` with the position in a device tensor ``pos [1]`` (CUDA-graph capturable).

        Attention runs over the whole cache with ``bias [length]`` added to the scores
        (0 up to ``pos``, -inf after it); the cache row is written with ``index_copy_``.
        """
        hd, nh, nkv = self.head_dim, self.n_heads, self.n_kv
        qd, kd, ffn = self.q_dim, self.kv_dim, self.ffn
        group = nh // nkv
        eps = self.eps_t
        inv_h = 1.0 / x.shape[-1]
        inv_d = 1.0 / hd
        kv = cache.kv
        if self.dtype == torch.float32:
            cis = self.cis.index_select(0, pos)
        else:
            cos, sin = self.cos.index_select(0, pos), self.sin.index_select(0, pos)
        bias = bias.to(self.dtype)
        mm, addmm, bmm, baddbmm = torch.mm, torch.addmm, torch.bmm, torch.baddbmm
        for li, ly in enumerate(self.layers):
            r = addmm(eps, x, x.t(), alpha=inv_h).rsqrt_()
            qkv = mm(x, ly.wqkv).mul_(r)
            qk = qkv[0, : qd + kd].view(nh + nkv, hd)
            rq = baddbmm(eps, qk.unsqueeze(1), qk.unsqueeze(2), alpha=inv_d).rsqrt_().view(-1, 1)
            z = qk * ly.qk_norm
            qk = _rope_complex(z, cis) if z.dtype == torch.float32 else _rope_real(z, cos, sin)
            qk = qk.mul_(rq)
            layer_kv = kv[li]
            row = torch.cat((qk[nh:], qkv[0, qd + kd :].view(nkv, hd))).unsqueeze(0)
            layer_kv.index_copy_(0, pos, row)
            q = qk[:nh].view(nkv, group, hd)
            p = baddbmm(bias, q, layer_kv[:, :nkv].permute(1, 2, 0)).softmax(-1)
            o = bmm(p, layer_kv[:, nkv:].transpose(0, 1)).view(1, qd)
            x = addmm(x, o, ly.wo)
            r = addmm(eps, x, x.t(), alpha=inv_h).rsqrt_()
            gu = mm(x, ly.w_gate_up).mul_(r)
            x = addmm(x, F.silu(gu[:, :ffn]).mul_(gu[:, ffn:]), ly.w_down)
        r = addmm(eps, x, x.t(), alpha=inv_h).rsqrt_()
        return x.mul(r).mul_(self.norm)


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


class NumpyStep:
    """``DecoderStack.step`` in numpy, for small widths on the CPU (float32 only).

    For tiny models every kernel is a few dozen flops, so the cost is the per-call
    overhead, and a numpy call costs about a third of a torch one: the code
    predictor's 14 single-row steps per frame run here (about 2x faster per step
    at width 32). Same maths and weights (views of the torch tensors) as ``step``.
    """

    def __init__(self, stack: DecoderStack) -> None:
        if stack.dtype != torch.float32 or stack.device.type != "cpu":
            raise ValueError("NumpyStep needs a float32 CPU stack")
        self.layers = [
            (
                ly.wqkv.numpy(),
                ly.qk_norm.numpy(),
                ly.wo.numpy(),
                ly.w_gate_up.numpy(),
                ly.w_down.numpy(),
            )
            for ly in stack.layers
        ]
        self.cis = stack.cis.numpy()
        self.norm = stack.norm.numpy()
        self.eps = np.float32(stack.eps)
        self.inv_h = np.float32(1.0 / stack.width)
        self.inv_d = np.float32(1.0 / stack.head_dim)
        self.dims = (stack.head_dim, stack.n_heads, stack.n_kv, stack.q_dim, stack.kv_dim)
        self.ffn = stack.ffn

    def __call__(self, x: np.ndarray, pos: int, kv: np.ndarray) -> np.ndarray:
        """One row ``x [H]`` at ``pos``, cache ``kv`` (``KVCache.kv.numpy()``); normed ``[H]``."""
        hd, nh, nkv, qd, kd = self.dims
        group = nh // nkv
        ffn, eps, inv_h, inv_d = self.ffn, self.eps, self.inv_h, self.inv_d
        end = pos + 1
        cis = self.cis[pos]
        matmul, sqrt, exp, tanh = np.matmul, np.sqrt, np.exp, np.tanh
        half = np.float32(0.5)
        for li, (wqkv, qkn, wo, wgu, wd) in enumerate(self.layers):
            qkv = (x @ wqkv) * (1 / sqrt(x.dot(x) * inv_h + eps))
            qk = qkv[: qd + kd].reshape(nh + nkv, hd)
            rq = 1 / sqrt(np.einsum("ij,ij->i", qk, qk) * inv_d + eps)
            z = ((qk * qkn).view(np.complex64) * cis).view(np.float32) * rq[:, None]
            layer_kv = kv[li]
            layer_kv[pos, :nkv] = z[nh:]
            layer_kv[pos, nkv:] = qkv[qd + kd :].reshape(nkv, hd)
            s = matmul(z[:nh].reshape(nkv, group, hd), layer_kv[:end, :nkv].transpose(1, 2, 0))
            s = exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            x = x + matmul(s, layer_kv[:end, nkv:].transpose(1, 0, 2)).reshape(qd) @ wo
            gu = (x @ wgu) * (1 / sqrt(x.dot(x) * inv_h + eps))
            a = gu[:ffn] * half
            x = x + (a * (1 + tanh(a)) * gu[ffn:]) @ wd  # silu(g) = g/2 * (1 + tanh(g/2))
        return x * (1 / sqrt(x.dot(x) * inv_h + eps)) * self.norm
