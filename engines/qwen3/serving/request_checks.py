"""Request checks that need the loaded checkpoint: mode, speakers, languages, x-vector width.

Rule: a request that passes ``RequestChecks.check`` renders and runs; every
refusal is a ``RequestError`` that names the field and what this checkpoint
accepts. ``ModeSynthesizeRequest.validate`` (no model needed) runs first.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from engines.qwen3.errors import RequestError
from engines.qwen3.model.config import ModelMetadata
from engines.qwen3.modes import PresetSpeaker, QtsMode
from engines.qwen3.serving.request import ModeSynthesizeRequest


class RequestChecks:
    """What one checkpoint (its metadata, loaded for one mode) accepts."""

    def __init__(self, meta: ModelMetadata, mode: QtsMode) -> None:
        self.meta = meta
        self.mode = mode

    def preset_speakers(self) -> list[PresetSpeaker]:
        """Presets whose codec id the checkpoint metadata defines."""
        return [s for s in PresetSpeaker if s.as_str() in self.meta.speakers]

    def preset_speaker_id(self, speaker: PresetSpeaker | str) -> int:
        s = PresetSpeaker.parse(speaker)
        sid = self.meta.speakers.get(s.as_str())
        if sid is None:
            have = ", ".join(sorted(self.meta.speakers)) or "none"
            raise RequestError(
                f"preset speaker {s.as_str()!r} is not in this checkpoint's metadata "
                f"(qwen3-tts.talker.spk_id.{s.as_str()}); available: {have}"
            )
        return sid

    def languages(self) -> list[str]:
        """Accepted ``language`` values: ``auto`` plus the non-dialect metadata languages."""
        return ["auto", *sorted(k for k in self.meta.languages if "dialect" not in k)]

    @property
    def instruct_supported(self) -> bool:
        if self.mode is QtsMode.VoiceDesign:
            return True
        return self.mode is QtsMode.CustomVoice and self.meta.model_size != "0.6b"

    def check(self, req: ModeSynthesizeRequest) -> None:
        """``req.validate()`` plus the checks that need the loaded checkpoint."""
        req.validate()
        if req.mode is not self.mode:
            raise RequestError(
                f"request mode {req.mode.as_str()} differs from the loaded checkpoint mode "
                f"{self.mode.as_str()}"
            )
        self.language_id(req)
        if req.speaker is not None:
            self.preset_speaker_id(req.speaker)
        vec = self.speaker_vector(req)
        if vec is not None and vec.shape[0] != self.meta.talker.hidden_size:
            raise RequestError(
                f"speaker embedding has {vec.shape[0]} values; this checkpoint needs "
                f"{self.meta.talker.hidden_size} (talker width)"
            )

    def language_id(self, req: ModeSynthesizeRequest) -> int | None:
        lang = req.language.strip().lower()
        lid: int | None
        if lang == "auto":
            lid = None
        elif lang in self.meta.languages and "dialect" not in lang:
            lid = self.meta.languages[lang]
        else:
            raise RequestError(
                f"unsupported language {req.language!r}; this checkpoint supports "
                + ", ".join(self.languages())
            )
        if req.speaker is not None and lang in ("chinese", "auto"):
            dialect = self.meta.dialects.get(req.speaker.as_str())
            if dialect is not None:
                lid = self.meta.languages[dialect]
        return lid

    @staticmethod
    def speaker_vector(req: ModeSynthesizeRequest) -> npt.NDArray[np.float32] | None:
        if req.speaker_embedding is not None:
            return np.asarray(req.speaker_embedding, dtype=np.float32).reshape(-1)
        vcp = req.voice_clone_prompt
        if vcp is not None and vcp.ref_spk_embedding is not None:
            return np.asarray(vcp.ref_spk_embedding, dtype=np.float32).reshape(-1)
        return None
