"""Kokoro-82M engine for ttsdock: int8 ONNX model assembled offline, espeak-ng front end,
whole-sentence prosody and streamed decoding (README "Kokoro engine")."""

from engines.kokoro.synth import KokoroConfig, KokoroSynthesizer

__all__ = ["KokoroConfig", "KokoroSynthesizer"]
