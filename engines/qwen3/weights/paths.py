"""Where the Qwen3-TTS model files live: the ``ModeModelPaths`` resolution rules.

File names follow this project's export convention (they describe how
our converter names its output, not a downloadable distribution)::

    qwen3-tts-{size}-{mode}-talker-{quant}.gguf
    qwen3-tts-{size}-{mode}-code-predictor-{quant}.gguf
    qwen3-tts-{size}-{mode}-tokenizer.gguf
    qwen3-tts-{size}-{mode}-{quant}.gguf         (bundled: all three in one file)
    qwen3-tts-vocoder.onnx                       (shared across sizes and modes)

with ``size`` in ``1.7b``, ``0.6b`` (1.7b tried first), ``mode`` in ``base``,
``customvoice``, ``voicedesign`` and ``quant`` in ``f16 > f32 > bf16 > q8_0 >
q6_k > q5_k > q4_k`` (preference order, chosen separately for talker and code
predictor). The seed lists f16 then q8_0..q4_k; f32 and bf16 (what
``ttsdock qwen3-convert`` can also write) are accepted between f16 and q8_0.
When a bundled file exists for a size, all three GGUF paths point at it.

Resolution never raises: a directory without any known file resolves to the
default 1.7b f16 names, and :meth:`ModeModelPaths.check` then names the first
file that is missing, a directory, empty or not of the expected format.
This module imports nothing heavy (no torch, numpy or gguf).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final

from engines.qwen3.modes import SIZES, mode_slug, size_slug

#: Talker / code-predictor quantisations, in preference order.
QUANTS: Final[tuple[str, ...]] = ("f16", "f32", "bf16", "q8_0", "q6_k", "q5_k", "q4_k")
VOCODER_FILE: Final[str] = "qwen3-tts-vocoder.onnx"

_GGUF_MAGIC: Final[bytes] = b"GGUF"

StrPath = str | os.PathLike[str]


class ModelPathError(Exception):
    """A model file cannot be used: names the file's role, its path and the reason."""

    def __init__(self, role: str, path: Path, reason: str) -> None:
        self.role = role
        self.path = path
        self.reason = reason
        super().__init__(f"qwen3 {role} file {str(path)!r}: {reason}")


def split_file_names(mode: object, size: str = "1.7b", quant: str = "f16") -> dict[str, str]:
    """The split file names for one mode/size/quant (what the converter writes)."""
    m, s = mode_slug(mode), size_slug(size)
    q = quant.lower()
    if q not in QUANTS:
        raise ValueError(f"unknown quantisation {quant!r}; expected one of {', '.join(QUANTS)}")
    stem = f"qwen3-tts-{s}-{m}"
    return {
        "talker_gguf": f"{stem}-talker-{q}.gguf",
        "code_predictor_gguf": f"{stem}-code-predictor-{q}.gguf",
        "tokenizer_gguf": f"{stem}-tokenizer.gguf",
        "vocoder_onnx": VOCODER_FILE,
    }


def bundled_file_name(mode: object, size: str = "1.7b", quant: str = "f16") -> str:
    """The bundled (talker + code predictor + tokenizer) file name."""
    q = quant.lower()
    if q not in QUANTS:
        raise ValueError(f"unknown quantisation {quant!r}; expected one of {', '.join(QUANTS)}")
    return f"qwen3-tts-{size_slug(size)}-{mode_slug(mode)}-{q}.gguf"


def _first_file(d: Path, names: Iterable[str]) -> Path | None:
    for name in names:
        p = d / name
        if p.is_file():
            return p
    return None


@dataclass(frozen=True)
class ModeModelPaths:
    """The four files one Qwen3-TTS mode needs. Talker, predictor and tokenizer may be one file."""

    talker_gguf: Path
    code_predictor_gguf: Path
    tokenizer_gguf: Path
    vocoder_onnx: Path

    def __post_init__(self) -> None:
        given = {
            "talker_gguf": self.talker_gguf,
            "code_predictor_gguf": self.code_predictor_gguf,
            "tokenizer_gguf": self.tokenizer_gguf,
            "vocoder_onnx": self.vocoder_onnx,
        }
        for name, value in given.items():
            if not isinstance(value, Path):
                object.__setattr__(self, name, Path(value))

    @classmethod
    def from_model_dir(
        cls,
        model_dir: StrPath,
        mode: object,
        *,
        size: str | None = None,
        talker_gguf: StrPath | None = None,
        code_predictor_gguf: StrPath | None = None,
        tokenizer_gguf: StrPath | None = None,
        vocoder_onnx: StrPath | None = None,
    ) -> ModeModelPaths:
        """Resolve the files of ``mode`` in ``model_dir``; explicit paths win over the search.

        ``size`` pins the model size (``1.7b``/``0.6b``); by default the first
        size with a talker (split or bundled) in the directory is used, 1.7b first.
        """
        d = Path(model_dir).expanduser()
        m = mode_slug(mode)
        sizes = (size_slug(size),) if size is not None else SIZES
        chosen = sizes[0]
        for s in sizes:
            if _first_file(d, _talker_candidates(m, s)) is not None:
                chosen = s
                break
        resolved = _resolve_size(d, m, chosen)
        return cls(
            talker_gguf=Path(talker_gguf) if talker_gguf is not None else resolved.talker_gguf,
            code_predictor_gguf=(
                Path(code_predictor_gguf)
                if code_predictor_gguf is not None
                else resolved.code_predictor_gguf
            ),
            tokenizer_gguf=(
                Path(tokenizer_gguf) if tokenizer_gguf is not None else resolved.tokenizer_gguf
            ),
            vocoder_onnx=Path(vocoder_onnx) if vocoder_onnx is not None else resolved.vocoder_onnx,
        )

    @classmethod
    def from_files(
        cls,
        talker_gguf: StrPath,
        code_predictor_gguf: StrPath | None = None,
        tokenizer_gguf: StrPath | None = None,
        vocoder_onnx: StrPath | None = None,
    ) -> ModeModelPaths:
        """Explicit paths; a missing predictor/tokenizer means "in the talker file" (bundled)."""
        talker = Path(talker_gguf)
        return cls(
            talker_gguf=talker,
            code_predictor_gguf=Path(code_predictor_gguf) if code_predictor_gguf else talker,
            tokenizer_gguf=Path(tokenizer_gguf) if tokenizer_gguf else talker,
            vocoder_onnx=Path(vocoder_onnx) if vocoder_onnx else talker.parent / VOCODER_FILE,
        )

    def with_overrides(self, **paths: StrPath | None) -> ModeModelPaths:
        """A copy with the given (non-None) paths replaced."""
        unknown = set(paths) - {
            "talker_gguf",
            "code_predictor_gguf",
            "tokenizer_gguf",
            "vocoder_onnx",
        }
        if unknown:
            raise TypeError(f"unknown model path field(s): {', '.join(sorted(unknown))}")
        return replace(self, **{k: Path(v) for k, v in paths.items() if v is not None})

    @property
    def bundled(self) -> bool:
        """True when talker and code predictor come from one file."""
        return self.talker_gguf == self.code_predictor_gguf

    def gguf_files(self) -> list[Path]:
        """The distinct GGUF files, in talker, predictor, tokenizer order."""
        out: list[Path] = []
        for p in (self.talker_gguf, self.code_predictor_gguf, self.tokenizer_gguf):
            if p not in out:
                out.append(p)
        return out

    def problems(self, *, need_vocoder: bool = True) -> list[ModelPathError]:
        """Every unusable file, as errors (empty when all files look usable)."""
        items: list[tuple[str, Path, bytes | None]] = [
            ("talker", self.talker_gguf, _GGUF_MAGIC),
            ("code predictor", self.code_predictor_gguf, _GGUF_MAGIC),
            ("tokenizer", self.tokenizer_gguf, _GGUF_MAGIC),
        ]
        if need_vocoder:
            items.append(("vocoder", self.vocoder_onnx, None))
        out: list[ModelPathError] = []
        for role, path, magic in items:
            reason = _file_problem(path, magic)
            if reason is not None:
                out.append(ModelPathError(role, path, reason))
        return out

    def check(self, *, need_vocoder: bool = True) -> ModeModelPaths:
        """Raise ``ModelPathError`` for the first unusable file; return ``self`` otherwise."""
        errors = self.problems(need_vocoder=need_vocoder)
        if errors:
            raise errors[0]
        return self

    def describe(self) -> str:
        """One line naming the files, for logs."""
        return (
            f"talker={self.talker_gguf} code_predictor={self.code_predictor_gguf} "
            f"tokenizer={self.tokenizer_gguf} vocoder={self.vocoder_onnx}"
        )


def _talker_candidates(mode: str, size: str) -> list[str]:
    names = [bundled_file_name(mode, size, q) for q in QUANTS]
    names += [split_file_names(mode, size, q)["talker_gguf"] for q in QUANTS]
    return names


def _resolve_size(d: Path, mode: str, size: str) -> ModeModelPaths:
    vocoder = d / VOCODER_FILE
    bundled = _first_file(d, (bundled_file_name(mode, size, q) for q in QUANTS))
    if bundled is not None:
        return ModeModelPaths(bundled, bundled, bundled, vocoder)
    names = [split_file_names(mode, size, q) for q in QUANTS]
    talker = _first_file(d, (n["talker_gguf"] for n in names)) or d / names[0]["talker_gguf"]
    predictor = (
        _first_file(d, (n["code_predictor_gguf"] for n in names))
        or d / names[0]["code_predictor_gguf"]
    )
    tokenizer = d / names[0]["tokenizer_gguf"]
    return ModeModelPaths(talker, predictor, tokenizer, vocoder)


def _file_problem(path: Path, magic: bytes | None) -> str | None:
    """Why ``path`` cannot be a model file, or None when it looks fine."""
    try:
        if not path.exists():
            return "missing (no such file)"
        if path.is_dir():
            return "is a directory, expected a file"
        size = path.stat().st_size
        if size == 0:
            return "is empty (0 bytes)"
        if magic is not None:
            with path.open("rb") as fh:
                head = fh.read(len(magic))
            if head != magic:
                return f"not a GGUF file (starts with {head!r}, expected {magic!r})"
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    return None
