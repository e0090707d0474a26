"""The reference's CoreML pipeline as torch modules over ``KModel``'s parts.

Traced and converted by ``coreml_export``.

Rule 1: the interface is ``engines.kokoro.coreml``'s (the engine's CoreML
backend): a duration model on a fixed 512-token input with an attention
mask, and per frame bucket an F0/energy model and a decoder that takes the
harmonic source's spectrum (``har``) as an input (computed on the CPU).
Rule 2: every weight is the official module's. Padding to 512 tokens is made
exact: the masks are applied where ``KModel`` masks, BERT gets an additive
attention mask, and each bidirectional LSTM runs its backward direction on the
sequence reversed within the real length (``KModel`` packs the sequence for the
same effect), so the real positions never see the padding.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from engines.kokoro.convert.stages import generator_body

STYLE_HALF = 128
DURATION_TOKENS = 512


def adain_block(block: Any, x: Tensor, s: Tensor) -> Tensor:
    """``AdainResBlk1d.forward`` with the ``1/sqrt(2)`` as a float constant.

    The official code computes it as ``torch.rsqrt(torch.tensor(2))``, an
    integer tensor that coremltools' ``rsqrt`` refuses; the value is the same.
    """
    out: Tensor = (block._residual(x, s) + block._shortcut(x)) * (2.0**-0.5)
    return out


def _direction(lstm: nn.LSTM, suffix: str) -> nn.LSTM:
    """One direction of a one-layer bidirectional ``lstm`` as its own module (shared weights)."""
    one = nn.LSTM(lstm.input_size, lstm.hidden_size, 1, batch_first=True)
    for name in ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"):
        setattr(one, name, getattr(lstm, name + suffix))
    return one


class MaskedBiLSTM(nn.Module):
    """A bidirectional LSTM over the first ``length`` steps of a padded ``[1, N, C]`` input."""

    def __init__(self, lstm: nn.LSTM) -> None:
        super().__init__()
        self.forward_lstm = _direction(lstm, "")
        self.backward_lstm = _direction(lstm, "_reverse")

    def forward(self, x: Tensor, reverse: Tensor) -> Tensor:
        ahead, _ = self.forward_lstm(x)
        back, _ = self.backward_lstm(x[:, reverse, :])
        return torch.cat([ahead, back[:, reverse, :]], dim=2)


class DurationModel(nn.Module):
    """``input_ids``, ``attention_mask`` ``[1, 512]``, ``ref_s`` ``[1, 256]``, ``speed`` ``[1]``
    -> ``pred_dur`` ``[1, 512]``, ``d`` ``[1, 640, 512]``, ``t_en`` ``[1, 512, 512]``."""

    def __init__(self, kmodel: Any) -> None:
        super().__init__()
        self.bert = kmodel.bert
        self.bert_encoder = kmodel.bert_encoder
        self.predictor = kmodel.predictor
        self.text_encoder = kmodel.text_encoder
        self.duration_lstms = nn.ModuleList(
            [
                MaskedBiLSTM(b) if isinstance(b, nn.LSTM) else b
                for b in kmodel.predictor.text_encoder.lstms
            ]
        )
        self.lstm = MaskedBiLSTM(kmodel.predictor.lstm)
        self.text_lstm = MaskedBiLSTM(kmodel.text_encoder.lstm)
        # constants, not shapes read at run time (CoreML wants static integers)
        self.register_buffer("steps", torch.arange(DURATION_TOKENS), persistent=False)

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor, ref_s: Tensor, speed: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        ids = input_ids.long()
        keep = attention_mask.to(torch.float32)  # [1, N]
        n = DURATION_TOKENS
        length = keep.sum().long()
        steps: Tensor = self.steps  # type: ignore[assignment]
        reverse = torch.where(steps < length, length - 1 - steps, steps)
        m = keep[:, None, :]  # [1, 1, N]
        s = ref_s[:, STYLE_HALF:]
        emb = self.bert.embeddings(input_ids=ids)
        additive = ((1.0 - keep) * -1e9)[:, None, None, :]
        hidden = self.bert.encoder(emb, additive)[0]
        d_en = self.bert_encoder(hidden).transpose(1, 2) * m
        style = s[:, :, None].expand(-1, -1, n)
        x = torch.cat([d_en, style], dim=1) * m
        for block in self.duration_lstms:
            if isinstance(block, MaskedBiLSTM):
                x = block(x.transpose(1, 2), reverse).transpose(1, 2) * m
            else:
                x = block(x.transpose(1, 2), s).transpose(1, 2)
                x = torch.cat([x, style], dim=1) * m
        d = x  # [1, 640, N]
        y = self.lstm(d.transpose(1, 2), reverse)
        duration = torch.sigmoid(self.predictor.duration_proj(y)).sum(dim=-1) / speed
        pred_dur = torch.round(duration).clamp(min=1) * keep
        enc = self.text_encoder
        t = enc.embedding(ids).transpose(1, 2) * m
        for block in enc.cnn:
            t = block(t) * m
        t_en = self.text_lstm(t.transpose(1, 2), reverse).transpose(1, 2) * m
        return pred_dur, d, t_en


class F0NModel(nn.Module):
    """``en`` ``[1, 640, F]``, ``s`` ``[1, 128]`` -> ``F0_pred``, ``N_pred`` ``[1, 2F]``."""

    def __init__(self, kmodel: Any) -> None:
        super().__init__()
        self.predictor = kmodel.predictor

    def forward(self, en: Tensor, s: Tensor) -> tuple[Tensor, Tensor]:
        p = self.predictor
        x, _ = p.shared(en.transpose(1, 2))
        f0 = x.transpose(1, 2)
        for block in p.F0:
            f0 = adain_block(block, f0, s)
        energy = x.transpose(1, 2)
        for block in p.N:
            energy = adain_block(block, energy, s)
        return p.F0_proj(f0).squeeze(1), p.N_proj(energy).squeeze(1)


class DecoderModel(nn.Module):
    """``asr``, ``F0_pred``, ``N_pred``, ``ref_s`` ``[1, 128]``, ``har`` -> ``waveform``.

    ``KModel``'s decoder with the harmonic source's spectrum ``har``
    (``[1, n_fft + 2, 120 frames + 1]``) given instead of computed from F0.
    """

    def __init__(self, kmodel: Any) -> None:
        super().__init__()
        self.dec = kmodel.decoder

    def forward(
        self, asr: Tensor, F0_pred: Tensor, N_pred: Tensor, ref_s: Tensor, har: Tensor
    ) -> Tensor:
        dec = self.dec
        f0_c = dec.F0_conv(F0_pred[:, None, :])
        n_c = dec.N_conv(N_pred[:, None, :])
        x = adain_block(dec.encode, torch.cat([asr, f0_c, n_c], dim=1), ref_s)
        asr_res = dec.asr_res(asr)
        res = True
        for block in dec.decode:
            if res:
                x = torch.cat([x, asr_res, f0_c, n_c], dim=1)
            x = adain_block(block, x, ref_s)
            if block.upsample_type != "none":
                res = False
        return generator_body(dec.generator, x, har, ref_s).reshape(1, -1)
