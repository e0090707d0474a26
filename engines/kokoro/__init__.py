"""Kokoro-82M engine for ttsdock: int8 ONNX model assembled offline, espeak-ng front end,
phrase streaming with a short first phrase (DESIGN.md engines/kokoro)."""

from engines.kokoro.synth import KokoroConfig, KokoroSynthesizer

__all__ = ["KokoroConfig", "KokoroSynthesizer"]
