"""Pronunciation lexicon (engines/text/lexicon.py): the file format, every kind of bad
line with its number, matching rules, IPA vs respelling, and reload semantics."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engines.text import LexiconError, TextFrontEnd, TextOptions, parse_lexicon, read_lexicon
from engines.text.lexicon import MAX_PHRASE_WORDS, Lexicon

GOOD = """\
# names and products
Nguyen      | en | /ŋwˈɪn/
Nguyen      | *  | Nwin
ttsdock     | *  | T T S dock
Kokoro      | de | Kokkoro      | case
Müller GmbH | de | Müller G m b H
C plus plus | en | see plus plus
xyz         | *  | ix why zett  | part
"""


def write(tmp_path: Path, text: str, name: str = "lex.txt") -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def test_good_file_parses() -> None:
    entries, problems = parse_lexicon(GOOD)
    assert problems == []
    assert len(entries) == 7
    nguyen = entries[0]
    assert (nguyen.phrase, nguyen.lang, nguyen.replacement, nguyen.ipa) == (
        "Nguyen",
        "en",
        "ŋwˈɪn",
        True,
    )
    assert entries[3].case and not entries[3].part
    assert parse_lexicon("e.V. | de | eingetragener Verein")[0][0].part  # punctuation inside
    assert not entries[5].part and entries[5].phrase == "C plus plus"
    assert entries[6].part


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("just a word", "expected 'phrase | lang | replacement [| flags]', got 1 field(s)"),
        ("a | en", "expected 'phrase | lang | replacement [| flags]', got 2 field(s)"),
        ("a | en | b | case | x", "expected 'phrase | lang | replacement [| flags]', got 5"),
        (" | en | b", "empty phrase"),
        ("a | fr | b", "unknown language 'fr' (de, en or *)"),
        ("a | en | ", "empty replacement"),
        ("a | en | b | loud", "unknown flag 'loud' (case, part)"),
        ("a | en | /abc", "IPA must be written between two slashes"),
        ("a | en | //", "IPA must be written between two slashes"),
        ("a | en | / /", "IPA between slashes is empty"),
        ("a | en | /a/b/", "IPA between slashes is empty or contains a slash"),
        ("... | en | dots", "phrase has no word characters"),
        (" ".join(["w"] * (MAX_PHRASE_WORDS + 1)) + " | en | x", "phrase longer than"),
        ("x" * 201 + " | en | y", "phrase longer than 200 characters"),
        ("a | en | " + "b" * 501, "replacement longer than 500 characters"),
        ("a\x07b | en | c", "control character"),
    ],
)
def test_bad_line_reported_with_its_number(line: str, reason: str) -> None:
    entries, problems = parse_lexicon(f"# header\n\nok | en | fine\n{line}\n")
    assert len(entries) == 1
    assert len(problems) == 1
    assert problems[0].line == 4
    assert problems[0].reason.startswith(reason), problems[0].reason


def test_every_bad_line_is_reported() -> None:
    text = "a | en | b\nbad\nc | xx | d\na | EN | again\nok | de | gut\n | en | z\n"
    entries, problems = parse_lexicon(text)
    assert [e.phrase for e in entries] == ["a", "ok"]
    assert [(p.line, p.reason.split(" ")[0]) for p in problems] == [
        (2, "expected"),
        (3, "unknown"),
        (4, "duplicate"),
        (6, "empty"),
    ]
    assert str(problems[2]) == "4:duplicate of line 1"


def test_unreadable_and_non_utf8_files(tmp_path: Path) -> None:
    _, problems = read_lexicon(tmp_path / "missing.txt")
    assert problems[0].line == 0 and "cannot read" in problems[0].reason
    bad = tmp_path / "latin1.txt"
    bad.write_bytes(b"ok | en | fine\nM\xfcller | de | x\n")
    _, problems = read_lexicon(bad)
    assert [(p.line, p.reason) for p in problems] == [(2, "not UTF-8")]


def test_matching_rules(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    kokoro = TextFrontEnd(TextOptions(lexicon=path), ipa=True, lang="en")
    qwen = TextFrontEnd(TextOptions(lexicon=path), ipa=False, lang="en")
    # IPA where the engine takes it, the respelling where it does not
    segs = kokoro.speak("Hello Mr. Nguyen, welcome.").segments
    assert [(s.text, s.ipa) for s in segs] == [
        ("Hello Mister", False),
        ("ŋwˈɪn", True),
        (", welcome.", False),
    ]
    assert qwen.speak("Hello Mr. NGUYEN, welcome.").text == "Hello Mister Nwin, welcome."
    assert kokoro.speak("Hello Mr. Nguyen.").text == "Hello Mister /ŋwˈɪn/."
    # whole words only, case-insensitive by default
    assert qwen.speak("Try TTSdock and ttsdocks.").text == "Try T T S dock and ttsdocks."
    # "case": exact case only; language-specific entries only in their language
    de = TextFrontEnd(TextOptions(lexicon=path), ipa=False, lang="de")
    assert de.speak("Kokoro und kokoro").text == "Kokkoro und kokoro"
    assert qwen.speak("Kokoro").text == "Kokoro"
    # phrases, punctuation inside, and "part" inside words
    assert de.speak("Die Müller   GmbH ruft an.").text == "Die Müller G m b H ruft an."
    assert qwen.speak("I like C++ a lot").text == "I like see plus plus a lot"
    assert qwen.speak("abcxyzdef").text == "abc ix why zett def"


def test_lexicon_applies_after_normalisation(tmp_path: Path) -> None:
    path = write(tmp_path, "forty-two | en | the answer\n")
    fe = TextFrontEnd(TextOptions(lexicon=path), ipa=False, lang="en")
    assert fe.speak("It is 42.").text == "It is the answer."


def test_bad_file_at_start_up_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, "ok | en | fine\nbroken line\n")
    with pytest.raises(LexiconError, match=r"2:expected"):
        TextFrontEnd(TextOptions(lexicon=path), ipa=False)


def test_reload_swaps_or_keeps_the_old_lexicon(tmp_path: Path) -> None:
    path = write(tmp_path, "Acme | * | Ackmee\n")
    fe = TextFrontEnd(TextOptions(lexicon=path), ipa=False, lang="en")
    assert fe.speak("Acme").text == "Ackmee"
    path.write_text("Acme | * | Ack me\nBeta | * | Bayta\n", encoding="utf-8")
    res = fe.reload_lexicon()
    assert (res.entries, res.ok, res.loaded) == (2, True, True)
    assert fe.speak("Acme Beta").text == "Ack me Bayta"
    path.write_text("Acme | * | gone\nbad one\nx | q | y\n", encoding="utf-8")
    res = fe.reload_lexicon()
    assert not res.loaded and res.entries == 2
    assert [str(p) for p in res.problems] == [
        "2:expected 'phrase | lang | replacement [| flags]', got 1 field(s)",
        "3:unknown language 'q' (de, en or *)",
    ]
    assert fe.speak("Acme Beta").text == "Ack me Bayta"  # the old lexicon stays
    path.unlink()
    res = fe.reload_lexicon()
    assert not res.loaded and res.problems[0].line == 0
    assert fe.speak("Acme").text == "Ack me"


def test_reload_without_a_lexicon_is_an_error() -> None:
    res = TextFrontEnd(ipa=False).reload_lexicon()
    assert not res.loaded and "no lexicon configured" in res.problems[0].reason


_FIELD = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)


@settings(max_examples=400, deadline=None)
@given(lines=st.lists(st.lists(_FIELD, min_size=1, max_size=5).map(" | ".join), max_size=20))
def test_parser_is_total_and_accounts_for_every_line(lines: list[str]) -> None:
    text = "\n".join(lines)
    entries, problems = parse_lexicon(text)
    counted = {e.line for e in entries} | {p.line for p in problems}
    meaningful = {
        i
        for i, line in enumerate(text.splitlines(), 1)
        if line.strip() and not line.strip().startswith("#")
    }
    assert counted == meaningful  # every line is an entry or a reported problem
    assert not {e.line for e in entries} & {p.line for p in problems}
    lex = Lexicon(entries)
    for lang in ("de", "en"):
        for ipa in (True, False):
            hits = lex.hits(text.replace("|", " "), lang, ipa)  # type: ignore[arg-type]
            assert all(a.end <= b.start for a, b in itertools.pairwise(hits))


@settings(max_examples=200, deadline=None)
@given(
    phrase=st.from_regex(r"[A-Za-zÄÖÜäöü]{1,10}( [A-Za-z]{1,8}){0,2}", fullmatch=True),
    repl=st.from_regex(r"[A-Za-z ]{1,20}", fullmatch=True).filter(lambda s: s.strip()),
    lang=st.sampled_from(["de", "en", "*"]),
    ipa=st.booleans(),
)
def test_round_trip_of_one_entry(phrase: str, repl: str, lang: str, ipa: bool) -> None:
    text = f"{phrase} | {lang} | {'/' + repl.strip() + '/' if ipa else repl}"
    entries, problems = parse_lexicon(text)
    assert problems == []
    (e,) = entries
    assert (e.phrase, e.lang, e.ipa) == (phrase, lang, ipa)
    assert e.replacement == repl.strip()
