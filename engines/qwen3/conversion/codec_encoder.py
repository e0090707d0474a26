"""The 12 Hz codec's encoder (Mimi-style) as a compact torch module, for reference codes (ICL).

Loads the ``encoder.*`` tensors of an official ``speech_tokenizer/`` (the
official class is a ``transformers`` ``MimiModel`` without its decoder) under
their official names; ``qwen3-convert`` exports it to
``qwen3-tts-codec-encoder.onnx``: input ``audio`` float32 ``[1, 1, S]`` at
24 kHz with S a multiple of 1920 (the caller zero-pads), output ``codes``
int64 ``[1, 16, S/1920]``. Checked against the official
``Qwen3TTSTokenizerV2Model.encode`` with committed golden data.

Pipeline: SEANet encoder (causal convs, ELU, residual blocks, strided
downsampling by 4*5*6*8 = 960) -> transformer (LayerNorm, RoPE, causal
attention over all earlier frames as the official eager/SDPA path does, GELU
MLP, layer scale) -> causal strided conv (25 -> 12.5 Hz, replicate padding) ->
split residual VQ encode (1 semantic + 15 acoustic codebooks, nearest
codeword by Euclidean distance). With the input a multiple of 1920 samples no
convolution needs the data-dependent right padding, so the graph has no shape
arithmetic and the sample axis stays dynamic; since everything is causal,
padding only touches the last frame.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn
from torch.nn import functional as F

from engines.qwen3.conversion.codec_decoder import Attention, TransformerLayer
from engines.qwen3.errors import ConversionError

HOP = 1920


@dataclass(frozen=True)
class EncoderConfig:
    """The ``encoder_config`` (a ``MimiConfig``) fields that shape the encoder."""

    audio_channels: int = 1
    hidden_size: int = 512
    num_filters: int = 64
    num_residual_layers: int = 1
    upsampling_ratios: tuple[int, ...] = (8, 6, 5, 4)
    kernel_size: int = 7
    last_kernel_size: int = 3
    residual_kernel_size: int = 3
    dilation_growth_rate: int = 2
    compress: int = 2
    use_conv_shortcut: bool = False
    pad_mode: str = "constant"
    codebook_size: int = 2048
    codebook_dim: int = 256
    vq_hidden: int = 256
    num_quantizers: int = 32
    num_semantic_quantizers: int = 1
    num_hidden_layers: int = 8
    intermediate_size: int = 2048
    num_attention_heads: int = 8
    num_key_value_heads: int = 8
    head_dim: int = 64
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    frame_rate: float = 12.5
    sampling_rate: int = 24000
    valid_quantizers: int = 16

    @classmethod
    def from_dict(cls, d: dict[str, Any], valid_quantizers: int = 16) -> EncoderConfig:
        b = cls()
        hidden = int(d.get("hidden_size", b.hidden_size))
        heads = int(d.get("num_attention_heads", b.num_attention_heads))

        def g(k: str, default: Any) -> Any:
            v = d.get(k)
            return default if v is None else v

        return cls(
            audio_channels=int(g("audio_channels", 1)),
            hidden_size=hidden,
            num_filters=int(g("num_filters", b.num_filters)),
            num_residual_layers=int(g("num_residual_layers", 1)),
            upsampling_ratios=tuple(int(x) for x in g("upsampling_ratios", b.upsampling_ratios)),
            kernel_size=int(g("kernel_size", 7)),
            last_kernel_size=int(g("last_kernel_size", 3)),
            residual_kernel_size=int(g("residual_kernel_size", 3)),
            dilation_growth_rate=int(g("dilation_growth_rate", 2)),
            compress=int(g("compress", 2)),
            use_conv_shortcut=bool(g("use_conv_shortcut", False)),
            pad_mode=str(g("pad_mode", "constant")),
            codebook_size=int(g("codebook_size", 2048)),
            codebook_dim=int(g("codebook_dim", hidden)),
            vq_hidden=int(g("vector_quantization_hidden_dimension", 256)),
            num_quantizers=int(g("num_quantizers", 32)),
            num_semantic_quantizers=int(g("num_semantic_quantizers", 1)),
            num_hidden_layers=int(g("num_hidden_layers", 8)),
            intermediate_size=int(g("intermediate_size", 2048)),
            num_attention_heads=heads,
            num_key_value_heads=int(g("num_key_value_heads", heads)),
            head_dim=int(g("head_dim", hidden // heads)),
            norm_eps=float(g("norm_eps", 1e-5)),
            rope_theta=float(g("rope_theta", 10000.0)),
            frame_rate=float(g("frame_rate", 12.5)),
            sampling_rate=int(g("sampling_rate", 24000)),
            valid_quantizers=valid_quantizers,
        )


class MConv(nn.Module):
    """Causal Conv1d: ``kernel_eff - stride`` samples of left padding (no right padding)."""

    def __init__(
        self, cin: int, cout: int, k: int, stride: int = 1, dilation: int = 1, *, bias: bool = True,
        mode: str = "constant",
    ):  # fmt: skip
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, k, stride, dilation=dilation, bias=bias)
        self.left = (k - 1) * dilation + 1 - stride
        self.mode = mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, (self.left, 0), mode=self.mode))


class ResBlock(nn.Module):
    def __init__(self, c: EncoderConfig, dim: int, dilation: int):
        super().__init__()
        hidden = dim // c.compress
        self.block = nn.ModuleList(
            [
                nn.ELU(),
                MConv(dim, hidden, c.residual_kernel_size, dilation=dilation, mode=c.pad_mode),
                nn.ELU(),
                MConv(hidden, dim, 1, mode=c.pad_mode),
            ]
        )
        self.shortcut: nn.Module = (
            MConv(dim, dim, 1, mode=c.pad_mode) if c.use_conv_shortcut else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        for m in self.block:
            h = m(h)
        return self.shortcut(x) + h


class SeaNet(nn.Module):
    def __init__(self, c: EncoderConfig):
        super().__init__()
        layers: list[nn.Module] = [MConv(c.audio_channels, c.num_filters, c.kernel_size)]
        scale = 1
        for ratio in reversed(c.upsampling_ratios):
            dim = scale * c.num_filters
            for j in range(c.num_residual_layers):
                layers.append(ResBlock(c, dim, c.dilation_growth_rate**j))
            layers += [nn.ELU(), MConv(dim, 2 * dim, 2 * ratio, stride=ratio, mode=c.pad_mode)]
            scale *= 2
        layers += [nn.ELU(), MConv(scale * c.num_filters, c.hidden_size, c.last_kernel_size)]
        self.layers = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for m in self.layers:
            x = m(x)
        return x


class _Mlp(nn.Module):
    def __init__(self, c: EncoderConfig):
        super().__init__()
        self.fc1 = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.fc2 = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


def encoder_layer(c: EncoderConfig) -> TransformerLayer:
    attn = Attention(
        c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim, bias=False
    )
    return TransformerLayer(
        c.hidden_size, attn, _Mlp(c), lambda: nn.LayerNorm(c.hidden_size, eps=c.norm_eps)
    )


class MTransformer(nn.Module):
    inv_freq: torch.Tensor

    def __init__(self, c: EncoderConfig):
        super().__init__()
        self.layers = nn.ModuleList([encoder_layer(c) for _ in range(c.num_hidden_layers)])
        inv = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2).float() / c.head_dim))
        self.register_buffer("inv_freq", inv, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        pos = torch.arange(t, device=x.device, dtype=torch.float32)
        freqs = pos[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]
        bias = torch.where(pos[:, None] >= pos[None, :], 0.0, float("-inf"))[None, None]
        for layer in self.layers:
            x = layer(x, cos, sin, bias)
        return x


class _Book(nn.Module):
    cluster_usage: torch.Tensor
    embed_sum: torch.Tensor

    def __init__(self, size: int, dim: int):
        super().__init__()
        self.register_buffer("initialized", torch.ones(1))
        self.register_buffer("cluster_usage", torch.ones(size))
        self.register_buffer("embed_sum", torch.zeros(size, dim))


class _VQ(nn.Module):
    def __init__(self, size: int, dim: int):
        super().__init__()
        self.codebook = _Book(size, dim)


class MRVQ(nn.Module):
    def __init__(self, c: EncoderConfig, n: int):
        super().__init__()
        self.layers = nn.ModuleList([_VQ(c.codebook_size, c.codebook_dim) for _ in range(n)])
        self.input_proj: nn.Module | None = None
        self.output_proj: nn.Module | None = None
        if c.vq_hidden != c.hidden_size:
            self.input_proj = nn.Conv1d(c.hidden_size, c.vq_hidden, 1, bias=False)
            self.output_proj = nn.Conv1d(c.vq_hidden, c.hidden_size, 1, bias=False)

    def encode(self, x: torch.Tensor, n: int) -> list[torch.Tensor]:  # [B,C,T] -> n x [B,T]
        if self.input_proj is not None:
            x = self.input_proj(x)
        r = x.transpose(1, 2)  # [B,T,D]
        codes = []
        for layer in list(self.layers)[:n]:
            book = cast(_Book, cast(_VQ, layer).codebook)
            table = book.embed_sum / book.cluster_usage.clamp(min=1e-5)[:, None]  # [K,D]
            d = (r * r).sum(-1, keepdim=True) - 2.0 * r @ table.T + (table * table).sum(-1)[None]
            idx = d.argmin(dim=-1)
            codes.append(idx)
            r = r - F.embedding(idx, table)
        return codes


class MSplitRVQ(nn.Module):
    def __init__(self, c: EncoderConfig):
        super().__init__()
        ns = c.num_semantic_quantizers
        self.semantic_residual_vector_quantizer = MRVQ(c, ns)
        self.acoustic_residual_vector_quantizer = MRVQ(c, c.num_quantizers - ns)
        self.ns = ns

    def encode(self, x: torch.Tensor, n: int) -> torch.Tensor:
        codes = self.semantic_residual_vector_quantizer.encode(x, self.ns)
        if n > self.ns:
            codes += self.acoustic_residual_vector_quantizer.encode(x, n - self.ns)
        return torch.stack(codes, dim=1)  # [B,n,T]


class CodecEncoder(nn.Module):
    """Audio ``[B,1,S]`` (S a multiple of 1920) -> codes ``[B,16,S/1920]`` int64."""

    def __init__(self, c: EncoderConfig):
        super().__init__()
        self.config = c
        self.encoder = SeaNet(c)
        self.encoder_transformer = MTransformer(c)
        encodec_rate = c.sampling_rate / float(torch.tensor(c.upsampling_ratios).prod())
        k = 2 * int(encodec_rate / c.frame_rate)
        self.downsample = MConv(
            c.hidden_size, c.hidden_size, k, stride=2, bias=False, mode="replicate"
        )
        self.quantizer = MSplitRVQ(c)

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        h = self.encoder(audio)
        h = self.encoder_transformer(h.transpose(1, 2)).transpose(1, 2)
        h = self.downsample(h)
        return self.quantizer.encode(h, self.config.valid_quantizers)


def load_encoder(st_dir: str | Path) -> CodecEncoder:
    """The codec encoder of an official ``speech_tokenizer/`` directory, fp32, eval mode."""
    from engines.qwen3.conversion.codec_decoder import load_codec_tensors, read_codec_config

    d = Path(st_dir)
    cfg = read_codec_config(d)
    enc_cfg = cfg.get("encoder_config")
    if not isinstance(enc_cfg, dict):
        raise ConversionError(f"{d / 'config.json'}: no encoder_config")
    c = EncoderConfig.from_dict(enc_cfg, int(cfg.get("encoder_valid_num_quantizers", 16)))
    if c.sampling_rate / float(torch.tensor(c.upsampling_ratios).prod()) * 1 != 2 * c.frame_rate:
        raise ConversionError(f"{d}: encoder frame rates do not give 12.5 Hz codes")
    model = CodecEncoder(c)
    state = load_codec_tensors(d, "encoder.")
    if not state:
        raise ConversionError(f"{d}: no encoder.* tensors in the safetensors files")
    missing, unexpected = model.load_state_dict(state, strict=False)
    # The acoustic RVQ's output projections and codebooks beyond the valid 16 are unused.
    unexpected = [u for u in unexpected if "output_proj" not in u]
    if missing or unexpected:
        raise ConversionError(
            f"{d}: encoder tensors do not match the 12 Hz codec layout: "
            f"missing={missing[:5]} unexpected={unexpected[:5]}"
        )
    return model.eval()
