"""Text -> Kokoro tokens: language choice, G2P (espeak-ng or a neural model), vocabulary.

Rule 1: the whole front end is pure CPU work on strings and is cached; it
never touches the acoustic model.
Rule 2: the output keeps word, clause and sentence boundaries (``Word.brk``) so
that ``phrasing`` can cut an utterance into phrases without phonemising again.

Reference behaviour (docs/wire.md#kokoro-front-end) plus what it lacks:

* text: the shared telephony front end (``engines.text``: markup filter,
  normaliser, lexicon) turns a text packet into segments, plain text or IPA from
  the lexicon, each with the language of its sentence (``detect_language``, the
  reference rule, per sentence; ``--lang de|en`` forces one); text segments go
  through espeak in their language, IPA segments straight to the vocabulary;
* punctuation that espeak's clause API drops is put back per clause
  (``espeak.Clause.mark``), so the model sees ``, . ! ? ; : … —``;
* clean-up as the reference: newlines, ``(`` ``)`` and trailing blanks go; the
  espeak language-switch flags such as ``(en)`` are removed as a whole;
* vocabulary: greedy longest match, UTF-8 aware (Python strings), with
  ``PHONEME_SUBSTITUTIONS`` for symbols the vocabulary lacks instead of
  dropping them; unknown symbols without a substitute are skipped;
* an LRU cache of 10,000 utterances keyed by the spoken form (segments) and G2P,
  so "$5" and "5 dollars" share one entry.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import structlog

from engines.kokoro.espeak import SENTENCE_MARKS, Clause, Espeak
from engines.runtime.synth import SynthesisError
from engines.text import Lang, LangOption, Segment, Spoken, TextFrontEnd, clean_text
from engines.text.lang import detect_language

log = structlog.get_logger(__name__)

__all__ = ["Lang", "LangOption", "detect_language", "normalise_text"]

G2POption = Literal["auto", "neural", "espeak"]

ESPEAK_VOICES: dict[str, str] = {"de": "de", "en": "en-us"}
PHONEME_CACHE_SIZE = 10_000  # docs/wire.md#kokoro-front-end
MAX_TEXT_CHARS = 20_000  # one text packet is at most 1 MiB; bound the work per utterance
MAX_SEGMENT_CHARS = 8 * MAX_TEXT_CHARS  # after normalisation (digits become words)

#: Phonemes that espeak-ng (or a neural G2P) emits but Kokoro's vocabulary lacks,
#: mapped to the nearest symbol(s) it has. Applied only when the symbol itself is
#: not in the vocabulary, so a model whose vocabulary has them keeps them.
#: An empty replacement drops a diacritic that carries no segment of its own.
PHONEME_SUBSTITUTIONS: dict[str, str] = {
    "ʏ": "y",  # German near-close front rounded (München): nearest rounded front vowel
    "ɝ": "ɜɹ",  # r-coloured open-mid central (bird, en-us)
    "ɫ": "l",  # velarised l
    "ɬ": "l",
    "ɭ": "l",
    "ʀ": "ʁ",  # uvular trill -> uvular fricative
    "ɺ": "ɾ",
    "ɘ": "ə",
    "ɵ": "ə",
    "ɞ": "ɜ",
    "ɶ": "œ",
    "ʉ": "u",
    "ʍ": "w",
    "ɦ": "h",
    "ɱ": "m",
    "ʑ": "ʒ",
    "ʐ": "ʒ",
    "ɧ": "ʃ",
    "g": "ɡ",  # ASCII g -> IPA script g
    "r": "ɹ",  # only used when a vocabulary has no 'r'
    "̩": "",  # syllabic mark (bˈɑːtl̩)
    "̯": "",  # non-syllabic mark
    "͡": "",  # tie bar
    "ˑ": "",  # half-long
    "ʼ": "",
}

_LANG_FLAG_RE = re.compile(r"\([a-z]{2,3}(?:-[a-z0-9]{2,8})*\)")
_SPACES_RE = re.compile(r"\s+")
_LEADING_MARK_RE = re.compile(r"\s*([,;:.!?…—])\s*")

#: Whitespace and control-character clean-up (one implementation: ``engines.text``).
normalise_text = clean_text


def clean_ipa(ipa: str) -> str:
    """Reference clean-up: language flags, newlines, parentheses, repeated and trailing blanks."""
    ipa = _LANG_FLAG_RE.sub("", ipa)
    ipa = ipa.replace("(", "").replace(")", "")
    return _SPACES_RE.sub(" ", ipa).strip()


class Vocab:
    """Greedy longest-match tokenizer over a phoneme vocabulary, with substitutions."""

    def __init__(self, table: dict[str, int], substitutions: dict[str, str] | None = None) -> None:
        self.table = dict(table)
        self.max_key = max(len(k) for k in self.table)
        subs = PHONEME_SUBSTITUTIONS if substitutions is None else substitutions
        # a substitute is used only for symbols missing from this vocabulary, and
        # only if everything it maps to is present
        self.substitutions = {
            k: v
            for k, v in subs.items()
            if k not in self.table and all(ch in self.table for ch in v)
        }
        self.space = self.table.get(" ")
        self.skipped = 0

    def encode(self, ipa: str) -> list[int]:
        out: list[int] = []
        i, n = 0, len(ipa)
        while i < n:
            for size in range(min(self.max_key, n - i), 0, -1):
                tok = self.table.get(ipa[i : i + size])
                if tok is not None:
                    out.append(tok)
                    i += size
                    break
            else:
                sub = self.substitutions.get(ipa[i])
                if sub is not None:
                    out.extend(self.table[ch] for ch in sub)
                else:
                    self.skipped += 1
                i += 1
        return out


@dataclass(frozen=True)
class Word:
    """One spoken word: its tokens (with its trailing mark, if any) and the break after it."""

    ipa: str
    tokens: tuple[int, ...]
    brk: int  # 0: word, 1: clause end, 2: sentence end

    WORD = 0
    CLAUSE = 1
    SENTENCE = 2


@dataclass(frozen=True)
class Phonemes:
    """The front end's result for one utterance."""

    lang: Lang
    words: tuple[Word, ...]
    g2p: str

    @property
    def n_tokens(self) -> int:
        """Tokens of the whole utterance including the spaces between words."""
        return sum(len(w.tokens) for w in self.words) + max(0, len(self.words) - 1)

    @property
    def ipa(self) -> str:
        return " ".join(w.ipa for w in self.words)


class NeuralG2P:
    """A user-supplied neural G2P (DeepPhonemizer-style forward model exported to ONNX).

    Files: ``<name>.onnx`` with an int64 input ``[1, T]`` of character ids and
    logits ``[1, T, P]``; and ``<name>.json``::

        {"text_symbols": [...], "phoneme_symbols": [...], "languages": ["de"],
         "char_repeats": 1, "lowercase": true, "special_ids": [0, 1, 2],
         "start_id": 1, "end_id": 2}

    Decoding is greedy: argmax per step, repeats collapsed, special ids dropped.
    Words it cannot handle (digits, unknown letters) go to espeak-ng.
    Tested only with a tiny synthetic model, not with a real DeepPhonemizer export.
    """

    def __init__(self, model: Path, config: Path | None = None) -> None:
        import onnxruntime as ort

        cfg_path = config or model.with_suffix(".json")
        try:
            cfg: dict[str, Any] = json.loads(cfg_path.read_text("utf-8"))
        except (OSError, ValueError) as exc:
            raise SynthesisError(f"neural G2P config {cfg_path} unreadable: {exc}") from exc
        self.text_ids = {s: i for i, s in enumerate(cfg["text_symbols"])}
        self.phonemes = list(cfg["phoneme_symbols"])
        self.languages = frozenset(cfg.get("languages", ["de"]))
        self.repeats = int(cfg.get("char_repeats", 1))
        self.lowercase = bool(cfg.get("lowercase", True))
        self.special = frozenset(int(i) for i in cfg.get("special_ids", [0]))
        self.start_id = cfg.get("start_id")
        self.end_id = cfg.get("end_id")
        try:
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = 1
            self.session = ort.InferenceSession(
                str(model), opts, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:
            raise SynthesisError(f"neural G2P model {model} failed to load: {exc}") from exc
        self.input_name = self.session.get_inputs()[0].name
        self.lock = threading.Lock()

    def word(self, word: str) -> str | None:
        w = word.lower() if self.lowercase else word
        if not w or any(ch not in self.text_ids for ch in w):
            return None
        ids = [self.text_ids[ch] for ch in w for _ in range(self.repeats)]
        if self.start_id is not None:
            ids.insert(0, int(self.start_id))
        if self.end_id is not None:
            ids.append(int(self.end_id))
        with self.lock:
            (logits,) = self.session.run(None, {self.input_name: np.array([ids], np.int64)})[:1]
        best = np.asarray(logits)[0].argmax(axis=-1).tolist()
        out: list[str] = []
        prev = -1
        for idx in best:
            if idx != prev and idx not in self.special and 0 <= idx < len(self.phonemes):
                out.append(self.phonemes[idx])
            prev = idx
        return "".join(out) or None


class FrontEnd:
    """Language detection, G2P and tokenization, with an LRU cache (thread-safe)."""

    def __init__(
        self,
        vocab: Vocab,
        *,
        lang: LangOption = "auto",
        g2p: G2POption = "auto",
        neural: NeuralG2P | None = None,
        espeak_factory: Callable[[], Espeak] = Espeak.shared,
        cache_size: int = PHONEME_CACHE_SIZE,
        text: TextFrontEnd | None = None,
    ) -> None:
        self.vocab = vocab
        self.text = text if text is not None else TextFrontEnd(ipa=True, lang=lang)
        self.lang_option = lang
        self.g2p_option = g2p
        self.neural = neural if g2p != "espeak" else None
        if g2p == "neural" and neural is None:
            log.warning("g2p_fallen_back", reason="no neural G2P model configured; using espeak")
        self._espeak_factory = espeak_factory
        self._espeak: Espeak | None = None
        self._cache: OrderedDict[tuple[tuple[Segment, ...], str], Phonemes] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @property
    def g2p_name(self) -> str:
        return "neural" if self.neural is not None else "espeak"

    def espeak(self) -> Espeak:
        if self._espeak is None:
            self._espeak = self._espeak_factory()
        return self._espeak

    def language(self, text: str) -> Lang:
        """The language the text front end chooses for one sentence."""
        return self.text.language(text)

    def speak(self, text: str) -> Spoken:
        """The text front end's spoken form of a text packet (bounded input)."""
        return self.text.speak(text[:MAX_TEXT_CHARS])

    def phonemes(self, text: str | Spoken) -> Phonemes:
        """Phonemise and tokenize ``text`` (raw, or already spoken by ``speak``); cached."""
        spoken = self.speak(text) if isinstance(text, str) else text
        key = (spoken.segments, self.g2p_name)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                self.hits += 1
                return hit
            self.misses += 1
        result = Phonemes(spoken.lang, tuple(self._words(spoken)), self.g2p_name)
        with self._lock:
            self._cache[key] = result
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return result

    def _clause_ipa(self, clause: Clause, lang: Lang) -> str:
        neural = self.neural
        if neural is None or lang not in neural.languages:
            return clause.ipa
        parts: list[str] = []
        for token in clause.text.split():
            word = "".join(ch for ch in token if ch.isalpha())
            ipa = neural.word(word) if word and word == token.strip(",.!?;:…—\"'()") else None
            if ipa is None:  # digits, abbreviations, unknown letters: espeak for this word
                ipa = " ".join(
                    c.ipa for c in self.espeak().clauses(token, ESPEAK_VOICES[lang]) if c.ipa
                )
            if ipa:
                parts.append(ipa)
        return " ".join(parts)

    def _words(self, spoken: Spoken) -> list[Word]:
        words: list[Word] = []
        for seg in spoken.segments:
            if seg.ipa:
                self._ipa_words(seg.text, words)
            else:
                self._text_words(seg.text[:MAX_SEGMENT_CHARS], seg.lang, words)
        if words and words[-1].brk != Word.SENTENCE:
            last = words[-1]
            words[-1] = Word(last.ipa, last.tokens, Word.SENTENCE)
        return words

    def _ipa_words(self, ipa: str, words: list[Word]) -> None:
        """IPA from the lexicon: straight to the vocabulary, one word per blank."""
        for piece in clean_ipa(ipa).split(" "):
            tokens = self.vocab.encode(piece) if piece else []
            if tokens:
                words.append(Word(piece, tuple(tokens), Word.WORD))

    def _text_words(self, text: str, lang: Lang, words: list[Word]) -> None:
        lead = _LEADING_MARK_RE.match(text)
        if lead is not None:  # ", welcome" after a lexicon word: espeak drops a leading mark
            mark = lead.group(1)
            if words and words[-1].brk == Word.WORD:
                last = words[-1]
                brk = Word.SENTENCE if mark in SENTENCE_MARKS else Word.CLAUSE
                words[-1] = Word(last.ipa + mark, last.tokens + tuple(self.vocab.encode(mark)), brk)
            text = text[lead.end() :]
            if not text:
                return
        clauses = self.espeak().clauses(text, ESPEAK_VOICES[lang])
        for i, clause in enumerate(clauses):
            ipa = clean_ipa(self._clause_ipa(clause, lang))
            pieces = [p for p in ipa.split(" ") if p]
            encoded = [(p, self.vocab.encode(p)) for p in pieces]
            encoded = [(p, t) for p, t in encoded if t]
            if clause.mark in SENTENCE_MARKS:
                brk = Word.SENTENCE
            elif clause.mark or i < len(clauses) - 1:
                brk = Word.CLAUSE
            else:  # the segment ends mid-clause (a lexicon segment follows)
                brk = Word.WORD
            mark_tokens = self.vocab.encode(clause.mark) if clause.mark else []
            if not encoded:
                # punctuation with nothing spoken ("...", "?!"): give it to the previous word
                if words and clause.mark and words[-1].brk == Word.WORD:
                    last = words[-1]
                    words[-1] = Word(last.ipa + clause.mark, last.tokens + tuple(mark_tokens), brk)
                continue
            for p, t in encoded[:-1]:
                words.append(Word(p, tuple(t), Word.WORD))
            p, t = encoded[-1]
            words.append(Word(p + clause.mark, tuple(t + mark_tokens), brk))

    def stats(self) -> dict[str, float]:
        return {
            "phoneme_cache_hits": float(self.hits),
            "phoneme_cache_misses": float(self.misses),
            "phoneme_cache_size": float(len(self._cache)),
            "phonemes_skipped": float(self.vocab.skipped),
        }
