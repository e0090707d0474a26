"""Language of a sentence (de/en) and sentence splitting for it.

Rule 1: ``detect_language`` is the reference rule (docs/wire.md#kokoro-front-end), the one
implementation both engines use: German unless the text looks English.
Rule 2: ``split_sentences`` only decides where the language may change; it
never drops or reorders text (the pieces joined by one space are the input with
its whitespace collapsed).
"""

from __future__ import annotations

import re
from typing import Literal

Lang = Literal["de", "en"]
LangOption = Literal["auto", "de", "en"]

# Words that only German text contains (English homographs like "die", "an",
# "so", "will", "also" are left out on purpose).
GERMAN_WORDS = frozenset(
    """und ist nicht ich sie wir ihr ein eine einen einem einer der das den dem des
    mit für auf bitte danke guten tag hallo ja nein wie sind haben habe hat wird
    werden kann können möchten möchte gerne gern ihnen ihre noch auch oder aber sehr
    gut heute morgen uhr termin zu zum zur vom im nach bei über wenn dass dann schon
    mein meine meinen ihren unsere unser wir wieder sich auch nur jetzt hier gibt
    vielen dank tschüss wiedersehen herr frau natürlich leider genau einen moment
    welche welcher warum wann woher wohin kein keine keinen""".split()
)
_UMLAUTS = frozenset("äöüÄÖÜß")
_WORD_RE = re.compile(r"[^\W\d_]+", re.UNICODE)

#: Language names (Qwen3's ``--language`` and friends) that map onto a front-end language.
LANGUAGE_NAMES: dict[str, Lang] = {
    "de": "de",
    "german": "de",
    "deutsch": "de",
    "en": "en",
    "english": "en",
}


def detect_language(text: str) -> Lang:
    """The reference rule (docs/wire.md#kokoro-front-end): German unless the text looks English."""
    if any(ch in _UMLAUTS for ch in text):
        return "de"
    if any(w.lower() in GERMAN_WORDS for w in _WORD_RE.findall(text)):
        return "de"
    data = text.encode("utf-8", errors="replace")
    if not data:
        return "de"
    letters = sum(1 for b in data if 65 <= b <= 90 or 97 <= b <= 122)
    return "de" if letters * 2 < len(data) else "en"


# A sentence ends at . ! ? … followed by blanks and an upper-case letter, a digit or
# an opening quote, unless the word before the mark is an abbreviation, an initial or
# a German ordinal ("am 3. Dezember"). One left-to-right scan: linear in the text.
_BOUNDARY_RE = re.compile(r"[.!?…][\"'”»)]?(\s+)(?=[\"'„“«(]?[A-ZÄÖÜ0-9])")
_NO_BREAK_BEFORE = re.compile(
    r"(?:\b(?:[A-Za-zÄÖÜäöü]|Dr|Mr|Mrs|Ms|Prof|St|Nr|No|Hr|Hrn|Fr|Str|ca|bzw|z\.\s?B|"
    r"d\.\s?h|u\.\s?a|usw|etc|vs|inkl|evtl|ggf|Tel|Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Sept|"
    r"Oct|Okt|Nov|Dec|Dez|Mon|Tue|Wed|Thu|Fri|Sat|Sun|Mo|Di|Mi|Do|Sa|So))\.\s*$"
)
_ORDINAL_END = re.compile(r"\b\d{1,2}\.\s*$")
_MONTH_START = re.compile(
    r"(?:Januar|Februar|März|April|Mai|Juni|Juli|August|September|Oktober|November|Dezember|"
    r"Jan|Feb|Mär|Apr|Jun|Jul|Aug|Sep|Okt|Nov|Dez)\b"
)


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text`` (whitespace collapsed), for per-sentence language choice."""
    out: list[str] = []
    start = 0
    for m in _BOUNDARY_RE.finditer(text):
        cut = m.start(1)
        head = text[max(start, cut - 10) : cut]
        if _NO_BREAK_BEFORE.search(head):
            continue
        if _ORDINAL_END.search(head) and _MONTH_START.match(text, m.end(1)):
            continue  # "am 3. Dezember": a German date, not a sentence end
        piece = text[start:cut].strip()
        if piece:
            out.append(piece)
        start = m.end(1)
    rest = text[start:].strip()
    if rest:
        out.append(rest)
    return out
