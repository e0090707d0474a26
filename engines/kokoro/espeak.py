"""libespeak-ng through ctypes (the copy that ``espeakng-loader`` ships), clause by clause.

Rule 1: every call into libespeak-ng goes through ``Espeak`` and holds its one
lock: the library keeps global state and is not thread-safe.
Rule 2: this module returns IPA per clause plus the clause's punctuation
mark; mapping to model tokens is ``frontend``'s business.

``espeak_TextToPhonemes`` returns one clause per call and drops its
punctuation. Its text pointer is advanced past the clause, the terminator and
exactly one read-ahead character of the next clause (measured with 1.52), so
the consumed bytes minus that character end with the clause's punctuation,
which we put back (``Clause.mark``).
"""

from __future__ import annotations

import ctypes
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import structlog

from engines.runtime.synth import SynthesisError

log = structlog.get_logger(__name__)

AUDIO_OUTPUT_SYNCHRONOUS = 0x02
ESPEAK_CHARS_UTF8 = 1
PHONEMES_IPA = 0x02
EE_OK = 0

#: Text punctuation -> mark handed to Kokoro (all of them are in its vocabulary).
_MARKS = {
    "?": "?",
    "¿": "?",
    "!": "!",
    "¡": "!",
    ".": ".",
    "。": ".",
    "…": "…",
    ",": ",",
    "、": ",",
    ";": ";",
    ":": ":",
    "—": "—",
    "–": "—",
}
#: Which mark wins when a clause ends with several ("?!" -> "?", "...," -> ",").
_MARK_PRIORITY = ("?", "!", "…", ".", ";", ":", "—", ",")
_CLOSERS = set("\"'”’»«)]}›‹“‘ \t\r\n")
SENTENCE_MARKS = frozenset("?!.…")


class EspeakError(SynthesisError):
    """libespeak-ng could not be loaded or refused a voice."""


@dataclass(frozen=True)
class Clause:
    """One clause as espeak saw it: IPA (may be empty) and the restored mark ('' if none)."""

    ipa: str
    mark: str
    text: str


def _utf8_char_start(data: bytes, end: int) -> int:
    """Index of the first byte of the UTF-8 character that ends at ``end`` (exclusive)."""
    i = end - 1
    while i > 0 and (data[i] & 0xC0) == 0x80:
        i -= 1
    return max(i, 0)


def clause_mark(consumed: str) -> str:
    """The punctuation mark that ends ``consumed`` (closing quotes/brackets skipped)."""
    found: set[str] = set()
    for ch in reversed(consumed):
        if ch in _CLOSERS:
            continue
        mark = _MARKS.get(ch)
        if mark is None:
            break
        found.add(mark)
    for mark in _MARK_PRIORITY:
        if mark in found:
            return mark
    return ""


class Espeak:
    """A process-wide handle on libespeak-ng (IPA mode), safe to share between threads."""

    _instance: Espeak | None = None
    _instance_lock = threading.Lock()

    def __init__(self, library: str | None = None, data_path: str | None = None) -> None:
        lib_path, data = _locate(library, data_path)
        try:
            self._lib = ctypes.CDLL(lib_path)
        except OSError as exc:
            raise EspeakError(f"cannot load libespeak-ng from {lib_path}: {exc}") from exc
        lib = self._lib
        lib.espeak_Initialize.restype = ctypes.c_int
        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.espeak_SetVoiceByName.restype = ctypes.c_int
        lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        lib.espeak_TextToPhonemes.restype = ctypes.c_char_p
        lib.espeak_TextToPhonemes.argtypes = [
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.c_int,
            ctypes.c_int,
        ]
        self.lock = threading.Lock()
        self.data_path = data
        self._voice: str | None = None
        with self.lock:
            rate = lib.espeak_Initialize(AUDIO_OUTPUT_SYNCHRONOUS, 0, data.encode(), 0)
        if rate <= 0:
            raise EspeakError(f"espeak_Initialize failed with data path {data}")
        log.debug("espeak_loaded", library=lib_path, data=data)

    @classmethod
    def shared(cls) -> Espeak:
        """The one instance of this process (libespeak-ng has global state)."""
        with cls._instance_lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    def clauses(self, text: str, voice: str) -> list[Clause]:
        """Phonemise ``text`` with espeak voice ``voice`` (e.g. ``de``, ``en-us``)."""
        data = text.encode("utf-8", errors="replace").replace(b"\x00", b" ")
        out: list[Clause] = []
        with self.lock:
            if voice != self._voice:
                if self._lib.espeak_SetVoiceByName(voice.encode()) != EE_OK:
                    raise EspeakError(f"espeak-ng has no voice {voice!r}")
                self._voice = voice
            buf = ctypes.create_string_buffer(data)
            base = ctypes.addressof(buf)
            ptr = ctypes.c_void_p(base)
            guard = len(data) + 2  # each call consumes >= 1 byte: bounded loop
            cursor = 0  # start of the current clause's text (read-ahead char included)
            while ptr.value and guard > 0:
                guard -= 1
                raw = self._lib.espeak_TextToPhonemes(
                    ctypes.byref(ptr), ESPEAK_CHARS_UTF8, PHONEMES_IPA
                )
                end = (ptr.value - base) if ptr.value else len(data)
                end = min(max(end, cursor), len(data))
                if ptr.value and end > cursor:
                    end = max(cursor, _utf8_char_start(data, end))  # read-ahead char
                consumed = data[cursor:end].decode("utf-8", errors="replace")
                cursor = end
                ipa = raw.decode("utf-8", errors="replace") if raw else ""
                out.append(Clause(ipa, clause_mark(consumed), consumed))
        return out


def _locate(library: str | None, data_path: str | None) -> tuple[str, str]:
    lib = library
    data = data_path or os.environ.get("ESPEAK_NG_DATA")
    if lib is None or data is None:
        try:
            import espeakng_loader
        except ImportError as exc:
            raise EspeakError(
                "espeakng-loader is not installed; install the [kokoro] extra"
            ) from exc
        lib = lib or espeakng_loader.get_library_path()
        data = data or espeakng_loader.get_data_path()
    if not Path(data).is_dir():
        raise EspeakError(f"espeak-ng data directory {data} does not exist (ESPEAK_NG_DATA?)")
    return str(lib), str(data)
