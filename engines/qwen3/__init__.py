"""Qwen3-TTS engine: GGUF talker + code predictor + text tokenizer, ONNX vocoder.

Importing this package is cheap (no torch, numpy or gguf). The model core lives in
``engines.qwen3.serving.frame_generator`` (``FrameGenerator``), the request types in
``engines.qwen3.serving.request`` and the GGUF contract in ``engines.qwen3.weights.gguf_loader``.
"""

from __future__ import annotations

from engines.qwen3.errors import GgufError, Qwen3TtsError, RequestError
from engines.qwen3.modes import PresetSpeaker, QtsMode
from engines.qwen3.serving.request import ModeSynthesizeRequest, VoiceClonePrompt

__all__ = [
    "GgufError",
    "ModeSynthesizeRequest",
    "PresetSpeaker",
    "QtsMode",
    "Qwen3TtsError",
    "RequestError",
    "VoiceClonePrompt",
]
