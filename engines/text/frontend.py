"""The telephony text front end: markup filter -> normaliser -> lexicon.

Rule 1: ``TextFrontEnd.speak`` turns one text packet into ``Spoken``: a
sequence of segments, each plain text or IPA (IPA only for an engine that
takes it, i.e. Kokoro), with the language of the sentence it came from.
``Spoken.text`` is its one-line form: what ``NORMALIZE:`` answers and what the
engines' caches key on.
Rule 2: thread-safe and never raises for any input text; the lexicon is
swapped atomically on reload (a synthesis in flight keeps the lexicon it
started with), and a bad file keeps the old lexicon.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from engines.text.lang import LANGUAGE_NAMES, Lang, LangOption, detect_language, split_sentences
from engines.text.lexicon import Lexicon, Problem, read_lexicon
from engines.text.markup import strip_markup
from engines.text.normalize import DateOrder, NormalizeOptions, normalize

log = structlog.get_logger(__name__)

_NON_WORD_RE = re.compile(r"[\W\d_]+")
_MARKS = frozenset(",.;:!?…")


def clean_text(text: str) -> str:
    """Collapse whitespace and drop control characters."""
    text = "".join(ch if ch.isprintable() else " " for ch in text)
    return " ".join(text.split())


@dataclass(frozen=True)
class TextOptions:
    """Front-end options (``--no-normalize``, ``--lexicon``, ``--date-order``)."""

    normalize: bool = True  # markup filter and normaliser; False: whitespace clean-up only
    lexicon: Path | None = None
    date_order: DateOrder = "mdy"


@dataclass(frozen=True, slots=True)
class Segment:
    """A piece of the spoken form: plain text, or IPA phonemes from the lexicon."""

    text: str
    lang: Lang
    ipa: bool = False


@dataclass(frozen=True)
class Spoken:
    """What an engine speaks for one text packet."""

    segments: tuple[Segment, ...]

    @property
    def text(self) -> str:
        """One line: text segments as they are, IPA segments between slashes."""
        out: list[str] = []
        for seg in self.segments:
            piece = f"/{seg.text}/" if seg.ipa else seg.text
            if out and not (not seg.ipa and piece[:1] in _MARKS):
                out.append(" ")
            out.append(piece)
        return "".join(out)

    @property
    def key(self) -> str:
        """Text, kind and language of every segment: the cache key of an utterance."""
        return "\x1f".join(f"{s.lang}{'/' if s.ipa else ':'}{s.text}" for s in self.segments)

    @property
    def lang(self) -> Lang:
        """The language of the first segment (German for empty text, as the reference)."""
        return self.segments[0].lang if self.segments else "de"

    def __bool__(self) -> bool:
        return bool(self.segments)


@dataclass(frozen=True)
class LexiconReload:
    """Outcome of a lexicon (re)load: the entries in use and the bad lines found."""

    entries: int
    problems: tuple[Problem, ...] = ()
    loaded: bool = True  # False: the old lexicon was kept

    @property
    def ok(self) -> bool:
        return not self.problems


class LexiconError(ValueError):
    """The ``--lexicon`` file given at start-up has bad lines (``problems``)."""

    def __init__(self, path: Path, problems: tuple[Problem, ...]) -> None:
        shown = "; ".join(str(p) for p in problems[:10])
        more = f"; ... {len(problems) - 10} more" if len(problems) > 10 else ""
        super().__init__(f"lexicon {path}: bad line(s) {shown}{more}")
        self.problems = problems


@dataclass
class _State:
    lexicon: Lexicon = field(default_factory=Lexicon)


class TextFrontEnd:
    """Markup filter, per-sentence language, normaliser and lexicon for one engine.

    ``ipa``: whether the engine takes IPA segments (Kokoro yes, Qwen3 no).
    ``lang``: "auto" (the reference rule per sentence), "de", "en", or a
    language name such as Qwen3's "german"; an unknown name ("chinese") turns
    the normaliser off (markup and lexicon still apply, in German).
    """

    def __init__(
        self, options: TextOptions | None = None, *, ipa: bool, lang: str = "auto"
    ) -> None:
        self.options = options or TextOptions()
        self.ipa = ipa
        key = lang.strip().lower()
        self.lang_option: LangOption = "auto"
        self.rules = self.options.normalize
        if key in LANGUAGE_NAMES:
            self.lang_option = LANGUAGE_NAMES[key]
        elif key != "auto":
            self.rules = False
        self._norm = NormalizeOptions(date_order=self.options.date_order)
        self._state = _State()
        self._reload_lock = threading.Lock()
        if self.options.lexicon is not None:
            res = self.reload_lexicon()
            if res.problems:  # at start-up a bad file is an error, not a silent empty lexicon
                raise LexiconError(self.options.lexicon, res.problems)

    # -- lexicon -----------------------------------------------------------------------

    @property
    def lexicon(self) -> Lexicon:
        return self._state.lexicon

    def reload_lexicon(self) -> LexiconReload:
        """Read ``--lexicon`` again; a file with any bad line keeps the old lexicon."""
        path = self.options.lexicon
        if path is None:
            return LexiconReload(0, (Problem(0, "no lexicon configured (--lexicon PATH)"),), False)
        with self._reload_lock:
            entries, problems = read_lexicon(path)
            old = len(self._state.lexicon)
            if problems:
                log.warning("lexicon_rejected", path=str(path), bad_lines=len(problems), kept=old)
                return LexiconReload(old, tuple(problems), False)
            self._state = _State(Lexicon(entries))  # one reference swap: atomic for readers
            log.info("lexicon_loaded", path=str(path), entries=len(entries))
            return LexiconReload(len(entries), (), True)

    # -- the front end -----------------------------------------------------------------

    def language(self, sentence: str) -> Lang:
        """The reference rule on the sentence's words: digits, symbols and punctuation do not
        count (as written they are language-neutral, yet they would tip the rule's
        letters-per-byte test to German: "Call 555-0142.")."""
        if self.lang_option != "auto":
            return self.lang_option
        words = _NON_WORD_RE.sub(" ", sentence)
        return detect_language(words if words.strip() else sentence)

    def speak(self, text: str) -> Spoken:
        """The spoken form of ``text`` as segments (never raises)."""
        lexicon = self._state.lexicon  # one snapshot for the whole packet
        try:
            return self._speak(text, lexicon)
        except Exception as exc:  # Rule 2: a bug here must not cost the call its text
            log.warning("text_front_end_failed", error=repr(exc))
            cleaned = clean_text(text)
            lang = self.language(cleaned)
            return Spoken((Segment(cleaned, lang),) if cleaned else ())

    def spoken_text(self, text: str) -> str:
        return self.speak(text).text

    def _speak(self, text: str, lexicon: Lexicon) -> Spoken:
        if self.options.normalize:
            text = strip_markup(text)
        text = clean_text(text)
        if not text:
            return Spoken(())
        segments: list[Segment] = []
        for sentence in split_sentences(text) if self.lang_option == "auto" else [text]:
            lang = self.language(sentence)
            spoken = normalize(sentence, lang, self._norm) if self.rules else sentence
            self._apply_lexicon(spoken, lang, lexicon, segments)
        return Spoken(tuple(_merge(segments)))

    def _apply_lexicon(self, text: str, lang: Lang, lexicon: Lexicon, out: list[Segment]) -> None:
        pos = 0
        for hit in lexicon.hits(text, lang, self.ipa):
            if hit.start < pos:
                continue
            if hit.start > pos:
                out.append(Segment(text[pos : hit.start], lang))
            e = hit.entry
            out.append(Segment(e.replacement, lang, ipa=e.ipa))
            pos = hit.end
        if pos < len(text):
            out.append(Segment(text[pos:], lang))


def _merge(segments: list[Segment]) -> list[Segment]:
    """Join neighbouring text segments of one language; strip blanks; drop empty ones."""
    out: list[Segment] = []
    for seg in segments:
        t = seg.text.strip()
        if not t:
            continue
        if out and not seg.ipa and not out[-1].ipa and out[-1].lang == seg.lang:
            prev = out[-1].text
            glue = "" if t[:1] in ",.;:!?" else " "
            out[-1] = Segment(prev + glue + t, seg.lang)
        else:
            out.append(Segment(t, seg.lang, seg.ipa))
    return out
