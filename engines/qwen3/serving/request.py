"""Request types of the Qwen3-TTS mode API (the library API this engine serves, in Python form).

``QtsMode`` names the three checkpoint kinds, ``PresetSpeaker`` the nine
CustomVoice presets, and ``ModeSynthesizeRequest`` one synthesis. The request
checks itself (``validate``); whatever needs the loaded model (mode of the
checkpoint, preset ids present in the metadata, languages, x-vector width) is
checked by the engine when the request arrives.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from engines.qwen3.errors import RequestError
from engines.qwen3.modes import PresetSpeaker, QtsMode

#: Codebook-0 and code-predictor codes are in [0, CODEBOOK_SIZE).
CODEBOOK_SIZE = 2048
NUM_CODE_GROUPS = 16


@dataclass(frozen=True)
class VoiceClonePrompt:
    """A Base-model voice clone prompt (upstream ``VoiceClonePromptItem``).

    ``ref_code`` is the reference audio's codec frames ``[R, 16]`` (int, 0..2047)
    and ``ref_text`` its transcript; both are needed for ICL. ``ref_spk_embedding``
    is the x-vector (talker width). With ``x_vector_only_mode`` only the x-vector
    is used. Without an x-vector the engine uses a zero row (seed fallback).
    """

    ref_code: npt.NDArray[np.int64] | None = None
    ref_text: str | None = None
    ref_spk_embedding: npt.NDArray[np.float32] | None = None
    x_vector_only_mode: bool = False
    icl_mode: bool = True

    @property
    def uses_icl(self) -> bool:
        return self.icl_mode and not self.x_vector_only_mode and self.ref_code is not None


@dataclass
class ModeSynthesizeRequest:
    """One synthesis for a mode (``ModeSynthesizeRequest`` of that API; sampling defaults
    as the official package's).

    ``greedy`` uses argmax for the talker and the code predictor but keeps the
    repetition penalty, the EOS block of the first two frames and the
    suppression of ids 2048..3071 (except EOS). ``non_streaming`` puts the
    whole text into the prefill (upstream ``non_streaming_mode=True``); the
    default feeds the text one token per frame (as that API specifies).
    """

    text: str
    mode: QtsMode = QtsMode.CustomVoice
    language: str = "auto"
    speaker: PresetSpeaker | None = None
    instruct: str | None = None
    speaker_embedding: npt.NDArray[np.float32] | None = None
    voice_clone_prompt: VoiceClonePrompt | None = None
    non_streaming: bool = False
    greedy: bool = False
    subtalker_greedy: bool | None = None  # None: same as ``greedy``
    seed: int | None = None
    max_frames: int = 2048
    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0
    repetition_penalty: float = 1.05
    subtalker_temperature: float = 0.9
    subtalker_top_k: int = 50
    subtalker_top_p: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.mode, QtsMode):
            self.mode = QtsMode.parse(self.mode)
        if self.speaker is not None and not isinstance(self.speaker, PresetSpeaker):
            self.speaker = PresetSpeaker.parse(self.speaker)

    @property
    def cp_greedy(self) -> bool:
        return self.greedy if self.subtalker_greedy is None else self.subtalker_greedy

    @property
    def effective_instruct(self) -> str | None:
        """The instruction, with ``""`` meaning none (as upstream)."""
        return self.instruct if self.instruct else None

    def validate(self) -> None:
        """Raise ``RequestError`` naming the first problem; checks need no model."""
        if not isinstance(self.text, str) or not self.text.strip():
            raise RequestError("text must be a non-empty string")
        if not isinstance(self.language, str) or not self.language.strip():
            raise RequestError("language must be a non-empty string ('auto' for automatic)")
        mode = self.mode
        if self.speaker is not None and mode is not QtsMode.CustomVoice:
            raise RequestError(
                f"preset speaker {self.speaker.as_str()!r} needs mode customvoice, "
                f"not {mode.as_str()}"
            )
        if self.instruct is not None and not isinstance(self.instruct, str):
            raise RequestError("instruct must be a string")
        if self.effective_instruct is not None and mode is QtsMode.Base:
            raise RequestError("instruct is not supported in base mode (customvoice/voicedesign)")
        if mode is not QtsMode.Base:
            if self.speaker_embedding is not None:
                raise RequestError(f"speaker_embedding needs mode base, not {mode.as_str()}")
            if self.voice_clone_prompt is not None:
                raise RequestError(f"voice_clone_prompt needs mode base, not {mode.as_str()}")
        if self.speaker_embedding is not None:
            _check_embedding(self.speaker_embedding, "speaker_embedding")
        vcp = self.voice_clone_prompt
        if vcp is not None:
            if vcp.ref_spk_embedding is not None:
                _check_embedding(vcp.ref_spk_embedding, "voice_clone_prompt.ref_spk_embedding")
            if vcp.icl_mode and not vcp.x_vector_only_mode:
                if vcp.ref_code is None:
                    raise RequestError("voice_clone_prompt in ICL mode needs ref_code [R, 16]")
                if not vcp.ref_text or not vcp.ref_text.strip():
                    raise RequestError("voice_clone_prompt in ICL mode needs a non-empty ref_text")
            if vcp.ref_code is not None:
                code = np.asarray(vcp.ref_code)
                if code.ndim != 2 or code.shape[1] != NUM_CODE_GROUPS or code.shape[0] < 1:
                    raise RequestError(
                        f"voice_clone_prompt.ref_code must have shape [R>=1, 16], "
                        f"got {list(code.shape)}"
                    )
                if not np.issubdtype(code.dtype, np.integer):
                    raise RequestError("voice_clone_prompt.ref_code must hold integers")
                if code.min() < 0 or code.max() >= CODEBOOK_SIZE:
                    raise RequestError(
                        f"voice_clone_prompt.ref_code values must be in [0, {CODEBOOK_SIZE})"
                    )
        if not isinstance(self.max_frames, int) or self.max_frames < 1:
            raise RequestError(f"max_frames must be an integer >= 1, got {self.max_frames!r}")
        if self.seed is not None and not isinstance(self.seed, int):
            raise RequestError(f"seed must be an integer or None, got {self.seed!r}")
        temperatures = (
            ("temperature", self.temperature),
            ("subtalker_temperature", self.subtalker_temperature),
        )
        for name, v in temperatures:
            if not _finite(v) or v <= 0:
                raise RequestError(f"{name} must be > 0, got {v!r}")
        for name, v in (("top_p", self.top_p), ("subtalker_top_p", self.subtalker_top_p)):
            if not _finite(v) or not 0.0 < v <= 1.0:
                raise RequestError(f"{name} must be in (0, 1], got {v!r}")
        for name, v in (("top_k", self.top_k), ("subtalker_top_k", self.subtalker_top_k)):
            if not isinstance(v, int) or v < 0:
                raise RequestError(f"{name} must be an integer >= 0 (0 = off), got {v!r}")
        if not _finite(self.repetition_penalty) or self.repetition_penalty <= 0:
            raise RequestError(f"repetition_penalty must be > 0, got {self.repetition_penalty!r}")


def _finite(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _check_embedding(vec: object, name: str) -> None:
    arr = np.asarray(vec)
    if arr.ndim != 1 or arr.size == 0:
        raise RequestError(f"{name} must be a 1-D vector, got shape {list(arr.shape)}")
    if not np.issubdtype(arr.dtype, np.floating) or not np.all(np.isfinite(arr)):
        raise RequestError(f"{name} must hold finite floats")
