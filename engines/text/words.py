"""Number, digit and letter words in English and German (num2words, babel data).

Rule 1: pure functions of (value, language) returning plain words; cached,
because a call says the same numbers again and again.
Rule 2: the tables here are the few words num2words and babel do not give us
(digit names for spelling, currency and unit names for speech).
"""

from __future__ import annotations

from functools import lru_cache

from babel.dates import get_day_names, get_month_names
from num2words import num2words

from engines.text.lang import Lang

MAX_CARDINAL_DIGITS = 15  # longer digit runs are read digit by digit

DIGITS: dict[Lang, tuple[str, ...]] = {
    "en": ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"),
    "de": ("null", "eins", "zwei", "drei", "vier", "fünf", "sechs", "sieben", "acht", "neun"),
}
#: German reads a 2 in phone numbers and codes as "zwo" (clearer on the phone).
PHONE_DIGITS: dict[Lang, tuple[str, ...]] = {
    "en": DIGITS["en"],
    "de": ("null", "eins", "zwo", "drei", "vier", "fünf", "sechs", "sieben", "acht", "neun"),
}
#: Letters whose bare capital espeak would read as a word ("A" as the article).
LETTER_NAMES: dict[Lang, dict[str, str]] = {"en": {"A": "ay"}, "de": {}}


def _month_table(lang: Lang) -> tuple[str, ...]:
    names = get_month_names("wide", locale=lang)
    return tuple(str(names[i]) for i in range(1, 13))


def _day_table(lang: Lang) -> tuple[str, ...]:
    names = get_day_names("wide", locale=lang)  # 0 = Monday in babel
    return tuple(str(names[i]) for i in range(7))


MONTHS: dict[Lang, tuple[str, ...]] = {"en": _month_table("en"), "de": _month_table("de")}
WEEKDAYS: dict[Lang, tuple[str, ...]] = {"en": _day_table("en"), "de": _day_table("de")}


def _abbreviations() -> dict[str, int]:
    """Written month forms (wide and abbreviated, both languages, without dots) -> 1..12."""
    out: dict[str, int] = {"Sept": 9, "Mär": 3, "Mrz": 3}
    for lang in ("en", "de"):
        for kind in ("wide", "abbreviated"):
            for i, name in get_month_names(kind, locale=lang).items():
                out[str(name).rstrip(".")] = int(i)
    return out


MONTH_FORMS: dict[str, int] = _abbreviations()


def _day_abbreviations() -> dict[str, int]:
    out: dict[str, int] = {"Tues": 1, "Thur": 3, "Thurs": 3}
    for lang in ("en", "de"):
        for kind in ("wide", "abbreviated", "short"):
            for i, name in get_day_names(kind, locale=lang).items():
                out[str(name).rstrip(".")] = int(i)
    return out


WEEKDAY_FORMS: dict[str, int] = _day_abbreviations()


@lru_cache(maxsize=8192)
def cardinal(n: int, lang: Lang) -> str:
    """``42`` -> "forty-two" / "zweiundvierzig" (US style: no "and", no commas)."""
    if len(str(abs(n))) > MAX_CARDINAL_DIGITS:
        return digits(str(abs(n)), lang)
    words = str(num2words(n, lang=lang))
    if lang == "en":
        words = words.replace(",", "").replace(" and ", " ")
    return words


def cardinal_one(n: int, lang: Lang, feminine: bool = False) -> str:
    """A count before a noun: German "ein"/"eine" for 1 ("ein Euro", "eine Stunde")."""
    if lang == "de" and n == 1:
        return "eine" if feminine else "ein"
    return cardinal(n, lang)


@lru_cache(maxsize=4096)
def ordinal(n: int, lang: Lang, case: str = "") -> str:
    """``3`` -> "third"; German "dritte" plus an ending (``case`` "r" -> "dritter",
    "n" -> "dritten")."""
    if len(str(abs(n))) > MAX_CARDINAL_DIGITS:
        return digits(str(abs(n)), lang)
    words = str(num2words(n, lang=lang, to="ordinal"))
    if lang == "en":
        return words.replace(",", "").replace(" and ", " ")
    return words + case


@lru_cache(maxsize=1024)
def year(n: int, lang: Lang) -> str:
    """``2026`` -> "twenty twenty-six" / "zweitausendsechsundzwanzig"."""
    words = str(num2words(n, lang=lang, to="year"))
    return words.replace(",", "").replace(" and ", " ") if lang == "en" else words


def digits(text: str, lang: Lang, *, phone: bool = False) -> str:
    """Each digit by name: ``"0142"`` -> "zero one four two"."""
    table = PHONE_DIGITS[lang] if phone else DIGITS[lang]
    return " ".join(table[ord(c) - 48] for c in text if "0" <= c <= "9")


def digit_groups(text: str, lang: Lang, *, phone: bool = True) -> str:
    """Digits in groups of at most four, groups separated by a pause (a comma)."""
    return ", ".join(digits(g, lang, phone=phone) for g in chunk_digits(text))


def chunk_digits(run: str) -> list[str]:
    """Split a digit run into groups of 2-4 digits for reading ("1234567" -> 123 4567)."""
    n = len(run)
    if n <= 4:
        return [run]
    k = -(-n // 4)  # groups of at most four
    base, extra = divmod(n, k)
    sizes = [base] * (k - extra) + [base + 1] * extra
    out, i = [], 0
    for size in sizes:
        out.append(run[i : i + size])
        i += size
    return out


def spell(token: str, lang: Lang) -> str:
    """An alphanumeric code letter by letter, digit by digit ("X7K9Q" -> "X seven K nine Q")."""
    names = LETTER_NAMES[lang]
    out = []
    for ch in token:
        if "0" <= ch <= "9":
            out.append(PHONE_DIGITS[lang][ord(ch) - 48])
        elif ch.isalpha():
            up = ch.upper()
            out.append(names.get(up, up))
    return " ".join(out)


def decimal(whole: str, frac: str, lang: Lang) -> str:
    """``3``, ``5`` -> "three point five" / "drei Komma fünf" (decimals digit by digit)."""
    point = "Komma" if lang == "de" else "point"
    return f"{cardinal(int(whole or '0'), lang)} {point} {digits(frac, lang)}"
