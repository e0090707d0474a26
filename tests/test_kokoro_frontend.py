"""Kokoro front end: language rule, espeak clauses with punctuation, vocabulary, cache."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engines.kokoro.espeak import Espeak, clause_mark
from engines.kokoro.frontend import (
    PHONEME_SUBSTITUTIONS,
    FrontEnd,
    NeuralG2P,
    Vocab,
    Word,
    clean_ipa,
    detect_language,
    normalise_text,
)
from engines.kokoro.models import load_vocab


@pytest.fixture(scope="module")
def vocab() -> Vocab:
    return Vocab(load_vocab())


@pytest.fixture(scope="module")
def frontend(vocab: Vocab) -> FrontEnd:
    return FrontEnd(vocab)


@pytest.mark.parametrize(
    ("text", "lang"),
    [
        ("Hello, how can I help you today?", "en"),
        ("Guten Tag, wie kann ich Ihnen heute helfen?", "de"),
        ("Grüße", "de"),  # umlaut
        ("Strasse gross", "en"),  # no German marker, mostly ASCII letters
        ("Das Meeting ist um zehn", "de"),  # common German word
        ("12345 678", "de"),  # fewer than half ASCII letters
        ("😀😀 ok", "de"),
        ("", "de"),
    ],
)
def test_reference_language_rule(text: str, lang: str) -> None:
    assert detect_language(text) == lang


def test_forced_language(vocab: Vocab) -> None:
    fe = FrontEnd(vocab, lang="en")
    assert fe.phonemes("Guten Tag").lang == "en"


def test_clause_marks_restored(frontend: FrontEnd) -> None:
    ph = frontend.phonemes("Hello, how are you? Fine! Thanks; bye.")
    ipa = ph.ipa
    for mark in ",?!;.":
        assert mark in ipa
    assert [w.brk for w in ph.words if w.brk] == [
        Word.CLAUSE,
        Word.SENTENCE,
        Word.SENTENCE,
        Word.CLAUSE,
        Word.SENTENCE,
    ]
    # punctuation tokens are really in the token stream
    tokens = [t for w in ph.words for t in w.tokens]
    assert frontend.vocab.table["?"] in tokens and frontend.vocab.table[","] in tokens


def test_decimal_point_is_not_a_clause(frontend: FrontEnd) -> None:
    ph = frontend.phonemes("It costs 3.5 dollars.")
    assert sum(1 for w in ph.words if w.brk == Word.SENTENCE) == 1


def test_ipa_matches_reference_phonemes(frontend: FrontEnd) -> None:
    # what kokoro-onnx's own phonemizer gives (espeak-ng 1.52, punctuation kept)
    assert frontend.phonemes("Guten Tag, wie kann ich Ihnen heute helfen?").ipa == (
        "ɡˈuːtən tˈɑːk, viː kˌan ɪç ˌiːnən hˈɔøtə hˈɛlfən?"
    )
    assert frontend.phonemes("Hello, how can I help you today?").ipa == (
        "həlˈoʊ, hˌaʊ kæn aɪ hˈɛlp juː tədˈeɪ?"
    )


def test_german_y_is_substituted_not_dropped(frontend: FrontEnd, vocab: Vocab) -> None:
    ph = frontend.phonemes("München")
    assert "ʏ" in ph.ipa and "ʏ" not in vocab.table
    tokens = [t for w in ph.words for t in w.tokens]
    assert vocab.table["y"] in tokens
    assert vocab.encode("ʏ") == [vocab.table["y"]]


def test_substitution_table_targets_exist(vocab: Vocab) -> None:
    for src, dst in PHONEME_SUBSTITUTIONS.items():
        if src not in vocab.table and src != "r":
            assert all(ch in vocab.table for ch in dst), src


def test_greedy_longest_match() -> None:
    v = Vocab({"a": 1, "ab": 2, "abc": 3, "b": 4, "ʦ": 5, "t": 6, "s": 7})
    assert v.encode("abcab") == [3, 2]
    assert v.encode("ababx") == [2, 2]
    assert v.encode("ʦts") == [5, 6, 7]
    assert v.skipped == 1


def test_clean_ipa_reference() -> None:
    assert clean_ipa("das (en)ˈʌpdeɪt(de) mˈeːtɪŋ\n  ") == "das ˈʌpdeɪt mˈeːtɪŋ"
    assert clean_ipa("(a) b  c ") == "a b c"


def test_clause_mark_helper() -> None:
    assert clause_mark('He said "no."') == "."
    assert clause_mark("really?!") == "?"
    assert clause_mark("wait...") == "."
    assert clause_mark("so…") == "…"
    assert clause_mark("word") == ""
    assert clause_mark("a, ") == ","


def test_cache_is_lru_and_bounded(vocab: Vocab) -> None:
    fe = FrontEnd(vocab, cache_size=2)
    fe.phonemes("eins")
    fe.phonemes("zwei")
    fe.phonemes("eins")  # hit, now most recent
    fe.phonemes("drei")  # evicts "zwei"
    assert fe.hits == 1
    fe.phonemes("eins")
    assert fe.hits == 2
    fe.phonemes("zwei")
    assert fe.misses == 4


def test_espeak_is_thread_safe() -> None:
    esp = Espeak.shared()
    results: dict[int, str] = {}

    def work(i: int) -> None:
        lang, text = ("de", "Guten Tag") if i % 2 else ("en-us", "Good day")
        results[i] = " ".join(c.ipa for c in esp.clauses(text, lang))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {results[i] for i in range(1, 16, 2)} == {"ɡˈuːtən tˈɑːk"}
    assert len({results[i] for i in range(0, 16, 2)}) == 1


def test_neural_fallback_logs_and_uses_espeak(vocab: Vocab) -> None:
    fe = FrontEnd(vocab, g2p="neural")
    assert fe.g2p_name == "espeak"
    assert fe.phonemes("Hallo").words


def test_neural_g2p_with_a_tiny_model(tmp_path, vocab: Vocab) -> None:  # type: ignore[no-untyped-def]
    onnx = pytest.importorskip("onnx")
    import json

    import numpy as np
    from onnx import TensorProto, helper

    text_symbols = ["_", "<", ">", "h", "a", "l", "o"]
    phonemes = ["_", "<", ">", "h", "a", "l", "o"]
    # logits = one-hot(char id) -> the model "pronounces" each letter as itself
    eye = np.eye(len(phonemes), dtype=np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "text"], ["logits"], axis=0)],
        "g2p",
        [helper.make_tensor_value_info("text", TensorProto.INT64, [1, None])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, None, len(phonemes)])],
        [helper.make_tensor("table", TensorProto.FLOAT, eye.shape, eye.ravel().tolist())],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path = tmp_path / "g2p.onnx"
    onnx.save(model, str(path))
    (tmp_path / "g2p.json").write_text(
        json.dumps(
            {
                "text_symbols": text_symbols,
                "phoneme_symbols": phonemes,
                "languages": ["de"],
                "special_ids": [0, 1, 2],
                "start_id": 1,
                "end_id": 2,
            }
        )
    )
    g2p = NeuralG2P(path)
    assert g2p.word("Hallo") == "halo"  # repeats collapsed
    assert g2p.word("xyz") is None  # unknown letters -> espeak
    fe = FrontEnd(vocab, g2p="neural", neural=g2p, lang="de")
    assert fe.g2p_name == "neural"
    ph = fe.phonemes("Hallo, 5.")
    assert ph.words[0].ipa == "halo,"
    assert "f" in ph.ipa  # the digit went through espeak


@settings(max_examples=60)
@given(text=st.text(max_size=40))
def test_frontend_never_raises_on_any_text(frontend: FrontEnd, text: str) -> None:
    ph = frontend.phonemes(normalise_text(text))
    for w in ph.words:
        assert w.tokens and all(isinstance(t, int) and t > 0 for t in w.tokens)
