"""Regenerate the codec / speaker-encoder golden data with the official ``qwen-tts`` classes.

Run in the oracle venv (README, Qwen3 section)::

    .dev/oracle-venv/bin/python tests/qwen3_codec_oracle_gen.py [--out tests/golden/qwen3/codec]

It builds the official ``Qwen3TTSTokenizerV2Decoder`` and ``Qwen3TTSSpeakerEncoder``
from the tiny configs of ``tests/qwen3_codec_helpers.py``, loads the same
name-derived weights our side uses, and writes ``golden.npz``:

- ``codes`` ``[1,16,100]`` (longer than the 72-frame attention window) and the
  official decoder output for them
  (``wav_full``, every ``STRIDE``-th sample), plus the official
  ``chunked_decode`` with 12-frame chunks and 4 / 25 frames of left context;
- the official x-vector path of ``create_voice_clone_prompt`` for 24 kHz audio
  (``Qwen3TTSForConditionalGeneration.extract_speaker_embedding``: the official
  ``mel_spectrogram`` then the speaker encoder) on ``qwen3_codec_helpers.test_audio``:
  ``mel`` and ``xvector``;
- the reference codes of ``create_voice_clone_prompt`` (the official
  ``Qwen3TTSTokenizerV2Model.encode``, its Mimi encoder) for that audio
  (``codes_ref``, 2.0 s = 25 frames) and for a length that is not a multiple
  of 1920 samples (``codes_ref_odd``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
for p in (HERE, HERE.parent):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import qwen3_codec_helpers as ch  # noqa: E402
from qwen3_oracle_gen import stub_torchaudio  # noqa: E402

FRAMES = 100
CHUNK = 12
STRIDE = 8
ENC_DIM = 32
AUDIO_S = 2.0  # 25 frames exactly
ODD_S = 2.03  # not a multiple of 1920 samples


def official_decoder() -> Any:
    import torch
    from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import (
        Qwen3TTSTokenizerV2DecoderConfig,
    )
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import (
        Qwen3TTSTokenizerV2Decoder,
    )

    cfg = Qwen3TTSTokenizerV2DecoderConfig(**ch.TINY_DECODER)
    model = Qwen3TTSTokenizerV2Decoder._from_config(cfg).eval()
    state = {
        k[len("decoder.") :]: torch.from_numpy(v.copy()) for k, v in ch.decoder_arrays().items()
    }
    model.load_state_dict(state, strict=True)
    return model


def official_tokenizer() -> Any:
    """The whole official 12 Hz tokenizer (Mimi encoder + decoder) with the tiny weights."""
    import torch
    from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import (
        Qwen3TTSTokenizerV2Config,
    )
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import (
        Qwen3TTSTokenizerV2Model,
    )

    cfg = Qwen3TTSTokenizerV2Config(**ch.codec_config())
    model = Qwen3TTSTokenizerV2Model._from_config(cfg).eval()
    arrays = {**ch.encoder_arrays(), **ch.decoder_arrays()}
    state = {k: torch.from_numpy(v.copy()) for k, v in arrays.items()}
    model.load_state_dict(state, strict=True)
    return model


def official_speaker(enc_dim: int) -> Any:
    import torch
    from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSSpeakerEncoderConfig
    from qwen_tts.core.models.modeling_qwen3_tts import Qwen3TTSSpeakerEncoder

    cfg = Qwen3TTSSpeakerEncoderConfig(**{**ch.TINY_SPEAKER, "enc_dim": enc_dim})
    model = Qwen3TTSSpeakerEncoder(cfg).eval()
    state = {
        k[len("speaker_encoder.") :]: torch.from_numpy(v.copy())
        for k, v in ch.speaker_arrays(enc_dim).items()
    }
    model.load_state_dict(state, strict=True)
    return model


def generate() -> dict[str, np.ndarray]:
    stub_torchaudio()
    import torch
    from qwen_tts.core.models import modeling_qwen3_tts as mq

    torch.manual_seed(0)
    dec = official_decoder()
    codes = ch.golden_codes(FRAMES).T[None].copy()  # [1,16,T]
    ct = torch.from_numpy(codes)
    out: dict[str, np.ndarray] = {"codes": codes}
    with torch.no_grad():
        out["wav_full"] = dec(ct)[0, 0].numpy()[::STRIDE].copy()
        for ctx in (4, 25):
            wav = dec.chunked_decode(ct, chunk_size=CHUNK, left_context_size=ctx)[0, 0]
            out[f"wav_chunk{CHUNK}_ctx{ctx}"] = wav.numpy()[::STRIDE].copy()
    spk = official_speaker(ENC_DIM)
    audio = ch.test_audio(AUDIO_S)
    owner = SimpleNamespace(speaker_encoder=spk, device=torch.device("cpu"), dtype=torch.float32)
    xvec = mq.Qwen3TTSForConditionalGeneration.extract_speaker_embedding(owner, audio, 24000)
    mel = mq.mel_spectrogram(
        torch.from_numpy(audio).unsqueeze(0),
        n_fft=1024,
        num_mels=128,
        sampling_rate=24000,
        hop_size=256,
        win_size=1024,
        fmin=0,
        fmax=12000,
    ).transpose(1, 2)
    out["mel"] = mel[0].numpy()
    # Reference codes as create_voice_clone_prompt gets them (speech_tokenizer.encode ->
    # Qwen3TTSTokenizerV2Model.encode; the feature extractor passes one mono 24 kHz clip through).
    tok = official_tokenizer()
    for name, secs in (("codes_ref", AUDIO_S), ("codes_ref_odd", ODD_S)):
        wav = torch.from_numpy(ch.test_audio(secs))[None]
        enc = tok.encode(wav, torch.ones_like(wav, dtype=torch.long), return_dict=True)
        out[name] = enc.audio_codes[0].numpy().astype(np.int64)  # [T,16]
    out["xvector"] = xvec.float().numpy()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=ch.GOLDEN_CODEC)
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    arrays = generate()
    np.savez_compressed(args.out / "golden.npz", **arrays)
    about = {
        "about": "official qwen-tts 0.1.1 codec decoder and speaker-encoder outputs for the tiny "
        "configs of tests/qwen3_codec_helpers.py; regenerate with tests/qwen3_codec_oracle_gen.py",
        "frames": FRAMES,
        "chunk": CHUNK,
        "stride": STRIDE,
        "enc_dim": ENC_DIM,
        "audio_s": AUDIO_S,
        "odd_s": ODD_S,
        "encoder_config": ch.TINY_ENCODER,
        "decoder_config": ch.TINY_DECODER,
        "speaker_config": ch.TINY_SPEAKER,
    }
    (args.out / "about.json").write_text(json.dumps(about, indent=1) + "\n")
    for k, v in arrays.items():
        print(f"{k}: {v.shape} {v.dtype}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
