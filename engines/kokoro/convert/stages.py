"""The engine's two Kokoro stages (and the whole graph) as torch modules over ``KModel``'s parts.

Rule 1: these modules own only the glue between the official submodules (BERT,
the predictor, the text encoder, the decoder's frame-rate half and the
generator); every weight is the official module's, called unchanged.
Rule 2: the stage interface is ``engines.kokoro.graph_split``'s: the prosody
stage maps ``tokens``/``style``/``speed`` to ``features``, ``f0``, ``energy``,
``phase``, ``durations``; the decoder stage maps ``features``/``f0``/``phase``/
``style`` (any window of half-frames) to audio.

Differences from ``KModel.forward_with_tokens`` (batch 1, no padding), all exact:

* the LSTMs run without ``pack_padded_sequence`` (a batch of one unpadded row
  packs to itself) and the masks are all false, so the masked fills are no-ops;
* the alignment is a gather of token columns (``KModel`` multiplies by a
  one-hot matrix: the same numbers);
* the harmonic source's cumulative phase is summed on the half-frame grid.
  ``SineGen`` computes ``(f0 * k / 24000) % 1`` per sample from the
  nearest-upsampled F0 (constant over each half-frame's 300 samples), then
  resamples it linearly by 1/300, which reads samples ``300 i + 149`` and
  ``300 i + 150`` of the same half-frame: the value is that half-frame's. The
  random initial phase ``SineGen`` adds to sample 0 is never read by that
  resampling, so it never reaches the audio: the prosody stage has no random op.
* the only random source left is the noise of the harmonic source
  (``randn_like``, the decoder stage): one ``RandomNormalLike`` node, which
  ``engines.kokoro.convert.validate`` replaces by an input to hold it equal
  to the torch side's.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

SAMPLE_RATE = 24000
STYLE_HALF = 128  # style[:, :128] drives the decoder, style[:, 128:] the predictor


class ProsodyStage(nn.Module):
    """``tokens [1, n]``, ``style [1, 256]``, ``speed [1]`` -> the five stage outputs."""

    def __init__(self, kmodel: Any) -> None:
        super().__init__()
        self.bert = kmodel.bert
        self.bert_encoder = kmodel.bert_encoder
        self.predictor = kmodel.predictor
        self.text_encoder = kmodel.text_encoder
        dec = kmodel.decoder
        self.F0_conv = dec.F0_conv
        self.N_conv = dec.N_conv
        self.encode = dec.encode
        self.decode = dec.decode
        self.asr_res = dec.asr_res
        sine = dec.generator.m_source.l_sin_gen
        self.register_buffer(
            "harmonics", torch.arange(1, sine.dim + 1, dtype=torch.float32).reshape(1, 1, -1)
        )
        self.sampling_rate = float(sine.sampling_rate)

    def _duration_encoder(self, d_en: Tensor, s: Tensor) -> Tensor:
        """``predictor.text_encoder`` for one unpadded row: ``[1, C, T]`` -> ``[1, T, C + S]``."""
        n = d_en.shape[2]
        style = s[:, :, None].expand(-1, -1, n)  # [1, S, T]
        x = torch.cat([d_en, style], dim=1)
        for block in self.predictor.text_encoder.lstms:
            if isinstance(block, nn.LSTM):
                y, _ = block(x.transpose(1, 2))
                x = y.transpose(1, 2)
            else:  # AdaLayerNorm over channels, then the style again
                x = block(x.transpose(1, 2), s).transpose(1, 2)
                x = torch.cat([x, style], dim=1)
        return x.transpose(1, 2)

    def _text_encoder(self, tokens: Tensor) -> Tensor:
        """``text_encoder`` for one unpadded row: ``[1, T]`` -> ``[1, C, T]``."""
        enc = self.text_encoder
        x = enc.embedding(tokens).transpose(1, 2)
        for block in enc.cnn:
            x = block(x)
        y, _ = enc.lstm(x.transpose(1, 2))
        return y.transpose(1, 2)

    def _frame_decoder(self, asr: Tensor, f0: Tensor, energy: Tensor, s: Tensor) -> Tensor:
        """The decoder up to the generator: ``[1, 512, F]`` -> ``[1, 512, 2F]``."""
        f0_c = self.F0_conv(f0[:, None, :])
        n_c = self.N_conv(energy[:, None, :])
        x = self.encode(torch.cat([asr, f0_c, n_c], dim=1), s)
        asr_res = self.asr_res(asr)
        res = True
        for block in self.decode:
            if res:
                x = torch.cat([x, asr_res, f0_c, n_c], dim=1)
            x = block(x, s)
            if block.upsample_type != "none":
                res = False
        return x

    def forward(
        self, tokens: Tensor, style: Tensor, speed: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        s_dec = style[:, :STYLE_HALF]
        s = style[:, STYLE_HALF:]
        hidden = self.bert(tokens, attention_mask=torch.ones_like(tokens))
        d_en = self.bert_encoder(hidden).transpose(1, 2)
        d = self._duration_encoder(d_en, s)  # [1, T, 640]
        x, _ = self.predictor.lstm(d)
        duration = torch.sigmoid(self.predictor.duration_proj(x)).sum(dim=-1) / speed
        durations = torch.round(duration).clamp(min=1).long().reshape(-1)  # [T]
        ends = torch.cumsum(durations, dim=0)
        # a tensor bound, so the traced graph keeps it dynamic (``.item()`` would freeze it)
        frames = torch.arange(ends[-1], device=tokens.device)  # type: ignore[call-overload]
        column = (frames[:, None] >= ends[None, :]).sum(dim=1)  # token of each frame
        en = d.transpose(1, 2)[:, :, column]
        f0, energy = self.predictor.F0Ntrain(en, s)
        asr = self._text_encoder(tokens)[:, :, column]
        features = self._frame_decoder(asr, f0, energy, s_dec)
        rad = torch.remainder(f0[:, :, None] * self.harmonics / self.sampling_rate, 1.0)
        phase = torch.cumsum(rad, dim=1)  # [1, 2F, 9], in turns
        return features, f0, energy, phase, durations


class DecoderStage(nn.Module):
    """``features [1, 512, 2W]``, ``f0 [1, 2W]``, ``phase [1, 2W, 9]``, ``style`` -> audio.

    The audio is ``[1, 1, 600 W]``.
    """

    def __init__(self, kmodel: Any) -> None:
        super().__init__()
        self.generator = kmodel.decoder.generator
        source = self.generator.m_source
        sine = source.l_sin_gen
        self.l_linear = source.l_linear
        self.upsample = int(sine.upsample_scale)
        self.sine_amp = float(sine.sine_amp)
        self.noise_std = float(sine.noise_std)
        self.voiced_threshold = float(sine.voiced_threshold)

    def harmonic_source(self, f0: Tensor, phase: Tensor) -> Tensor:
        """``SourceModuleHnNSF`` from the cut phase: ``[1, 2W]`` -> ``[1, 300 * 2W]``."""
        f0_up = self.generator.f0_upsamp(f0[:, None, :]).transpose(1, 2)  # [1, L, 1]
        radians = (phase * 2 * math.pi).transpose(1, 2) * self.upsample
        radians = F.interpolate(radians, scale_factor=self.upsample, mode="linear")
        sines = torch.sin(radians.transpose(1, 2)) * self.sine_amp
        uv = (f0_up > self.voiced_threshold).to(sines.dtype)
        noise_amp = uv * self.noise_std + (1 - uv) * self.sine_amp / 3
        noise = noise_amp * torch.randn_like(sines)
        merged = torch.tanh(self.l_linear(sines * uv + noise))
        return merged.transpose(1, 2).squeeze(1)

    def forward(self, features: Tensor, f0: Tensor, phase: Tensor, style: Tensor) -> Tensor:
        gen = self.generator
        s = style[:, :STYLE_HALF]
        har_spec, har_phase = gen.stft.transform(self.harmonic_source(f0, phase))
        har = torch.cat([har_spec, har_phase], dim=1)
        return generator_body(gen, features, har, s)


def generator_body(gen: Any, x: Tensor, har: Tensor, style: Tensor) -> Tensor:
    """The official iSTFTNet generator after its harmonic source: upsampling with the
    source's noise residuals, resblocks, post conv and inverse STFT -> audio. One body
    for the ONNX decoder stage and the CoreML decoder."""
    for i in range(gen.num_upsamples):
        x = F.leaky_relu(x, negative_slope=0.1)
        x_source = gen.noise_res[i](gen.noise_convs[i](har), style)
        x = gen.ups[i](x)
        if i == gen.num_upsamples - 1:
            x = gen.reflection_pad(x)
        x = x + x_source
        xs = gen.resblocks[i * gen.num_kernels](x, style)
        for j in range(1, gen.num_kernels):
            xs = xs + gen.resblocks[i * gen.num_kernels + j](x, style)
        x = xs / gen.num_kernels
    x = gen.conv_post(F.leaky_relu(x))
    half = gen.post_n_fft // 2 + 1
    audio: Tensor = gen.stft.inverse(torch.exp(x[:, :half, :]), torch.sin(x[:, half:, :]))
    return audio


class WholeGraph(nn.Module):
    """Both stages in one graph (``--no-split``): tokens, style, speed -> audio, durations."""

    def __init__(self, kmodel: Any) -> None:
        super().__init__()
        self.prosody = ProsodyStage(kmodel)
        self.decoder = DecoderStage(kmodel)

    def forward(self, tokens: Tensor, style: Tensor, speed: Tensor) -> tuple[Tensor, Tensor]:
        features, f0, _energy, phase, durations = self.prosody(tokens, style, speed)
        audio = self.decoder(features, f0, phase, style).reshape(-1)
        return audio, durations
