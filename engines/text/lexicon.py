"""Pronunciation lexicon: a text file of words and phrases with their spoken form.

Format (UTF-8, one entry a line; ``#`` starts a comment line; blank lines skipped)::

    phrase | lang | replacement [| flags]

* ``phrase``: a word or phrase as it appears in the spoken form (after
  normalisation; ``NORMALIZE:`` on the cmd port shows that form);
* ``lang``: ``de``, ``en`` or ``*`` (both);
* ``replacement``: a respelling (plain text, for every engine), or IPA
  phonemes between slashes ``/kˈoːkoɾo/`` (used by Kokoro only; an engine
  without IPA input keeps the phrase unless a respelling entry also exists);
* ``flags`` (optional, comma separated): ``case`` (match case-sensitively),
  ``part`` (match inside words too). By default a match is whole-word and
  case-insensitive.

Rule 1: parsing is pure and total: ``parse_lexicon`` returns the entries and
every bad line with its number and reason; it never raises.
Rule 2: matching is linear in the text: whole-word entries are looked up per
word position in a dict (at most ``MAX_PHRASE_WORDS`` words long), only
``part`` entries go through one regular expression.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from engines.text.lang import Lang

MAX_LEXICON_BYTES = 4 * 1024 * 1024
MAX_ENTRIES = 100_000
MAX_PHRASE_CHARS = 200
MAX_REPLACEMENT_CHARS = 500
MAX_PHRASE_WORDS = 8
LANGS = ("de", "en", "*")
FLAGS = frozenset({"case", "part"})

_WORD_RE = re.compile(r"[^\W_]+(?:['’][^\W_]+)*")
_SPACE_RE = re.compile(r"\s+")


@dataclass(frozen=True, slots=True)
class Entry:
    """One lexicon line."""

    phrase: str
    lang: str  # "de", "en" or "*"
    replacement: str  # the respelling, or the IPA without its slashes
    ipa: bool
    case: bool
    part: bool
    line: int


@dataclass(frozen=True, slots=True)
class Problem:
    """A bad line: its 1-based number (0 for the file as a whole) and why."""

    line: int
    reason: str

    def __str__(self) -> str:
        return f"{self.line}:{self.reason}"


def parse_lexicon(text: str) -> tuple[list[Entry], list[Problem]]:
    """Entries and problems of a lexicon file's text (Rule 1)."""
    entries: list[Entry] = []
    problems: list[Problem] = []
    seen: dict[tuple[str, str, bool, bool], int] = {}
    if len(text) > MAX_LEXICON_BYTES:
        return [], [Problem(0, f"file larger than {MAX_LEXICON_BYTES} bytes")]
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        entry = _parse_line(line, no)
        if isinstance(entry, Problem):
            problems.append(entry)
            continue
        key = (
            entry.phrase if entry.case else entry.phrase.lower(),
            entry.lang,
            entry.ipa,
            entry.part,
        )
        if key in seen:
            problems.append(Problem(no, f"duplicate of line {seen[key]}"))
            continue
        if len(entries) >= MAX_ENTRIES:
            problems.append(Problem(no, f"more than {MAX_ENTRIES} entries"))
            break
        seen[key] = no
        entries.append(entry)
    return entries, problems


def _parse_line(line: str, no: int) -> Entry | Problem:
    fields = [f.strip() for f in line.split("|")]
    if len(fields) not in (3, 4):
        return Problem(
            no, f"expected 'phrase | lang | replacement [| flags]', got {len(fields)} field(s)"
        )
    phrase, lang, repl = fields[0], fields[1].lower(), fields[2]
    flags_text = fields[3] if len(fields) == 4 else ""
    if not phrase:
        return Problem(no, "empty phrase")
    if len(phrase) > MAX_PHRASE_CHARS:
        return Problem(no, f"phrase longer than {MAX_PHRASE_CHARS} characters")
    if lang not in LANGS:
        return Problem(no, f"unknown language {fields[1][:16]!r} (de, en or *)")
    if not repl:
        return Problem(no, "empty replacement")
    if len(repl) > MAX_REPLACEMENT_CHARS:
        return Problem(no, f"replacement longer than {MAX_REPLACEMENT_CHARS} characters")
    if any(not ch.isprintable() for ch in phrase + repl):
        return Problem(no, "control character")
    flags = {f.strip().lower() for f in flags_text.split(",") if f.strip()}
    unknown = flags - FLAGS
    if unknown:
        return Problem(no, f"unknown flag {sorted(unknown)[0][:16]!r} (case, part)")
    ipa = False
    if repl.startswith("/") or repl.endswith("/"):
        if len(repl) < 3 or not (repl.startswith("/") and repl.endswith("/")):
            return Problem(no, "IPA must be written between two slashes: /.../")
        repl = repl[1:-1].strip()
        if not repl or "/" in repl:
            return Problem(no, "IPA between slashes is empty or contains a slash")
        ipa = True
    phrase = _SPACE_RE.sub(" ", phrase)
    words = _WORD_RE.findall(phrase)
    part = "part" in flags
    if not part:
        if not words:
            return Problem(no, "phrase has no word characters (use the 'part' flag)")
        if " ".join(words) != phrase:
            part = True  # punctuation inside ("C++", "e.V."): matched as written
        elif len(words) > MAX_PHRASE_WORDS:
            return Problem(no, f"phrase longer than {MAX_PHRASE_WORDS} words")
    return Entry(phrase, lang, repl, ipa, "case" in flags, part, no)


def read_lexicon(path: Path) -> tuple[list[Entry], list[Problem]]:
    """Parse a lexicon file; an unreadable or non-UTF-8 file is one problem (line 0 or
    the line of the first bad byte)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        return [], [Problem(0, f"cannot read {path}: {exc.strerror or exc}")]
    if len(data) > MAX_LEXICON_BYTES:
        return [], [Problem(0, f"file larger than {MAX_LEXICON_BYTES} bytes")]
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        return [], [Problem(data[: exc.start].count(b"\n") + 1, "not UTF-8")]
    return parse_lexicon(text)


@dataclass(frozen=True, slots=True)
class Hit:
    """A lexicon match in a text: the span and the entry that replaces it."""

    start: int
    end: int
    entry: Entry


@dataclass
class Lexicon:
    """Entries compiled for one language and one output kind (IPA allowed or not)."""

    entries: list[Entry] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._tables: dict[tuple[str, bool], _Table] = {}

    def __len__(self) -> int:
        return len(self.entries)

    def table(self, lang: Lang, ipa: bool) -> _Table:
        key = (lang, ipa)
        tab = self._tables.get(key)
        if tab is None:
            tab = _Table(self.entries, lang, ipa)
            self._tables[key] = tab
        return tab

    def hits(self, text: str, lang: Lang, ipa: bool) -> list[Hit]:
        """Non-overlapping matches in ``text``, left to right, longest first."""
        if not self.entries or not text:
            return []
        return self.table(lang, ipa).hits(text)


class _Table:
    """Lookup structures for one (language, IPA allowed) pair."""

    def __init__(self, entries: list[Entry], lang: Lang, ipa: bool) -> None:
        usable = [e for e in entries if e.lang in (lang, "*") and (ipa or not e.ipa)]
        # an IPA entry beats a respelling of the same phrase where IPA is allowed;
        # a language-specific entry beats a "*" one
        usable.sort(key=lambda e: (e.ipa, e.lang != "*"))
        self.exact: dict[str, Entry] = {}
        self.folded: dict[str, Entry] = {}
        parts: list[Entry] = []
        for e in usable:
            if e.part:
                parts.append(e)
            elif e.case:
                self.exact[e.phrase] = e
            else:
                self.folded[e.phrase.lower()] = e
        self.max_words = max(
            (len(_WORD_RE.findall(k)) for k in [*self.exact, *self.folded]), default=0
        )
        self.part_by_text: dict[str, Entry] = {}
        self.part_folded: dict[str, Entry] = {}
        alts: list[str] = []
        for e in sorted(parts, key=lambda e: len(e.phrase), reverse=True):
            if e.case:
                self.part_by_text[e.phrase] = e
                alts.append(re.escape(e.phrase))
            else:
                self.part_folded[e.phrase.lower()] = e
                alts.append(f"(?i:{re.escape(e.phrase)})")
        self.part_re = re.compile("|".join(alts)) if alts else None

    def hits(self, text: str) -> list[Hit]:
        found: list[Hit] = []
        if self.part_re is not None:
            for m in self.part_re.finditer(text):
                e = self.part_by_text.get(m.group(0)) or self.part_folded.get(m.group(0).lower())
                if e is not None:
                    found.append(Hit(m.start(), m.end(), e))
        if self.max_words:
            found.extend(self._word_hits(text, found))
        found.sort(key=lambda h: h.start)
        return found

    def _word_hits(self, text: str, taken: list[Hit]) -> Iterator[Hit]:
        words = [(m.start(), m.end()) for m in _WORD_RE.finditer(text)]
        blocked = sorted((h.start, h.end) for h in taken)
        i, n = 0, len(words)
        while i < n:
            hit: Hit | None = None
            for k in range(min(self.max_words, n - i), 0, -1):
                a, b = words[i][0], words[i + k - 1][1]
                gap_ok = all(
                    not text[words[j][1] : words[j + 1][0]].strip() for j in range(i, i + k - 1)
                )
                if not gap_ok:
                    continue
                span = _SPACE_RE.sub(" ", text[a:b])
                e = self.exact.get(span) or self.folded.get(span.lower())
                if e is not None and not any(x < b and a < y for x, y in blocked):
                    hit = Hit(a, b, e)
                    i += k
                    break
            if hit is not None:
                yield hit
            else:
                i += 1
