"""Qwen3-TTS engine: GGUF talker + code predictor + text tokenizer, ONNX vocoder.

Importing this package is cheap (no torch, numpy or gguf). The model core lives in
``engines.qwen3.engine`` (``Qwen3TtsEngine``), the request types in
``engines.qwen3.request`` and the GGUF contract in ``engines.qwen3.gguf_model``.
"""

from __future__ import annotations

from engines.qwen3.errors import GgufError, Qwen3TtsError, RequestError
from engines.qwen3.request import (
    ModeSynthesizeRequest,
    PresetSpeaker,
    QtsMode,
    VoiceClonePrompt,
)

__all__ = [
    "GgufError",
    "ModeSynthesizeRequest",
    "PresetSpeaker",
    "QtsMode",
    "Qwen3TtsError",
    "RequestError",
    "VoiceClonePrompt",
]
