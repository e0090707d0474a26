"""Sentence units: cut preferences, the 510-token limit, never a tiny last unit."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from engines.kokoro.frontend import Word
from engines.kokoro.phrasing import MAX_CONTEXT_TOKENS, PhrasePlanner, sentence_units

SPACE = 16


def words(spec: str) -> list[Word]:
    """'aaa bb, cc.' -> words with 1 token per letter; ',' clause, '.' sentence."""
    out = []
    for raw in spec.split():
        brk = Word.SENTENCE if raw[-1] in ".?!" else Word.CLAUSE if raw[-1] in ",;" else Word.WORD
        letters = raw.rstrip(".,;?!")
        out.append(Word(raw, tuple([1] * len(letters) + ([2] if brk else [])), brk))
    return out


def all_phrases(planner: PhrasePlanner, budget: int | None = None) -> list[tuple[int, ...]]:
    out = []
    while (p := planner.next(budget)) is not None:
        out.append(p.tokens)
    return out


def test_later_phrases_prefer_sentence_then_clause_ends() -> None:
    w = words("a b c d. eeee ffff, gggg hhhh iiii. jjjj kkkk llll mmmm nnnn oooo")
    p = PhrasePlanner(w, SPACE)
    first = p.next(budget=8)
    assert first is not None and first.n_words == 4
    second = p.next(budget=30)  # could take "jjjj" too, but ends at the sentence instead
    assert second is not None and second.brk == Word.SENTENCE and second.n_words == 5
    p = PhrasePlanner(w, SPACE)
    p.next(budget=8)
    third = p.next(budget=14)  # no sentence end fits: the clause end
    assert third is not None and third.brk == Word.CLAUSE


def test_single_overlong_word_is_split() -> None:
    w = [Word("x", tuple([5] * 1200), Word.SENTENCE)]
    phrases = all_phrases(PhrasePlanner(w, SPACE))
    assert [len(t) for t in phrases] == [MAX_CONTEXT_TOKENS, MAX_CONTEXT_TOKENS, 180]


@given(
    lengths=st.lists(st.integers(1, 700), min_size=1, max_size=40),
    brks=st.lists(st.sampled_from([0, 0, 0, 1, 2]), min_size=40, max_size=40),
    budget=st.one_of(st.none(), st.integers(1, 600)),
    max_tokens=st.integers(1, MAX_CONTEXT_TOKENS),
)
def test_phrases_cover_everything_in_order_within_limits(
    lengths: list[int], brks: list[int], budget: int | None, max_tokens: int
) -> None:
    w = [Word(str(i), tuple([i + 100] * n), brks[i]) for i, n in enumerate(lengths)]
    p = PhrasePlanner(w, SPACE, max_tokens=max_tokens)
    phrases = all_phrases(p, budget)
    assert all(1 <= len(t) <= max_tokens for t in phrases)
    flat = [t for ph in phrases for t in ph if t != SPACE]
    assert flat == [t for x in w for t in x.tokens]


def test_no_tiny_last_phrase() -> None:
    # budget 27 would leave "now today?" (10 tokens): the rest is taken along instead
    w = words("hello, how can i help you right now today?")
    p = PhrasePlanner(w, SPACE, min_tail=12)
    assert p.next(budget=6) is not None
    second = p.next(budget=27)
    assert second is not None and p.done and second.brk == Word.SENTENCE
    # without the rule the same budget leaves a small last phrase
    p = PhrasePlanner(w, SPACE, min_tail=0)
    p.next(budget=6)
    p.next(budget=27)
    last = p.next(budget=27)
    assert last is not None and len(last.tokens) < 12 and p.done


def test_tiny_rest_rule_respects_the_context_limit() -> None:
    w = [Word(str(i), tuple([7] * 100), Word.WORD) for i in range(6)]
    p = PhrasePlanner(w, SPACE, max_tokens=250, min_tail=500)
    phrases = all_phrases(p, budget=200)
    assert all(len(t) <= 250 for t in phrases) and len(phrases) >= 3


def test_a_sentence_is_one_unit_and_long_text_is_cut_at_sentence_ends() -> None:
    one = words("hello, how can i help you today?")
    assert [u.n_words for u in sentence_units(one, SPACE)] == [len(one)]
    two = words("aaaa bbbb, cccc. dddd eeee ffff.")
    units = sentence_units(two, SPACE, max_tokens=24)
    assert [u.brk for u in units] == [Word.SENTENCE, Word.SENTENCE]
    assert [u.n_words for u in units] == [3, 3]
