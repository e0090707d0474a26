"""Normaliser: written forms -> spoken words, per sentence, English and German.

Rule 1: one left-to-right pass of one regular expression whose alternatives
are the categories (emails and URLs, dates, phone numbers, times, money,
percentages, units, ordinals, codes, numbers, abbreviations, symbols), in
priority order; each match is replaced by its spoken form once and never
looked at again. Text between matches is kept as it is.
Rule 2: never raises: a match whose conversion fails (a date that is no
date, a number num2words rejects) is left exactly as written.
Rule 3: linear in the input: every alternative is a bounded repeat without
nesting, so the scan costs a constant per character; the output is at most
``MAX_EXPANSION`` times the input (a digit becomes one word).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

import phonenumbers

from engines.text.lang import Lang
from engines.text.words import (
    MAX_CARDINAL_DIGITS,
    MONTH_FORMS,
    MONTHS,
    WEEKDAY_FORMS,
    WEEKDAYS,
    cardinal,
    cardinal_one,
    chunk_digits,
    decimal,
    digit_groups,
    digits,
    ordinal,
    spell,
    year,
)

DateOrder = Literal["mdy", "dmy"]
MAX_EXPANSION = 24  # output chars per input char, at most (bounded output)
#: an identifier up to this long is read as one run of digits; longer ones in groups
#: with a pause between (a listener, and a recogniser, loses a long run)
MAX_UNGROUPED_DIGITS = 6


@dataclass(frozen=True)
class NormalizeOptions:
    """``date_order``: how English ``11/24`` is read (German always day first)."""

    date_order: DateOrder = "mdy"


# ------------------------------------------------------------------ tables (speech)

#: currency -> (en singular, en plural, en subunit sg, pl, de name, de subunit)
CURRENCIES: dict[str, tuple[str, str, str, str, str, str]] = {
    "$": ("dollar", "dollars", "cent", "cents", "Dollar", "Cent"),
    "USD": ("dollar", "dollars", "cent", "cents", "Dollar", "Cent"),
    "€": ("euro", "euros", "cent", "cents", "Euro", "Cent"),
    "EUR": ("euro", "euros", "cent", "cents", "Euro", "Cent"),
    "£": ("pound", "pounds", "penny", "pence", "Pfund", "Pence"),
    "GBP": ("pound", "pounds", "penny", "pence", "Pfund", "Pence"),
    "CHF": ("Swiss franc", "Swiss francs", "centime", "centimes", "Franken", "Rappen"),
}
_CURRENCY_WORDS = {
    "euro": "€",
    "euros": "€",
    "dollar": "$",
    "dollars": "$",
    "pound": "£",
    "pounds": "£",
    "franken": "CHF",
}

#: unit -> (en singular, en plural, de singular, de plural, de feminine)
UNITS: dict[str, tuple[str, str, str, str, bool]] = {
    "kg": ("kilogram", "kilograms", "Kilogramm", "Kilogramm", False),
    "g": ("gram", "grams", "Gramm", "Gramm", False),
    "mg": ("milligram", "milligrams", "Milligramm", "Milligramm", False),
    "µg": ("microgram", "micrograms", "Mikrogramm", "Mikrogramm", False),
    "km": ("kilometer", "kilometers", "Kilometer", "Kilometer", False),
    "m": ("meter", "meters", "Meter", "Meter", False),
    "cm": ("centimeter", "centimeters", "Zentimeter", "Zentimeter", False),
    "mm": ("millimeter", "millimeters", "Millimeter", "Millimeter", False),
    "l": ("liter", "liters", "Liter", "Liter", False),
    "ml": ("milliliter", "milliliters", "Milliliter", "Milliliter", False),
    "km/h": (
        "kilometer per hour",
        "kilometers per hour",
        "Kilometer pro Stunde",
        "Kilometer pro Stunde",
        False,
    ),
    "mph": ("mile per hour", "miles per hour", "Meile pro Stunde", "Meilen pro Stunde", True),
    "h": ("hour", "hours", "Stunde", "Stunden", True),
    "hr": ("hour", "hours", "Stunde", "Stunden", True),
    "hrs": ("hour", "hours", "Stunde", "Stunden", True),
    "Std": ("hour", "hours", "Stunde", "Stunden", True),
    "min": ("minute", "minutes", "Minute", "Minuten", True),
    "mins": ("minute", "minutes", "Minute", "Minuten", True),
    "Min": ("minute", "minutes", "Minute", "Minuten", True),
    "s": ("second", "seconds", "Sekunde", "Sekunden", True),
    "sec": ("second", "seconds", "Sekunde", "Sekunden", True),
    "Sek": ("second", "seconds", "Sekunde", "Sekunden", True),
    "kWh": ("kilowatt hour", "kilowatt hours", "Kilowattstunde", "Kilowattstunden", True),
    "kW": ("kilowatt", "kilowatts", "Kilowatt", "Kilowatt", False),
    "W": ("watt", "watts", "Watt", "Watt", False),
    "V": ("volt", "volts", "Volt", "Volt", False),
    "GB": ("gigabyte", "gigabytes", "Gigabyte", "Gigabyte", False),
    "MB": ("megabyte", "megabytes", "Megabyte", "Megabyte", False),
    "TB": ("terabyte", "terabytes", "Terabyte", "Terabyte", False),
    "°C": ("degree Celsius", "degrees Celsius", "Grad Celsius", "Grad Celsius", False),
    "°F": ("degree Fahrenheit", "degrees Fahrenheit", "Grad Fahrenheit", "Grad Fahrenheit", False),
    "°": ("degree", "degrees", "Grad", "Grad", False),
    "mi": ("mile", "miles", "Meile", "Meilen", True),
    "ft": ("foot", "feet", "Fuß", "Fuß", False),
    "lb": ("pound", "pounds", "Pfund", "Pfund", False),
    "lbs": ("pound", "pounds", "Pfund", "Pfund", False),
    "oz": ("ounce", "ounces", "Unze", "Unzen", True),
}

#: written abbreviation (with its dot) -> spoken, per language
ABBREVIATIONS: dict[Lang, dict[str, str]] = {
    "en": {
        "Dr.": "Doctor",
        "Mr.": "Mister",
        "Mrs.": "Missus",
        "Ms.": "Miz",
        "Prof.": "Professor",
        "Jr.": "Junior",
        "Sr.": "Senior",
        "St.": "Street",
        "Ave.": "Avenue",
        "Rd.": "Road",
        "Blvd.": "Boulevard",
        "Apt.": "apartment",
        "Dept.": "department",
        "No.": "number",
        "Nos.": "numbers",
        "hrs.": "hours",
        "hr.": "hour",
        "min.": "minutes",
        "mins.": "minutes",
        "sec.": "seconds",
        "approx.": "approximately",
        "appt.": "appointment",
        "ext.": "extension",
        "Ext.": "extension",
        "tel.": "phone",
        "Tel.": "phone",
        "etc.": "et cetera",
        "e.g.": "for example",
        "i.e.": "that is",
        "vs.": "versus",
        "Mt.": "Mount",
        "Ltd.": "Limited",
        "Inc.": "Incorporated",
        "Corp.": "Corporation",
        "a.m.": "a.m.",
        "p.m.": "p.m.",
    },
    "de": {
        "Dr.": "Doktor",
        "Hr.": "Herr",
        "Hrn.": "Herrn",
        "Fr.": "Frau",
        "Prof.": "Professor",
        "z. B.": "zum Beispiel",
        "z.B.": "zum Beispiel",
        "usw.": "und so weiter",
        "bzw.": "beziehungsweise",
        "ca.": "circa",
        "Str.": "Straße",
        "str.": "straße",
        "Nr.": "Nummer",
        "inkl.": "inklusive",
        "exkl.": "exklusive",
        "evtl.": "eventuell",
        "ggf.": "gegebenenfalls",
        "d. h.": "das heißt",
        "d.h.": "das heißt",
        "u. a.": "unter anderem",
        "u.a.": "unter anderem",
        "u. U.": "unter Umständen",
        "o. Ä.": "oder Ähnliches",
        "bspw.": "beispielsweise",
        "Tel.": "Telefon",
        "Std.": "Stunden",
        "Min.": "Minuten",
        "Mio.": "Millionen",
        "Mrd.": "Milliarden",
        "Tsd.": "Tausend",
        "St.": "Sankt",
        "MwSt.": "Mehrwertsteuer",
        "Abs.": "Absatz",
        "Hbf.": "Hauptbahnhof",
        "vgl.": "vergleiche",
        "gem.": "gemäß",
        "Jh.": "Jahrhundert",
        "Fa.": "Firma",
        "geb.": "geboren",
        "zzgl.": "zuzüglich",
        "Mo.": "Montag",
        "Di.": "Dienstag",
        "Mi.": "Mittwoch",
        "Do.": "Donnerstag",
        "Sa.": "Samstag",
        "So.": "Sonntag",
    },
}

SYMBOLS: dict[Lang, dict[str, str]] = {
    "en": {
        "&": "and",
        "+": "plus",
        "=": "equals",
        "@": "at",
        "§": "section",
        "~": "about",
        "×": "times",
        "#": "number",
        "°": "degrees",
    },
    "de": {
        "&": "und",
        "+": "plus",
        "=": "gleich",
        "@": "ät",
        "§": "Paragraf",
        "~": "circa",
        "×": "mal",
        "#": "Nummer",
        "°": "Grad",
    },
}
_URL_WORDS: dict[Lang, dict[str, str]] = {
    "en": {
        ".": "dot",
        "/": "slash",
        "-": "dash",
        "_": "underscore",
        "@": "at",
        ":": "colon",
        "?": "question mark",
        "=": "equals",
        "&": "and",
        "+": "plus",
        "#": "hash",
        "~": "tilde",
        "%": "percent",
    },
    "de": {
        ".": "Punkt",
        "/": "Schrägstrich",
        "-": "Bindestrich",
        "_": "Unterstrich",
        "@": "ät",
        ":": "Doppelpunkt",
        "?": "Fragezeichen",
        "=": "gleich",
        "&": "und",
        "+": "plus",
        "#": "Raute",
        "~": "Tilde",
        "%": "Prozent",
    },
}
#: after these words a number is an identifier and read digit by digit
_ID_WORDS = frozenset(
    "no. nr. # number nummer id pin code rx order ticket reference case account konto "
    "kundennummer bestellnummer auftragsnummer rechnungsnummer vorgangsnummer "
    "referenz sendung tracking".split()
)
_ID_BEFORE_RE = re.compile(
    r"(?:#|\b(?:Nr|No|Nummer|number|ID|Ref|PIN|order|ticket|[A-Za-zäöü]*nummer)\.?)[ \t]*\d+$",
    re.IGNORECASE,
)
_SPELLED_TLDS = frozenset({"de", "uk", "eu", "io", "us", "at", "ch", "tv"})
_RANGE_WORD: dict[Lang, str] = {"en": "to", "de": "bis"}
_PERCENT: dict[Lang, str] = {"en": "percent", "de": "Prozent"}
_TIMES_WORD: dict[Lang, str] = {"en": "times", "de": "mal"}
_FEMININE_DE = frozenset(
    "Minute Stunde Sekunde Woche Nacht Person Tablette Packung Flasche Kapsel Nummer Karte "
    "Rechnung Bestellung Lieferung Mail E-Mail Nachricht Frage Sendung Filiale Tür Etage".split()
)
_ORDINAL_CASE: dict[str, str] = {
    **dict.fromkeys("der die das".split(), ""),
    **dict.fromkeys(
        "zum zur am im vom beim dem den des einem einen einer ihrem ihren".split(), "n"
    ),
    **dict.fromkeys("ein ihr unser".split(), "r"),
}
_DATIVE_BEFORE = frozenset("am vom zum beim im dem ab seit an bis".split())

# ----------------------------------------------------------------- the one pattern

_MONTHS_RE = "|".join(sorted((re.escape(k) for k in MONTH_FORMS), key=len, reverse=True))
_WDAY_EN = (
    r"Mon|Tues?|Wed|Thu(?:rs?)?|Fri|Sat|Sun|Monday|Tuesday|Wednesday|Thursday|Friday|Saturday"
    r"|Sunday"
)
_WDAY_DE = r"Mo|Di|Mi|Do|Fr|Sa|So|Montag|Dienstag|Mittwoch|Donnerstag|Freitag|Samstag|Sonntag"
_DASH = r"[ \t]?[–—-][ \t]?"
_NUM = r"\d{1,3}(?:[.,\u202f\u00a0 ]\d{3})+(?:[.,]\d{1,2})?(?!\d)|\d{1,15}(?:[.,]\d{1,2})?(?!\d)"
_TIME = r"(?:[01]?\d|2[0-3])(?::[0-5]\d|\.[0-5]\d(?=[ \t]?(?:Uhr\b|[AaPp]\.?[ \t]?[Mm]\b)))"
_AMPM = r"[AaPp]\.?[ \t]?[Mm]\b\.?"
_UNITS_RE = "|".join(sorted((re.escape(u) for u in UNITS), key=len, reverse=True))
_ABBR_ALL = sorted({k for t in ABBREVIATIONS.values() for k in t}, key=len, reverse=True)
_ABBR_RE = "|".join(re.escape(a).replace(r"\ ", r"[ \t]?") for a in _ABBR_ALL)
_TLDS = r"com|org|net|de|at|ch|eu|io|info|biz|co\.uk|uk|us|gov|edu"

_PARTS: list[tuple[str, str]] = [
    ("email", r"[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}(?:\.[A-Za-z0-9-]{1,63}){1,6}"),
    ("url", r"(?:https?://|www\.)[^\s<>\"]{0,2000}[^\s<>\".,;:!?)\]']"),
    (
        "domain",
        rf"\b[A-Za-z0-9-]{{1,63}}(?:\.[A-Za-z0-9-]{{1,63}}){{0,4}}\.(?:{_TLDS})\b"
        r"(?:/[^\s<>\"]{0,500}[^\s<>\".,;:!?)\]'])?",
    ),
    ("iso", r"\b\d{4}-\d{2}-\d{2}\b"),
    (
        "tel",
        r"(?<![\w+])\+\d{1,3}(?:[ \t./-]?\(?\d{1,5}\)?){1,6}(?![\w])"
        r"|\(\d{3}\)[ \t]?\d{3}[-. \t]\d{4}\b"
        r"|\b\d{3}[-.]\d{3}[-.]\d{4}\b"
        r"|\b\d{3}-\d{4}\b"
        r"|\(0\d{2,5}\)[ \t]?\d{2,8}(?:[ \t-]\d{2,8}){0,3}\b"
        r"|\b0\d{2,5}(?:(?:[ \t]?[/-][ \t]?|[ \t])\d{2,8}){1,4}\b",
    ),
    ("dmy", r"\b\d{1,2}\.\d{1,2}\.(?:\d{4}\b|\d{2}\b)?"),
    ("twentyfourseven", r"\b24/7\b"),
    ("slashdate", r"\b\d{1,2}/\d{1,2}(?:/\d{4}|/\d{2})?\b(?!/)"),
    ("trange", rf"\b{_TIME}(?:[ \t]?{_AMPM})?{_DASH}{_TIME}(?:[ \t]?(?:Uhr\b|{_AMPM}))?"),
    ("time", rf"\b{_TIME}(?:[ \t]?(?:Uhr\b|h\b|{_AMPM}))?"),
    ("ampm", rf"\b(?:1[0-2]|0?[1-9])[ \t]?{_AMPM}"),
    ("mdate", rf"\b(?:{_MONTHS_RE})\.?[ \t]\d{{1,2}}(?:st|nd|rd|th)?\b(?:,?[ \t]\d{{4}}\b)?"),
    (
        "dmonth",
        rf"\b\d{{1,2}}(?:st|nd|rd|th|\.)?[ \t](?:of[ \t])?(?:{_MONTHS_RE})\b\.?"
        r"(?:,?[ \t]\d{4}\b)?",
    ),
    ("deord", r"\b\d{1,3}\.(?=[ \t]+[A-ZÄÖÜ][a-zäöüß])"),
    ("dayrange", rf"\b(?:{_WDAY_EN}|{_WDAY_DE})\b\.?{_DASH}(?:{_WDAY_EN}|{_WDAY_DE})\b\.?"),
    (
        "money",
        rf"(?:[$€£]|\b(?:EUR|USD|GBP|CHF)[ \t]?)[ \t]?(?:{_NUM})"
        r"(?:[ \t]?(?:million|billion|Mio\.|Mrd\.|k\b))?"
        rf"|(?:{_NUM})[ \t]?(?:[$€£]|(?:EUR|USD|GBP|CHF|Euro|euros?|dollars?|Dollar)\b)",
    ),
    ("percent", rf"(?<![\w%.,])[-−](?:{_NUM})[ \t]?%|(?:{_NUM})[ \t]?%"),
    ("times", r"\b\d{1,2}[ \t]?[x×](?=[ \t]|$|[.,;])"),
    (
        "unit",
        rf"(?<![\w.,%])[-−](?:{_NUM})[ \t]?(?:{_UNITS_RE})(?![\w°])\.?"
        rf"|(?:{_NUM})[ \t]?(?:{_UNITS_RE})(?![\w°])\.?",
    ),
    ("ordinal", r"\b\d{1,9}(?:st|nd|rd|th)\b"),
    ("hash", r"#[ \t]?\d{1,30}\b"),
    ("code", r"\b(?=[A-Za-z]{0,23}\d)(?=\d{0,23}[A-Za-z])[A-Za-z0-9]{2,24}\b"),
    ("num", rf"(?<![\w.,%])[-−](?:{_NUM})|(?:{_NUM})|\d{{16,}}"),
    ("abbr", rf"(?<![\w.])(?:{_ABBR_RE})"),
    ("wday", rf"\b(?:{_WDAY_EN})\b\.?(?=,)"),
    ("month", r"\b(?:Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Sept|Oct|Okt|Nov|Dec|Dez)\."),
    ("street", r"(?<=[a-zäöü])str\.|(?<=[a-zäöü])Str\."),
    (
        "dash",
        r"[ \t]?[–—][ \t]?|(?<=\d)-(?=[\d$€£])|(?<=[AaPp][Mm])-(?=\d)|(?<=[Mm]\.)-(?=\d)"
        r"|(?<=%)-(?=\d)|(?<!\w)-(?=\d)",
    ),
    ("sym", r"[&+=@§~×#°]"),
]
_PATTERN = re.compile("|".join(f"(?P<{name}>{rx})" for name, rx in _PARTS))
_NUMBERS = re.compile(f"(?P<num>{dict(_PARTS)['num']})")  # the fallback inside a match


class _Pass:
    """One sentence's normalisation (the callbacks see the language and options)."""

    def __init__(self, lang: Lang, opts: NormalizeOptions) -> None:
        self.lang = lang
        self.opts = opts

    def __call__(self, m: re.Match[str]) -> str:
        kind = m.lastgroup or ""
        if not m.group(0).isascii() and any(c.isdigit() and c > "9" for c in m.group(0)):
            return m.group(0)  # other scripts' digits (e.g. Arabic-Indic): no rules for them
        try:
            out = getattr(self, kind)(m)
        except Exception:  # Rule 2: whatever fails is left as written
            return m.group(0)
        if out is None:  # not what the pattern suggested: at least say its numbers
            if kind == "num":
                return m.group(0)
            return _pad(m, _NUMBERS.sub(self, m.group(0)))
        return str(out) if kind == "street" else _pad(m, str(out))

    # -- helpers -------------------------------------------------------------------

    def prev_word(self, m: re.Match[str]) -> str:
        head = m.string[max(0, m.start() - 12) : m.start()].split()
        return head[-1].lower() if head else ""

    def number(self, text: str) -> str:
        """A written number (thousands separators and decimals per language) in words."""
        value = _parse_number(text, self.lang)
        if value is None:
            return text
        whole, frac = value
        if len(whole) > MAX_CARDINAL_DIGITS:
            return digit_groups(whole, self.lang, phone=False)
        if frac:
            return decimal(whole, frac, self.lang)
        return cardinal(int(whole), self.lang)

    # -- categories ----------------------------------------------------------------

    def email(self, m: re.Match[str]) -> str:
        local, _, domain = m.group(0).partition("@")
        return f"{self.spell_url(local)} {_URL_WORDS[self.lang]['@']} {self.spell_url(domain)}"

    def url(self, m: re.Match[str]) -> str:
        text = re.sub(r"^https?://", "", m.group(0))
        return self.spell_url(text.rstrip("/"))

    def domain(self, m: re.Match[str]) -> str:
        return self.spell_url(m.group(0).rstrip("/"))

    def spell_url(self, text: str) -> str:
        names = _URL_WORDS[self.lang]
        out: list[str] = []
        for piece in re.split(r"([^A-Za-z0-9ÄÖÜäöüß])", text):
            if not piece:
                continue
            if piece in names:
                out.append(names[piece])
            elif piece.isdigit():
                out.append(digits(piece, self.lang) if len(piece) > 2 else self.number(piece))
            elif piece.lower() in _SPELLED_TLDS:
                out.append(spell(piece, self.lang))
            elif any(c.isdigit() for c in piece):
                out.append(" ".join(_split_alnum(piece, self.lang)))
            elif piece.strip():
                out.append(piece.lower() if piece.isupper() and len(piece) > 3 else piece)
        return " ".join(out)

    def iso(self, m: re.Match[str]) -> str | None:
        y, mo, d = (int(x) for x in m.group(0).split("-"))
        return self.date(d, mo, y, m)

    def dmy(self, m: re.Match[str]) -> str | None:
        parts = [p for p in m.group(0).split(".") if p]
        d, mo = int(parts[0]), int(parts[1])
        y = int(parts[2]) if len(parts) > 2 else None
        if y is not None and y < 100:
            y += 2000
        if self.lang == "en" and y is None:
            return None  # "3.12." in English text: leave it
        out = self.date(d, mo, y, m)
        if out is not None and y is None and m.group(0).endswith(".") and _at_end(m):
            out += "."
        return out

    def slashdate(self, m: re.Match[str]) -> str | None:
        parts = [int(p) for p in m.group(0).split("/")]
        if self.lang == "de":
            return None
        a, b = parts[0], parts[1]
        y = parts[2] if len(parts) > 2 else None
        if y is not None and y < 100:
            y += 2000
        d, mo = (b, a) if self.opts.date_order == "mdy" else (a, b)
        return self.date(d, mo, y, m)

    def date(self, d: int, mo: int, y: int | None, m: re.Match[str]) -> str | None:
        if not (1 <= mo <= 12 and 1 <= d <= 31):
            return None
        lang = self.lang
        month = MONTHS[lang][mo - 1]
        if lang == "en":
            out = f"{month} {ordinal(d, 'en')}"
            return f"{out}, {year(y, 'en')}" if y is not None else out
        prev = self.prev_word(m)
        lead = ""
        if prev == "bis":
            lead = "zum "
        case = "n" if prev in _DATIVE_BEFORE else "r"
        if prev in {"der", "die", "das"}:
            case = ""
        out = f"{lead}{ordinal(d, 'de', case)} {month}"
        return f"{out} {year(y, 'de')}" if y is not None else out

    def twentyfourseven(self, m: re.Match[str]) -> str:
        return "rund um die Uhr" if self.lang == "de" else "twenty-four seven"

    def tel(self, m: re.Match[str]) -> str | None:
        text = m.group(0)
        groups = re.findall(r"\d+", text)
        plus = text.lstrip().startswith("+")
        if len(groups) == 1 or (plus and len(groups) == 2 and len(groups[1]) > 6):
            groups = _phone_groups(text, self.lang) or groups
        words = [digit_groups(g, self.lang) for g in groups]
        lead = "plus " if plus else ""
        return lead + ", ".join(words)

    def time(self, m: re.Match[str]) -> str | None:
        return self.say_time(m.group(0), None)

    def trange(self, m: re.Match[str]) -> str | None:
        text = m.group(0)
        a, b = re.split(r"[ \t]?[–—-][ \t]?", text, maxsplit=1)
        ha = int(re.match(r"\d+", a).group(0))  # type: ignore[union-attr]
        hb = int(re.match(r"\d+", b).group(0))  # type: ignore[union-attr]
        both_uhr = b.rstrip().endswith("Uhr")
        left = self.say_time(a + (" Uhr" if both_uhr and "Uhr" not in a else ""), hb)
        right = self.say_time(b, ha)
        if left is None or right is None:
            return None
        return f"{left} {_RANGE_WORD[self.lang]} {right}"

    def say_time(self, text: str, partner: int | None) -> str | None:
        mt = re.match(r"(\d{1,2})[:.](\d{2})", text)
        if mt is None:
            return None
        h, mi = int(mt.group(1)), int(mt.group(2))
        rest = text[mt.end() :].strip().lower().replace(".", "").replace(" ", "")
        sep_dot = text[mt.end(1)] == "."
        if self.lang == "de":
            if sep_dot and rest != "uhr":
                return None  # "3.30" without "Uhr" is a decimal
            if rest in ("am", "pm"):
                h = _to24(h, rest)
            hour = "ein" if h == 1 else cardinal(h, "de")
            return f"{hour} Uhr" + (f" {cardinal(mi, 'de')}" if mi else "")
        if sep_dot and rest not in ("am", "pm"):
            return None
        ap = rest if rest in ("am", "pm") else None
        if ap is None and (h >= 13 or (partner is not None and partner >= 13 and h < 12)):
            ap = "pm" if h >= 12 else "am"
        if ap is None and h == 0:
            ap = "am"
        h12 = h % 12 or 12 if (ap is not None or h > 12) else h
        if mi == 0:
            minutes = "" if ap else (" noon" if h == 12 else " o'clock")
        elif mi < 10:
            minutes = f" oh {cardinal(mi, 'en')}"
        else:
            minutes = f" {cardinal(mi, 'en')}"
        suffix = f" {ap[0]}.m." if ap else ""
        return f"{cardinal(h12, 'en')}{minutes}{suffix}"

    def ampm(self, m: re.Match[str]) -> str:
        mt = re.match(r"(\d{1,2})[ \t]?([AaPp])", m.group(0))
        assert mt is not None
        h, ap = int(mt.group(1)), mt.group(2).lower() + "m"
        if self.lang == "de":
            h24 = _to24(h, ap)
            return f"{'ein' if h24 == 1 else cardinal(h24, 'de')} Uhr"
        out = f"{cardinal(h, 'en')} {ap[0]}.m."
        return out + "." if _at_end(m) and m.group(0).endswith(".") else out

    def mdate(self, m: re.Match[str]) -> str | None:
        mt = re.match(r"([^\W\d]+)\.?[ \t](\d{1,2})(?:st|nd|rd|th)?(?:,?[ \t](\d{4}))?", m.group(0))
        if mt is None or mt.group(1) not in MONTH_FORMS:
            return None
        y = int(mt.group(3)) if mt.group(3) else None
        return self.date(int(mt.group(2)), MONTH_FORMS[mt.group(1)], y, m)

    def dmonth(self, m: re.Match[str]) -> str | None:
        mt = re.match(
            r"(\d{1,2})(st|nd|rd|th|\.)?[ \t](of[ \t])?([^\W\d]+)\.?(?:,?[ \t](\d{4}))?", m.group(0)
        )
        if mt is None or mt.group(4) not in MONTH_FORMS:
            return None
        d, mo = int(mt.group(1)), MONTH_FORMS[mt.group(4)]
        y = int(mt.group(5)) if mt.group(5) else None
        if self.lang == "en":
            if not (1 <= d <= 31):
                return None
            the = "" if self.prev_word(m) == "the" else "the "
            out = f"{the}{ordinal(d, 'en')} of {MONTHS['en'][mo - 1]}"
            if y is not None:
                return f"{out}, {year(y, 'en')}"
            return out + self._month_dot(m, mt.group(4))
        if mt.group(2) not in (".", None) and self.lang == "de":
            return None
        if mt.group(2) is None:
            return None  # "5 Mai" without the ordinal dot: leave the number to the number rule
        said = self.date(d, mo, y, m)
        return None if said is None else said + self._month_dot(m, mt.group(4))

    def _month_dot(self, m: re.Match[str], word: str) -> str:
        """The sentence's full stop that the pattern took as an abbreviation dot."""
        if not m.group(0).endswith(".") or m.group(0).endswith(word):
            return ""
        full = word in MONTHS["en"] or word in MONTHS["de"]
        return "." if full or _at_end(m) else ""

    def deord(self, m: re.Match[str]) -> str | None:
        """German "zum 2. Stock" -> "zum zweiten Stock" (after an article or preposition)."""
        prev = self.prev_word(m)
        if self.lang != "de" or prev not in _ORDINAL_CASE:
            return None
        return ordinal(int(m.group(0)[:-1]), "de", _ORDINAL_CASE[prev])

    def dayrange(self, m: re.Match[str]) -> str | None:
        a, b = re.split(r"[ \t]?[–—-][ \t]?", m.group(0), maxsplit=1)
        da, db = WEEKDAY_FORMS.get(a.rstrip(".")), WEEKDAY_FORMS.get(b.rstrip("."))
        if da is None or db is None:
            return None
        days = WEEKDAYS[self.lang]
        return f"{days[da]} {_RANGE_WORD[self.lang]} {days[db]}"

    def wday(self, m: re.Match[str]) -> str | None:
        d = WEEKDAY_FORMS.get(m.group(0).rstrip("."))
        return None if d is None else WEEKDAYS[self.lang][d]

    def month(self, m: re.Match[str]) -> str | None:
        mo = MONTH_FORMS.get(m.group(0).rstrip("."))
        if mo is None:
            return None
        out = MONTHS[self.lang][mo - 1]
        return out + "." if _at_end(m) else out

    def money(self, m: re.Match[str]) -> str | None:
        text = m.group(0)
        cur_m = re.search(r"[$€£]|EUR|USD|GBP|CHF|Euro|euros?|dollars?|Dollar", text)
        if cur_m is None:
            return None
        cur = cur_m.group(0)
        code = _CURRENCY_WORDS.get(cur.lower(), cur)
        names = CURRENCIES[code]
        amount = re.search(_NUM, text)
        if amount is None:
            return None
        value = _parse_amount(amount.group(0))
        if value is None:
            return None
        whole, cents = value
        mag = re.search(r"(million|billion|Mio\.|Mrd\.|k)\s*$", text)
        lang = self.lang
        if mag is not None:
            scale = {
                "million": "million",
                "billion": "billion",
                "Mio.": "million",
                "Mrd.": "billion",
                "k": "thousand",
            }[mag.group(1)]
            if lang == "de":
                scale = {"million": "Millionen", "billion": "Milliarden", "thousand": "tausend"}[
                    scale
                ]
            num = self.number(amount.group(0)) if cents else cardinal(whole, lang)
            plural = names[4] if lang == "de" else names[1]
            return f"{num} {scale} {plural}"
        if lang == "de":
            main, sub = names[4], names[5]
            if whole == 0 and cents:
                return f"{cardinal(cents, 'de')} {sub}"
            out = f"{cardinal_one(whole, 'de')} {main}"
            return f"{out} {cardinal(cents, 'de')}" if cents else out
        sg, pl, sub_sg, sub_pl = names[0], names[1], names[2], names[3]
        cents_words = f"{cardinal(cents, 'en')} {sub_sg if cents == 1 else sub_pl}"
        if whole == 0 and cents:
            return cents_words
        out = f"{cardinal(whole, 'en')} {sg if whole == 1 else pl}"
        return f"{out} and {cents_words}" if cents else out

    def percent(self, m: re.Match[str]) -> str:
        text = m.group(0).rstrip("%").strip()
        neg = text[:1] in "-−"
        words = self.number(text.lstrip("-−"))
        return ("minus " if neg else "") + f"{words} {_PERCENT[self.lang]}"

    def times(self, m: re.Match[str]) -> str:
        n = int(re.match(r"\d+", m.group(0)).group(0))  # type: ignore[union-attr]
        if self.lang == "de":
            return ("ein" if n == 1 else cardinal(n, "de")) + "mal"
        return {1: "once", 2: "twice"}.get(n, f"{cardinal(n, 'en')} times")

    def unit(self, m: re.Match[str]) -> str | None:
        text = m.group(0)
        neg = text[:1] in "-−"
        if neg:
            text = text[1:]
        amount = re.match(_NUM, text)
        if amount is None:
            return None
        unit = text[amount.end() :].strip()
        dot = unit.endswith(".") and unit.rstrip(".") in UNITS
        if dot:
            unit = unit[:-1]
        if unit not in UNITS:
            return None
        en_sg, en_pl, de_sg, de_pl, fem = UNITS[unit]
        value = _parse_number(amount.group(0), self.lang)
        if value is None:
            return None
        whole, frac = value
        one = whole == "1" and not frac
        if self.lang == "de":
            num = cardinal_one(1, "de", fem) if one else self.number(amount.group(0))
            out = f"{num} {de_sg if one else de_pl}"
        else:
            out = f"{self.number(amount.group(0))} {en_sg if one else en_pl}"
        if neg:
            out = "minus " + out
        return out + "." if dot and _at_end(m) else out

    def ordinal(self, m: re.Match[str]) -> str:
        n = int(re.match(r"\d+", m.group(0)).group(0))  # type: ignore[union-attr]
        return ordinal(n, "en") if self.lang == "en" else cardinal(n, "de")

    def hash(self, m: re.Match[str]) -> str:
        run = re.search(r"\d+", m.group(0)).group(0)  # type: ignore[union-attr]
        word = SYMBOLS[self.lang]["#"]
        if len(run) > MAX_UNGROUPED_DIGITS:
            return f"{word} {digit_groups(run, self.lang, phone=True)}"
        if len(run) > 3:
            return f"{word} {digits(run, self.lang, phone=True)}"
        return f"{word} {cardinal(int(run), self.lang)}"

    def code(self, m: re.Match[str]) -> str:
        return " ".join(_split_alnum(m.group(0), self.lang))

    def num(self, m: re.Match[str]) -> str | None:
        text = m.group(0)
        neg = text[:1] in "-−"
        body = text.lstrip("-−")
        if body.isdigit():
            if len(body) > MAX_CARDINAL_DIGITS:
                return digit_groups(body, self.lang, phone=False)
            if (body.startswith("0") and len(body) > 1) or len(body) >= 5:
                if len(body) <= MAX_UNGROUPED_DIGITS:  # an ID, a postcode: one run, no pause
                    return ("minus " if neg else "") + digits(body, self.lang, phone=True)
                grouped = _phone_groups(body, self.lang) if body.startswith("0") else None
                words = ", ".join(
                    digits(g, self.lang, phone=True) for g in (grouped or chunk_digits(body))
                )
                return ("minus " if neg else "") + words
            if len(body) >= 4 and self.prev_word(m) in _ID_WORDS:
                if len(body) <= MAX_UNGROUPED_DIGITS:
                    return digits(body, self.lang, phone=True)
                return digit_groups(body, self.lang)
            n = int(body)
            if n == 1 and self.lang == "de" and not neg:
                nxt = re.match(r"[ \t]+([A-ZÄÖÜ][a-zäöüß]+)", m.string[m.end() : m.end() + 30])
                if nxt is not None:
                    return "eine" if nxt.group(1) in _FEMININE_DE else "ein"
            if len(body) == 4 and (1100 <= n <= 1999 or (self.lang == "en" and n <= 2099)):
                if not neg and self._year_context(m):
                    return year(n, self.lang)
        words = self.number(body)
        return ("minus " if neg else "") + words

    def _year_context(self, m: re.Match[str]) -> bool:
        prev = self.prev_word(m)
        after = m.string[m.end() : m.end() + 2]
        if self.lang == "de":
            return True  # 1100-1999 in German are years ("neunzehnhundert...")
        if re.search(r"\b\d{4}[ \t]?[–—-][ \t]?$", m.string[max(0, m.start() - 8) : m.start()]):
            return True  # the end of a range of years: "2020-2024"
        return prev in {
            "in",
            "since",
            "of",
            "until",
            "by",
            "from",
            "year",
            "till",
            "before",
            "after",
            "around",
            "during",
            "spring",
            "summer",
            "fall",
            "winter",
        } or (not after[:1].isalpha() and prev in {"", ","})

    def abbr(self, m: re.Match[str]) -> str | None:
        text = re.sub(r"[ \t]", " ", m.group(0))
        table = ABBREVIATIONS[self.lang]
        key = text if text in table else text.replace(" ", "")
        if key not in table:
            # "z. B." written with a space variant
            alt = {k.replace(" ", ""): k for k in table}.get(text.replace(" ", ""))
            if alt is None:
                return None
            key = alt
        out = table[key]
        after = m.string[m.end() : m.end() + 40]
        if self.lang == "en":
            if key == "St." and re.match(r"[ \t]+[A-Z]", after):
                out = "Saint"
            if key in ("No.", "Nos.") and not re.match(r"[ \t]*#?\d", after):
                return None  # "No." as the word "no"
        if self.lang == "de" and key == "Fr.":
            if re.match(r"[ \t]*(?:,|\d|[–—-]|bis\b)", after) or self.prev_word(m) in (
                "bis",
                "-",
                "–",
            ):
                out = "Freitag"
        if key in ("a.m.", "p.m."):
            return None
        if _at_end(m):
            out += "."
        return out

    def dash(self, m: re.Match[str]) -> str | None:
        s, a, b = m.string, m.start(), m.end()
        before = s[:a].rstrip()[-1:]
        after = s[b:].lstrip()[:1]
        prev_tail = s[max(0, a - 5) : a].rstrip().lower()
        timeish = prev_tail.endswith(("am", "pm", "a.m.", "p.m.", "uhr"))
        if after.isdigit() and not before:
            return "minus "
        if before.isdigit() and _ID_BEFORE_RE.search(s[max(0, a - 40) : a]):
            return ", "  # inside an identifier ("Nr. 2026-0042"): a pause, not a range
        if (before.isdigit() or before == "%" or timeish) and (after.isdigit() or after in "$€£"):
            head = s[max(0, a - 30) : a].lower()
            if re.search(r"\b(?:between|zwischen)\s+\S+$", head):
                return " and " if self.lang == "en" else " und "
            return f" {_RANGE_WORD[self.lang]} "
        if m.group(0).strip() in ("–", "—"):
            return ", " if before and after and before not in ".,;:!?" else " "
        if after.isdigit() and before in "(:,;=":
            return "minus "
        return None

    def street(self, m: re.Match[str]) -> str:
        out = "straße" if self.lang == "de" else "street"
        return out + "." if _at_end(m) else out

    def sym(self, m: re.Match[str]) -> str | None:
        ch = m.group(0)
        word = SYMBOLS[self.lang].get(ch)
        if word is None:
            return None
        if ch == "#":
            return " "
        if ch == "~":
            after = m.string[m.end() : m.end() + 1]
            return f"{word} " if after.isdigit() or after == " " else None
        return word


def _pad(m: re.Match[str], out: str) -> str:
    """Keep the replacement a separate word from its neighbours (also from a neighbouring
    symbol that becomes a word itself: "C++" -> "C plus plus")."""
    s, a, b = m.string, m.start(), m.end()
    if a > 0 and out[:1].isalnum() and not s[a - 1].isspace() and s[a - 1] not in _OPENERS:
        out = " " + out
    if b < len(s) and out[-1:].isalnum() and not s[b].isspace() and s[b] not in _CLOSERS:
        out = out + " "
    return out


_OPENERS = frozenset("([{\"'„“«/-–—")
_CLOSERS = frozenset(".,;:!?)]}\"'”»/-–—…")


def _at_end(m: re.Match[str]) -> bool:
    """The match ends its sentence (only blanks follow): a dot it swallowed is put back."""
    return not m.string[m.end() :].strip()


def _to24(h: int, ap: str) -> int:
    h %= 12
    return h + 12 if ap == "pm" else h


def _split_alnum(token: str, lang: Lang) -> list[str]:
    """A code: "12B" -> twelve B; "X7K9Q" -> X seven K nine Q."""
    runs = re.findall(r"\d+|[^\W\d_]+", token)
    if (
        len(runs) == 2
        and runs[0].isdigit()
        and len(runs[0]) <= 3
        and not runs[0].startswith("0")
        and len(runs[1]) == 1
    ):
        return [cardinal(int(runs[0]), lang), spell(runs[1], lang)]
    return [spell(token, lang)]


def _phone_groups(text: str, lang: Lang) -> list[str] | None:
    """Digit groups of a phone number written without them, from phonenumbers' format."""
    region = "DE" if lang == "de" else "US"
    try:
        num = phonenumbers.parse(text, region)
    except phonenumbers.NumberParseException:
        return None
    if not phonenumbers.is_possible_number(num):
        return None
    fmt = (
        phonenumbers.PhoneNumberFormat.INTERNATIONAL
        if text.lstrip().startswith("+")
        else phonenumbers.PhoneNumberFormat.NATIONAL
    )
    out = re.findall(r"\d+", phonenumbers.format_number(num, fmt))
    groups: list[str] = []
    for g in out:
        groups.extend(chunk_digits(g))
    if "".join(groups) != "".join(re.findall(r"\d+", text)):
        return None  # a reformatted number (e.g. an "00" prefix dropped): keep every digit
    return groups or None


def _parse_number(text: str, lang: Lang) -> tuple[str, str] | None:
    """(whole digits, fraction digits) of a written number by the language's rules."""
    t = text.replace("\u202f", " ").replace("\u00a0", " ")
    dec, thou = (",", ".") if lang == "de" else (".", ",")
    grouped = r"\d{1,3}(?:[ " + re.escape(thou) + r"]\d{3})+(?:" + re.escape(dec) + r"\d+)?"
    if re.fullmatch(grouped, t):
        whole, _, frac = t.partition(dec)
        return whole.replace(thou, "").replace(" ", ""), frac
    mt = re.fullmatch(r"(\d+)(?:[.,](\d+))?", t)
    if mt is None:
        return None
    return mt.group(1), mt.group(2) or ""


def _parse_amount(text: str) -> tuple[int, int] | None:
    """(units, cents) of a money amount: a separator before 1-2 final digits is the
    decimal mark, any other separator groups thousands (both languages)."""
    t = text.replace("\u202f", " ").replace("\u00a0", " ").strip()
    cut = max(t.rfind("."), t.rfind(","))
    frac = ""
    if cut >= 0 and 1 <= len(t) - cut - 1 <= 2:
        t, frac = t[:cut], t[cut + 1 :]
    whole = re.sub(r"[., ]", "", t)
    if not whole.isdigit() or len(whole) > MAX_CARDINAL_DIGITS or not (frac.isdigit() or not frac):
        return None
    cents = int(frac.ljust(2, "0")) if frac else 0
    return int(whole), cents


_SPACES_RE = re.compile(r"[ \t]{2,}")
_SPACE_PUNCT_RE = re.compile(r"[ \t]+(?=[,.!?;:])")
_DOUBLE_DOT_RE = re.compile(r"(?<!\.)\.\.(?!\.)")


def normalize(text: str, lang: Lang, opts: NormalizeOptions | None = None) -> str:
    """The spoken form of one sentence in ``lang``; unparseable text stays as written."""
    if not text:
        return text
    try:
        out = _PATTERN.sub(_Pass(lang, opts or NormalizeOptions()), text)
    except Exception:  # pragma: no cover - Rule 2: the pass itself never fails a call
        return text
    out = _SPACES_RE.sub(" ", out)
    out = _DOUBLE_DOT_RE.sub(".", out)
    return _SPACE_PUNCT_RE.sub("", out).strip()
