"""The Base checkpoints' speaker encoder (ECAPA-TDNN) as a compact torch module, and its mel input.

The torch module loads the ``speaker_encoder.*`` tensors of an official Base
checkpoint under their official names; ``qwen3-convert`` exports it to
``qwen3-tts-{size}-base-speaker-encoder.onnx`` so that cloning needs no torch
checkpoint afterwards. The log-mel features are computed in numpy
(``log_mel``), so that the ONNX graph is only the network: input ``mels``
float32 ``[1, frames, 128]``, output ``xvector`` float32 ``[1, enc_dim]``.
Checked against the official ``Qwen3TTSSpeakerEncoder`` and ``mel_spectrogram``
with committed golden data (tests/test_qwen3_codec_parity.py).

Mel facts (as the official ``qwen_tts`` speaker encoder computes them): 24 kHz, n_fft
1024, hop 256, Hann window 1024, reflect padding of 384 samples per side, no centring,
magnitude
``sqrt(re^2 + im^2 + 1e-9)``, 128 Slaney mel bands 0..12 kHz with Slaney
area normalisation, ``log(max(x, 1e-5))``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
import numpy.typing as npt

SAMPLE_RATE = 24000
N_FFT = 1024
HOP = 256
N_MELS = 128
F_MAX = 12000.0

FloatArray = npt.NDArray[np.float32]


# -- log-mel features (numpy) --------------------------------------------------------------------


def _hz_to_mel(f: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Slaney mel scale: linear below 1 kHz, logarithmic above."""
    f_sp = 200.0 / 3
    mels = f / f_sp
    min_log_hz = 1000.0
    min_log_mel = min_log_hz / f_sp
    logstep = np.log(6.4) / 27.0
    return np.where(
        f >= min_log_hz, min_log_mel + np.log(np.maximum(f, 1e-10) / min_log_hz) / logstep, mels
    )


def _mel_to_hz(m: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    f_sp = 200.0 / 3
    freqs = f_sp * m
    min_log_hz = 1000.0
    min_log_mel = min_log_hz / f_sp
    logstep = np.log(6.4) / 27.0
    return np.where(m >= min_log_mel, min_log_hz * np.exp(logstep * (m - min_log_mel)), freqs)


@lru_cache(maxsize=4)
def mel_filterbank(
    sr: int = SAMPLE_RATE, n_fft: int = N_FFT, n_mels: int = N_MELS, fmax: float = F_MAX
) -> FloatArray:
    """Triangular Slaney-normalised mel filters ``[n_mels, n_fft//2 + 1]`` (fmin 0)."""
    fft_freqs = np.linspace(0.0, sr / 2.0, n_fft // 2 + 1)
    mel_pts = np.linspace(_hz_to_mel(np.array(0.0)), _hz_to_mel(np.array(fmax)), n_mels + 2)
    hz_pts = _mel_to_hz(mel_pts)
    fdiff = np.diff(hz_pts)
    ramps = hz_pts[:, None] - fft_freqs[None, :]
    lower = -ramps[:-2] / fdiff[:-1, None]
    upper = ramps[2:] / fdiff[1:, None]
    weights = np.maximum(0.0, np.minimum(lower, upper))
    enorm = 2.0 / (hz_pts[2 : n_mels + 2] - hz_pts[:n_mels])
    return (weights * enorm[:, None]).astype(np.float32)


def log_mel(audio: npt.ArrayLike) -> FloatArray:
    """Log-mel features ``[frames, 128]`` of 24 kHz mono float audio (at least 385 samples)."""
    y = np.asarray(audio, dtype=np.float64).reshape(-1)
    pad = (N_FFT - HOP) // 2
    if y.shape[0] <= pad:
        raise ValueError(f"audio too short for the mel front end ({y.shape[0]} samples)")
    y = np.pad(y, (pad, pad), mode="reflect")
    n_frames = 1 + (y.shape[0] - N_FFT) // HOP
    if n_frames < 1:
        raise ValueError(f"audio too short for the mel front end ({y.shape[0]} samples)")
    idx = np.arange(N_FFT)[None, :] + HOP * np.arange(n_frames)[:, None]
    window = 0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(N_FFT) / N_FFT)  # periodic Hann
    spec = np.fft.rfft(y[idx] * window[None, :], axis=1)
    mag = np.sqrt(spec.real**2 + spec.imag**2 + 1e-9)
    mel = mel_filterbank().astype(np.float64) @ mag.T  # [n_mels, frames]
    return np.log(np.maximum(mel, 1e-5)).T.astype(np.float32)


# -- the network (torch, convert time only) ------------------------------------------------------


@dataclass(frozen=True)
class SpeakerEncoderConfig:
    mel_dim: int = 128
    enc_dim: int = 1024
    enc_channels: tuple[int, ...] = (512, 512, 512, 512, 1536)
    enc_kernel_sizes: tuple[int, ...] = (5, 3, 3, 3, 1)
    enc_dilations: tuple[int, ...] = (1, 2, 3, 4, 1)
    enc_attention_channels: int = 128
    enc_res2net_scale: int = 8
    enc_se_channels: int = 128
    sample_rate: int = SAMPLE_RATE
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SpeakerEncoderConfig:
        base = cls()

        def tup(k: str, default: tuple[int, ...]) -> tuple[int, ...]:
            return tuple(int(x) for x in d.get(k, default))

        return cls(
            mel_dim=int(d.get("mel_dim", base.mel_dim)),
            enc_dim=int(d.get("enc_dim", base.enc_dim)),
            enc_channels=tup("enc_channels", base.enc_channels),
            enc_kernel_sizes=tup("enc_kernel_sizes", base.enc_kernel_sizes),
            enc_dilations=tup("enc_dilations", base.enc_dilations),
            enc_attention_channels=int(d.get("enc_attention_channels", 128)),
            enc_res2net_scale=int(d.get("enc_res2net_scale", 8)),
            enc_se_channels=int(d.get("enc_se_channels", 128)),
            sample_rate=int(d.get("sample_rate", SAMPLE_RATE)),
        )


def build_speaker_encoder(cfg: SpeakerEncoderConfig) -> Any:
    """An ECAPA-TDNN ``torch.nn.Module``: mels ``[B, frames, mel_dim]`` -> ``[B, enc_dim]``."""
    import torch
    from torch import nn

    def same_conv(cin: int, cout: int, k: int, d: int = 1) -> nn.Conv1d:
        return nn.Conv1d(cin, cout, k, dilation=d, padding="same", padding_mode="reflect")

    class Tdnn(nn.Module):
        def __init__(self, cin: int, cout: int, k: int, d: int):
            super().__init__()
            self.conv = same_conv(cin, cout, k, d)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.conv(x))

    class Res2Net(nn.Module):
        def __init__(self, c: int, scale: int, k: int, d: int):
            super().__init__()
            self.scale = scale
            self.blocks = nn.ModuleList(
                [Tdnn(c // scale, c // scale, k, d) for _ in range(scale - 1)]
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            parts = torch.chunk(x, self.scale, dim=1)
            outs = [parts[0]]
            prev: torch.Tensor | None = None
            for i in range(1, self.scale):
                inp = parts[i] if prev is None else parts[i] + prev
                prev = self.blocks[i - 1](inp)
                outs.append(prev)
            return torch.cat(outs, dim=1)

    class SqueezeExcite(nn.Module):
        def __init__(self, c: int, se: int):
            super().__init__()
            self.conv1 = same_conv(c, se, 1)
            self.conv2 = same_conv(se, c, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            s = x.mean(dim=2, keepdim=True)
            return x * torch.sigmoid(self.conv2(torch.relu(self.conv1(s))))

    class SeRes2Block(nn.Module):
        def __init__(self, cin: int, cout: int, scale: int, se: int, k: int, d: int):
            super().__init__()
            self.tdnn1 = Tdnn(cin, cout, 1, 1)
            self.res2net_block = Res2Net(cout, scale, k, d)
            self.tdnn2 = Tdnn(cout, cout, 1, 1)
            self.se_block = SqueezeExcite(cout, se)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.se_block(self.tdnn2(self.res2net_block(self.tdnn1(x))))
            return h + x

    class AttentivePool(nn.Module):
        def __init__(self, c: int, att: int):
            super().__init__()
            self.tdnn = Tdnn(3 * c, att, 1, 1)
            self.conv = same_conv(att, c, 1)

        @staticmethod
        def _stats(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            mean = (w * x).sum(2)
            var = (w * (x - mean.unsqueeze(2)).pow(2)).sum(2)
            return mean, torch.sqrt(var.clamp(min=1e-12))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            t = x.shape[-1]
            mean, std = self._stats(x, torch.ones_like(x[:, :1]) / t)
            ctx = torch.cat(
                [x, mean.unsqueeze(2).expand_as(x), std.unsqueeze(2).expand_as(x)], dim=1
            )
            att = torch.softmax(self.conv(torch.tanh(self.tdnn(ctx))), dim=2)
            mean, std = self._stats(x, att)
            return torch.cat((mean, std), dim=1).unsqueeze(2)

    class SpeakerEncoder(nn.Module):
        def __init__(self, c: SpeakerEncoderConfig):
            super().__init__()
            ch, ks, ds = c.enc_channels, c.enc_kernel_sizes, c.enc_dilations
            if not len(ch) == len(ks) == len(ds) >= 3:
                raise ValueError("speaker encoder: enc_channels/kernel_sizes/dilations mismatch")
            blocks: list[nn.Module] = [Tdnn(c.mel_dim, ch[0], ks[0], ds[0])]
            for i in range(1, len(ch) - 1):
                blocks.append(
                    SeRes2Block(
                        ch[i - 1], ch[i], c.enc_res2net_scale, c.enc_se_channels, ks[i], ds[i]
                    )
                )
            self.blocks = nn.ModuleList(blocks)
            self.mfa = Tdnn(ch[-1], ch[-1], ks[-1], ds[-1])
            self.asp = AttentivePool(ch[-1], c.enc_attention_channels)
            self.fc = same_conv(2 * ch[-1], c.enc_dim, 1)

        def forward(self, mels: torch.Tensor) -> torch.Tensor:
            h = mels.transpose(1, 2)
            outs = []
            for b in self.blocks:
                h = b(h)
                outs.append(h)
            h = self.mfa(torch.cat(outs[1:], dim=1))
            return self.fc(self.asp(h)).squeeze(-1)

    return SpeakerEncoder(cfg)


def load_speaker_encoder(cfg_dict: dict[str, Any], tensors: dict[str, Any]) -> Any:
    """Build from ``speaker_encoder_config``; load ``speaker_encoder.*`` tensors (prefix cut)."""
    from engines.qwen3.errors import ConversionError

    model = build_speaker_encoder(SpeakerEncoderConfig.from_dict(cfg_dict))
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    if missing or unexpected:
        raise ConversionError(
            "speaker encoder tensors do not match the ECAPA-TDNN layout: "
            f"missing={list(missing)[:5]} unexpected={list(unexpected)[:5]}"
        )
    return model.eval()
