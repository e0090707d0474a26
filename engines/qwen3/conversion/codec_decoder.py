"""The Qwen3-TTS 12 Hz codec decoder as a compact torch module (convert time only).

It loads the ``decoder.*`` tensors of an official ``speech_tokenizer/``
checkpoint under their official names and exists so that ``qwen3-convert``
can export ``qwen3-tts-vocoder.onnx`` without the official ``qwen-tts``
package. Written from the published architecture (the official checkpoint's codec config);
its output is checked against the official ``Qwen3TTSTokenizerV2Decoder`` with
committed golden data (tests/test_qwen3_codec_parity.py).

Pipeline, codes ``[B,16,T]`` -> audio ``[B,1,T*1920]``:
split RVQ decode (1 semantic + 15 acoustic codebooks, summed, 1x1 output
projections) -> causal conv k3 -> pre-transformer (RMSNorm, RoPE, sliding
window attention, SwiGLU, layer scale) -> two (transposed conv + ConvNeXt)
upsamplers -> conv k7 -> decoder blocks (SnakeBeta, causal transposed conv,
three dilated residual units) -> SnakeBeta -> conv k7 -> clamp [-1, 1].
Every convolution of the decoder has stride 1 or is a transposed conv, so
"causal" is plain left padding and the graph has no shape arithmetic: the
code-length axis stays dynamic in the ONNX export.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn
from torch.nn import functional as F

from engines.qwen3.errors import ConversionError


@dataclass(frozen=True)
class DecoderConfig:
    """The ``decoder_config`` fields of ``speech_tokenizer/config.json`` that shape the graph."""

    codebook_size: int = 2048
    codebook_dim: int = 512
    hidden_size: int = 512
    latent_dim: int = 1024
    num_attention_heads: int = 16
    num_key_value_heads: int = 16
    head_dim: int = 64
    intermediate_size: int = 1024
    num_hidden_layers: int = 8
    num_quantizers: int = 16
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    sliding_window: int = 72
    attention_bias: bool = False
    upsample_rates: tuple[int, ...] = (8, 5, 4, 3)
    upsampling_ratios: tuple[int, ...] = (2, 2)
    decoder_dim: int = 1536

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DecoderConfig:
        heads = int(d.get("num_attention_heads", 16))
        hidden = int(d.get("hidden_size", 512))
        return cls(
            codebook_size=int(d.get("codebook_size", 2048)),
            codebook_dim=int(d.get("codebook_dim", 512)),
            hidden_size=hidden,
            latent_dim=int(d.get("latent_dim", 1024)),
            num_attention_heads=heads,
            num_key_value_heads=int(d.get("num_key_value_heads", heads)),
            head_dim=int(d.get("head_dim") or hidden // heads),
            intermediate_size=int(d.get("intermediate_size", 1024)),
            num_hidden_layers=int(d.get("num_hidden_layers", 8)),
            num_quantizers=int(d.get("num_quantizers", 16)),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-5)),
            rope_theta=float(d.get("rope_theta", 10000.0)),
            sliding_window=int(d.get("sliding_window", 72)),
            attention_bias=bool(d.get("attention_bias", False)),
            upsample_rates=tuple(int(x) for x in d.get("upsample_rates", (8, 5, 4, 3))),
            upsampling_ratios=tuple(int(x) for x in d.get("upsampling_ratios", (2, 2))),
            decoder_dim=int(d.get("decoder_dim", 1536)),
        )

    @property
    def samples_per_frame(self) -> int:
        return math.prod(self.upsample_rates) * math.prod(self.upsampling_ratios)


# -- building blocks (parameter names follow the official checkpoint) -----------------------


class CausalConv(nn.Module):
    """Conv1d (stride 1) with all padding on the left."""

    def __init__(self, cin: int, cout: int, kernel: int, dilation: int = 1, groups: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, dilation=dilation, groups=groups)
        self.left = (kernel - 1) * dilation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, (self.left, 0)))


class CausalTransConv(nn.Module):
    """ConvTranspose1d whose overhang (kernel - stride) is cut on the right."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int):
        super().__init__()
        self.conv = nn.ConvTranspose1d(cin, cout, kernel, stride=stride)
        self.cut = kernel - stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return y[..., : y.shape[-1] - self.cut] if self.cut > 0 else y


class ConvNeXt(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = CausalConv(dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.dwconv(x).transpose(1, 2)
        h = self.pwconv2(F.gelu(self.pwconv1(self.norm(h))))
        return x + (self.gamma * h).transpose(1, 2)


class Snake(nn.Module):
    """SnakeBeta: ``x + sin(x * e^alpha)^2 / (e^beta + 1e-9)`` per channel."""

    def __init__(self, dim: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(dim))
        self.beta = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = torch.exp(self.alpha)[None, :, None]
        b = torch.exp(self.beta)[None, :, None]
        return x + torch.sin(x * a).pow(2) / (b + 1e-9)


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int):
        super().__init__()
        self.act1 = Snake(dim)
        self.conv1 = CausalConv(dim, dim, 7, dilation=dilation)
        self.act2 = Snake(dim)
        self.conv2 = CausalConv(dim, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(self.act2(self.conv1(self.act1(x))))


class DecoderBlock(nn.Module):
    def __init__(self, cin: int, cout: int, rate: int):
        super().__init__()
        units: list[nn.Module] = [Snake(cin), CausalTransConv(cin, cout, 2 * rate, rate)]
        units += [ResidualUnit(cout, d) for d in (1, 3, 9)]
        self.block = nn.ModuleList(units)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for m in self.block:
            x = m(x)
        return x


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


class LayerScale(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Attention(nn.Module):
    """Rotary self-attention with grouped KV heads (the codec decoder's and encoder's)."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, bias: bool):
        super().__init__()
        hd, nh, nkv = head_dim, heads, kv_heads
        self.q_proj = nn.Linear(hidden, nh * hd, bias=bias)
        self.k_proj = nn.Linear(hidden, nkv * hd, bias=bias)
        self.v_proj = nn.Linear(hidden, nkv * hd, bias=bias)
        self.o_proj = nn.Linear(nh * hd, hidden, bias=bias)
        self.hd, self.nh, self.nkv = hd, nh, nkv

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, bias: torch.Tensor
    ) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.nh, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.nkv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.nkv, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if self.nkv != self.nh:
            rep = self.nh // self.nkv
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        w = torch.matmul(q, k.transpose(2, 3)) * (self.hd**-0.5) + bias
        o = torch.matmul(torch.softmax(w, dim=-1), v)
        return self.o_proj(o.transpose(1, 2).reshape(b, t, self.nh * self.hd))


class Mlp(nn.Module):
    def __init__(self, c: DecoderConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class TransformerLayer(nn.Module):
    """Pre-norm layer with layer scales; the decoder uses RMSNorm and a gated MLP, the
    encoder (``codec_encoder``) LayerNorm and a GELU MLP."""

    def __init__(
        self,
        hidden: int,
        attn: nn.Module,
        mlp: nn.Module,
        norm: Callable[[], nn.Module],
    ):
        super().__init__()
        self.self_attn = attn
        self.mlp = mlp
        self.input_layernorm = norm()
        self.post_attention_layernorm = norm()
        self.self_attn_layer_scale = LayerScale(hidden)
        self.mlp_layer_scale = LayerScale(hidden)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, bias: torch.Tensor
    ) -> torch.Tensor:
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), cos, sin, bias))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


def decoder_layer(c: DecoderConfig) -> TransformerLayer:
    attn = Attention(
        c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.attention_bias
    )
    return TransformerLayer(
        c.hidden_size, attn, Mlp(c), lambda: RMSNorm(c.hidden_size, c.rms_norm_eps)
    )


class PreTransformer(nn.Module):
    inv_freq: torch.Tensor

    def __init__(self, c: DecoderConfig):
        super().__init__()
        self.layers = nn.ModuleList([decoder_layer(c) for _ in range(c.num_hidden_layers)])
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.input_proj = nn.Linear(c.latent_dim, c.hidden_size)
        self.output_proj = nn.Linear(c.hidden_size, c.latent_dim)
        inv = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2).float() / c.head_dim))
        self.register_buffer("inv_freq", inv, persistent=False)
        self.window = c.sliding_window

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        pos = torch.arange(t, device=x.device, dtype=torch.float32)
        freqs = pos[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]
        # Causal sliding window: query i sees keys j with i - window < j <= i.
        d = pos[:, None] - pos[None, :]
        allowed = (d >= 0) & (d < self.window)
        bias = torch.where(allowed, 0.0, float("-inf"))[None, None]
        h = self.input_proj(x)
        for layer in self.layers:
            h = layer(h, cos, sin, bias)
        return self.output_proj(self.norm(h))


class _Codebook(nn.Module):
    def __init__(self, size: int, dim: int):
        super().__init__()
        self.cluster_usage = nn.Parameter(torch.ones(size))
        self.embedding_sum = nn.Parameter(torch.zeros(size, dim))

    def table(self) -> torch.Tensor:
        return self.embedding_sum / self.cluster_usage.clamp(min=1e-5)[:, None]


class _VQ(nn.Module):
    def __init__(self, size: int, dim: int):
        super().__init__()
        self._codebook = _Codebook(size, dim)


class _VQLayers(nn.Module):
    def __init__(self, n: int, size: int, dim: int):
        super().__init__()
        self.layers = nn.ModuleList([_VQ(size, dim) for _ in range(n)])


class RVQ(nn.Module):
    """Decode side of one residual quantizer group: summed codebook rows, 1x1 projection."""

    def __init__(self, n: int, size: int, dim: int, out_dim: int):
        super().__init__()
        self.vq = _VQLayers(n, size, dim)
        self.output_proj = nn.Conv1d(dim, out_dim, 1, bias=False)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:  # [B,n,T] -> [B,out,T]
        acc = None
        for i, layer in enumerate(self.vq.layers):
            book = cast(_Codebook, layer._codebook)
            e = F.embedding(codes[:, i], book.table())  # [B,T,dim]
            acc = e if acc is None else acc + e
        assert acc is not None
        return self.output_proj(acc.transpose(1, 2))


class SplitRVQ(nn.Module):
    def __init__(self, c: DecoderConfig):
        super().__init__()
        dim = c.codebook_dim // 2
        self.rvq_first = RVQ(1, c.codebook_size, dim, c.codebook_dim)
        self.rvq_rest = RVQ(c.num_quantizers - 1, c.codebook_size, dim, c.codebook_dim)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        return self.rvq_first.decode(codes[:, :1]) + self.rvq_rest.decode(codes[:, 1:])


class CodecDecoder(nn.Module):
    """Codes ``[B,16,T]`` (int64, 0..2047) -> audio ``[B,1,T*1920]`` in [-1, 1]."""

    def __init__(self, c: DecoderConfig):
        super().__init__()
        self.config = c
        self.quantizer = SplitRVQ(c)
        self.pre_conv = CausalConv(c.codebook_dim, c.latent_dim, 3)
        self.pre_transformer = PreTransformer(c)
        self.upsample = nn.ModuleList(
            [
                nn.ModuleList(
                    [CausalTransConv(c.latent_dim, c.latent_dim, f, f), ConvNeXt(c.latent_dim)]
                )
                for f in c.upsampling_ratios
            ]
        )
        dec: list[nn.Module] = [CausalConv(c.latent_dim, c.decoder_dim, 7)]
        for i, rate in enumerate(c.upsample_rates):
            dec.append(DecoderBlock(c.decoder_dim // 2**i, c.decoder_dim // 2 ** (i + 1), rate))
        out_dim = c.decoder_dim // 2 ** len(c.upsample_rates)
        dec += [Snake(out_dim), CausalConv(out_dim, 1, 7)]
        self.decoder = nn.ModuleList(dec)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        h = self.pre_conv(self.quantizer.decode(codes))
        h = self.pre_transformer(h.transpose(1, 2)).transpose(1, 2)
        for pair in self.upsample:
            for m in cast(nn.ModuleList, pair):
                h = m(h)
        for m in self.decoder:
            h = m(h)
        return h.clamp(-1.0, 1.0)


# -- loading ------------------------------------------------------------------------------------


def read_codec_config(st_dir: Path) -> dict[str, Any]:
    path = st_dir / "config.json"
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConversionError(f"{path}: cannot be read as JSON: {exc}") from exc
    if not isinstance(cfg, dict) or "decoder_config" not in cfg:
        raise ConversionError(
            f"{path}: no decoder_config (not a Qwen3-TTS 12 Hz speech tokenizer?)"
        )
    return cfg


def load_codec_tensors(st_dir: Path, prefix: str) -> dict[str, torch.Tensor]:
    """Tensors of ``st_dir/*.safetensors`` named ``prefix...``, prefix cut, as fp32."""
    from safetensors import safe_open

    files = sorted(st_dir.glob("*.safetensors"))
    if not files:
        raise ConversionError(f"{st_dir}: no *.safetensors files")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as sf:
            for k in sf.keys():
                if k.startswith(prefix):
                    out[k[len(prefix) :]] = sf.get_tensor(k).float()
    return out


def load_decoder(st_dir: str | Path) -> CodecDecoder:
    """The codec decoder of an official ``speech_tokenizer/`` directory, fp32, eval mode."""
    d = Path(st_dir)
    cfg = read_codec_config(d)
    model = CodecDecoder(DecoderConfig.from_dict(cfg["decoder_config"]))
    state = load_codec_tensors(d, "decoder.")
    if not state:
        raise ConversionError(f"{d}: no decoder.* tensors in the safetensors files")
    missing, unexpected = model.load_state_dict(state, strict=False)
    # The encoder-side input projections of the quantizer are not used for decoding.
    unexpected = [u for u in unexpected if not u.endswith("input_proj.weight")]
    if missing or unexpected:
        raise ConversionError(
            f"{d}: decoder tensors do not match the 12 Hz codec layout: "
            f"missing={missing[:5]} unexpected={unexpected[:5]}"
        )
    return model.eval()
