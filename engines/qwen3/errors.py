"""Error types of the Qwen3-TTS model core."""

from __future__ import annotations

from pathlib import Path

from engines.runtime.synth import SynthesisError


class Qwen3TtsError(Exception):
    """Base class of every error the Qwen3-TTS model core raises on purpose."""


class GgufError(Qwen3TtsError):
    """A GGUF file is missing, unreadable or does not follow the QTS contract.

    The message always names the file and the reason.
    """

    def __init__(self, path: str | Path, reason: str) -> None:
        self.path = Path(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


class ConversionError(Qwen3TtsError):
    """A Hugging Face checkpoint cannot be converted (missing file, unknown layout)."""


class RequestError(Qwen3TtsError, SynthesisError, ValueError):
    """A synthesis request is invalid for this engine (wrong mode, unknown speaker, ...)."""
