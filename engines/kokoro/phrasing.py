"""Cutting an utterance's words into phrases: a short first phrase, then growing ones.

Rule 1: pure functions of the word list and a token budget; no clocks, no model.
Rule 2: a phrase never exceeds ``MAX_CONTEXT_TOKENS`` (511 tokens crash the
graph: its position table has 512 rows); cuts prefer a sentence end, then a clause end, then
a word boundary, and split inside a word only when one word alone is too long.

The first phrase is the first clause when it is short, else its first few
words: its synthesis is a small fraction of the sentence, so the first audio
leaves early. The synthesiser asks for each later phrase with a budget that
it derives from how much audio is already queued ahead of playback.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engines.kokoro.frontend import Word

MAX_CONTEXT_TOKENS = 510  # phoneme tokens per inference, plus the two pad ids
#: A later phrase takes the rest of the utterance when less than this would be left:
#: a tiny last phrase costs a whole inference's edge overhead for little audio.
MIN_TAIL_TOKENS = 16


@dataclass(frozen=True)
class Phrase:
    tokens: tuple[int, ...]
    n_words: int
    brk: int  # break after the phrase: Word.WORD / CLAUSE / SENTENCE
    index: int


class PhrasePlanner:
    """Hands out consecutive units of ``words``; see the module docstring."""

    def __init__(
        self,
        words: Sequence[Word],
        space_token: int | None,
        *,
        max_tokens: int = MAX_CONTEXT_TOKENS,
        min_tail: int = MIN_TAIL_TOKENS,
    ) -> None:
        if not 1 <= max_tokens <= MAX_CONTEXT_TOKENS:
            raise ValueError(f"max_tokens must be in 1..{MAX_CONTEXT_TOKENS}, got {max_tokens}")
        self.words = list(self._split_long_words(words, max_tokens))
        self.space = () if space_token is None else (space_token,)
        self.max_tokens = max_tokens
        self.min_tail = max(0, min_tail)
        self.pos = 0
        self.count = 0

    @staticmethod
    def _split_long_words(words: Sequence[Word], limit: int) -> list[Word]:
        out: list[Word] = []
        for w in words:
            if len(w.tokens) <= limit:
                out.append(w)
                continue
            for i in range(0, len(w.tokens), limit):
                piece = w.tokens[i : i + limit]
                last = i + limit >= len(w.tokens)
                out.append(Word(w.ipa if last else "", piece, w.brk if last else Word.WORD))
        return out

    @property
    def done(self) -> bool:
        return self.pos >= len(self.words)

    def remaining_tokens(self) -> int:
        rest = self.words[self.pos :]
        return sum(len(w.tokens) for w in rest) + max(0, len(rest) - 1) * len(self.space)

    def _length(self, start: int, end: int) -> int:
        n = sum(len(w.tokens) for w in self.words[start:end])
        return n + max(0, end - start - 1) * len(self.space)

    def _emit(self, end: int) -> Phrase:
        tokens: list[int] = []
        for i, w in enumerate(self.words[self.pos : end]):
            if i:
                tokens.extend(self.space)
            tokens.extend(w.tokens)
        phrase = Phrase(tuple(tokens), end - self.pos, self.words[end - 1].brk, self.count)
        self.pos = end
        self.count += 1
        return phrase

    def _fits(self, limit: int) -> int:
        """Largest end index such that words[pos:end] has <= limit tokens (>= pos + 1)."""
        end = self.pos + 1
        while end < len(self.words) and self._length(self.pos, end + 1) <= limit:
            end += 1
        return end

    def next(self, budget: int | None = None) -> Phrase | None:
        """The next phrase within ``budget`` tokens (None: the context limit)."""
        if self.done:
            return None
        limit = self.max_tokens if budget is None else max(1, min(budget, self.max_tokens))
        end_fit = self._fits(limit)
        if end_fit >= len(self.words):
            return self._emit(len(self.words))
        rest = self.remaining_tokens()
        if rest <= self.max_tokens and self._length(end_fit, len(self.words)) < self.min_tail:
            return self._emit(len(self.words))  # don't leave a tiny last phrase behind
        # prefer the last sentence end, then the last clause end, in the allowed span,
        # as long as it does not make the phrase tiny (< a third of the budget)
        floor = self._length(self.pos, end_fit) // 3
        for kind in (Word.SENTENCE, Word.CLAUSE):
            for end in range(end_fit, self.pos, -1):
                if self.words[end - 1].brk >= kind:
                    if self._length(self.pos, end) >= floor:
                        return self._emit(end)
                    break
        return self._emit(end_fit)


def sentence_units(
    words: Sequence[Word], space_token: int | None, max_tokens: int = MAX_CONTEXT_TOKENS
) -> list[Phrase]:
    """The whole utterance as units of at most ``max_tokens`` tokens, in order."""
    planner = PhrasePlanner(words, space_token, max_tokens=max_tokens)
    units: list[Phrase] = []
    while (unit := planner.next()) is not None:
        units.append(unit)
    return units
