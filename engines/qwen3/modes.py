"""Mode, size and speaker names of Qwen3-TTS checkpoints, and every spelling accepted for them.

``QtsMode`` names the three checkpoint kinds (file-name slugs ``base``,
``customvoice``, ``voicedesign``; official ``tts_model_type`` spellings
``base``, ``custom_voice``, ``voice_design``), ``PresetSpeaker`` the nine
CustomVoice presets, and the sizes are ``1.7b`` and ``0.6b`` (``1b7``/``0b6``
in official configs). Each reader keeps its own strictness: the strict parsers
(``mode_slug``, ``size_slug``, ``QtsMode.parse``, ``PresetSpeaker.parse``)
raise with the accepted spellings; the ``*_or_none`` lookups return None and
let the caller name the file and the field.
"""

from __future__ import annotations

import enum
from typing import Final

from engines.qwen3.errors import RequestError

#: Mode slugs as they appear in file names.
MODES: Final[tuple[str, ...]] = ("base", "customvoice", "voicedesign")
#: What ``--mode`` accepts: the slugs and the official spellings.
MODE_CHOICES: Final[tuple[str, ...]] = (*MODES, "custom_voice", "voice_design")
#: Model sizes, in resolution order (1.7b first).
SIZES: Final[tuple[str, ...]] = ("1.7b", "0.6b")

#: File-name slug of each spelling ``mode_slug`` accepts (after dropping ``_``, ``-``, spaces).
_MODE_ALIASES: Final[dict[str, str]] = {
    "base": "base",
    "customvoice": "customvoice",
    "custom": "customvoice",
    "voicedesign": "voicedesign",
    "design": "voicedesign",
}
#: Size slug of each spelling of a size.
_SIZE_ALIASES: Final[dict[str, str]] = {
    "0.6b": "0.6b",
    "0b6": "0.6b",
    "1.7b": "1.7b",
    "1b7": "1.7b",
}
#: Official ``tts_model_type`` of each accepted spelling (GGUF metadata).
_MODEL_TYPE_ALIASES: Final[dict[str, str]] = {
    "base": "base",
    "custom_voice": "custom_voice",
    "customvoice": "custom_voice",
    "voice_design": "voice_design",
    "voicedesign": "voice_design",
}
#: File-name slug of each official ``tts_model_type`` (``config.json``).
_SLUG_OF_MODEL_TYPE: Final[dict[str, str]] = {
    "base": "base",
    "custom_voice": "customvoice",
    "voice_design": "voicedesign",
}


class QtsMode(enum.Enum):
    """The checkpoint kind a request (and a loaded engine) is for."""

    Base = "base"
    CustomVoice = "customvoice"
    VoiceDesign = "voicedesign"

    def as_str(self) -> str:
        """The slug used in file names: ``base``, ``customvoice`` or ``voicedesign``."""
        return self.value

    @property
    def model_type(self) -> str:
        """The official ``tts_model_type``: ``base``, ``custom_voice`` or ``voice_design``."""
        return {"base": "base", "customvoice": "custom_voice", "voicedesign": "voice_design"}[
            self.value
        ]

    @classmethod
    def parse(cls, value: QtsMode | str) -> QtsMode:
        """Accept a mode, its slug, its name or the official ``tts_model_type`` spelling."""
        if isinstance(value, QtsMode):
            return value
        if isinstance(value, enum.Enum):
            value = str(value.value)
        if not isinstance(value, str):
            raise RequestError(f"mode must be a string or QtsMode, got {type(value).__name__}")
        key = value.strip().lower().replace("_", "").replace("-", "").replace(" ", "")
        for m in cls:
            if key == m.value:
                return m
        raise RequestError(
            f"unknown mode {value!r}; expected one of base, customvoice, voicedesign"
        )


class PresetSpeaker(enum.Enum):
    """The nine CustomVoice preset speakers. Their codec ids come from GGUF metadata."""

    Vivian = "vivian"
    Serena = "serena"
    Uncle_Fu = "uncle_fu"
    Dylan = "dylan"
    Eric = "eric"
    Ryan = "ryan"
    Aiden = "aiden"
    Ono_Anna = "ono_anna"
    Sohee = "sohee"

    def as_str(self) -> str:
        """Lower-case metadata name, e.g. ``uncle_fu``."""
        return self.value

    @classmethod
    def all(cls) -> tuple[PresetSpeaker, ...]:
        return tuple(cls)

    @classmethod
    def parse(cls, value: PresetSpeaker | str) -> PresetSpeaker:
        if isinstance(value, PresetSpeaker):
            return value
        key = str(value).strip().lower().replace("-", "_").replace(" ", "_")
        for s in cls:
            if key in (s.value, s.value.replace("_", "")):
                return s
        raise RequestError(
            f"unknown preset speaker {value!r}; expected one of " + ", ".join(s.value for s in cls)
        )


#: Seed spelling: ``PresetSpeaker::ALL``.
PRESET_SPEAKERS_ALL: tuple[PresetSpeaker, ...] = tuple(PresetSpeaker)


def qts_mode(mode: object) -> QtsMode:
    """``QtsMode`` of any spelling ``mode_slug`` accepts (``ValueError`` otherwise)."""
    return QtsMode.parse(mode_slug(mode))


def mode_slug(mode: object) -> str:
    """Return the file-name slug (``base``/``customvoice``/``voicedesign``) of ``mode``.

    Accepts the slugs, the official ``tts_model_type`` spellings
    (``custom_voice``, ``voice_design``), any case, and enums whose value or
    name is one of those (so ``QtsMode.CustomVoice`` works without importing it).
    """
    candidates: list[str] = []
    if isinstance(mode, str):
        candidates.append(mode)
    elif isinstance(mode, enum.Enum):
        if isinstance(mode.value, str):
            candidates.append(mode.value)
        candidates.append(mode.name)
    else:
        raise ValueError(f"qwen3 mode must be a string or enum, got {type(mode).__name__}")
    for cand in candidates:
        key = cand.strip().lower().replace("_", "").replace("-", "").replace(" ", "")
        if key in _MODE_ALIASES:
            return _MODE_ALIASES[key]
    shown = candidates[0] if candidates else repr(mode)
    raise ValueError(f"unknown qwen3 mode {shown!r}; expected one of {', '.join(MODES)}")


def size_slug(size: str) -> str:
    """The size slug (``1.7b``/``0.6b``) of ``size``; also ``1b7``, ``0b6``, ``_`` for ``.``."""
    key = size.strip().lower().replace("_", ".")
    if key not in _SIZE_ALIASES:
        raise ValueError(f"unknown qwen3 model size {size!r}; expected 1.7b or 0.6b")
    return _SIZE_ALIASES[key]


def size_or_none(key: str) -> str | None:
    """The size slug of ``key`` exactly as given (``0.6b``, ``0b6``, ``1.7b``, ``1b7``), or None."""
    return _SIZE_ALIASES.get(key)


def model_type_or_none(key: str) -> str | None:
    """The official ``tts_model_type`` of ``key`` as given (slug or official spelling), or None."""
    return _MODEL_TYPE_ALIASES.get(key)


def mode_of_model_type_or_none(model_type: str) -> str | None:
    """The file-name slug of an official ``tts_model_type`` exactly as given, or None."""
    return _SLUG_OF_MODEL_TYPE.get(model_type)


def speaker_name(s: PresetSpeaker | str) -> str:
    """Lower-case name of a preset speaker (``uncle_fu``) or of a speaker given by name."""
    if isinstance(s, str):
        return s.lower()
    return s.as_str().lower()


def preset_names() -> list[str]:
    """Every preset speaker's name, in ``PresetSpeaker`` order."""
    return [p.as_str() for p in PresetSpeaker]
