"""The text front end inside the Qwen3 engine: the tokenizer sees the spoken form
(respellings only, never IPA); options and language names reach the front end."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_qwen3_engine import ScriptedEngine, _fake_dir

from engines.qwen3.serving.synthesizer import Qwen3Options, Qwen3Synthesizer
from engines.runtime.synth import CallState, CancelToken
from engines.text import LexiconError, TextOptions


def qwen3(d: Path, **kw: object) -> tuple[Qwen3Synthesizer, ScriptedEngine]:
    eng = ScriptedEngine("customvoice")
    s = Qwen3Synthesizer(
        Qwen3Options(model_dir=d, mode="customvoice", **kw),  # type: ignore[arg-type]
        generator_loader=lambda paths, opts: eng,
    )
    s.load()
    return s, eng


def said(s: Qwen3Synthesizer, eng: ScriptedEngine, text: str) -> str:
    list(s.synthesize(text, CallState(1), CancelToken()))
    return str(eng.requests[-1].text)


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    d = tmp_path / "model"
    d.mkdir()
    return _fake_dir(d, "customvoice")


def test_tokenizer_sees_the_spoken_form(model_dir: Path) -> None:
    s, eng = qwen3(model_dir)
    assert said(s, eng, "**Total:** $42.50 😀") == "Total: forty-two dollars and fifty cents"
    assert said(s, eng, "Ihr Termin ist am 3.12. um 14:30 Uhr.") == (
        "Ihr Termin ist am dritten Dezember um vierzehn Uhr dreißig."
    )
    assert s.normalize("Call 555-0142.") == "Call five five five, zero one four two."


def test_language_option_forces_the_rules(model_dir: Path) -> None:
    s, eng = qwen3(model_dir, language="german")
    assert said(s, eng, "Call 555-0142.") == "Call fünf fünf fünf, null eins vier zwo."


def test_no_normalize_and_lexicon_respellings(model_dir: Path, tmp_path: Path) -> None:
    lex = tmp_path / "lex.txt"
    lex.write_text("Nguyen | en | /ŋwˈɪn/\nNguyen | * | Nwin\nAcme | en | /ækmi/\n", "utf-8")
    s, eng = qwen3(model_dir, text=TextOptions(lexicon=lex))
    # the respelling, never IPA: an IPA-only entry leaves the word as it is
    assert said(s, eng, "Mr. Nguyen from Acme") == "Mister Nwin from Acme"
    lex.write_text("Acme | * | Ackmee\n", "utf-8")
    assert s.reload_lexicon().entries == 1
    assert said(s, eng, "Acme") == "Ackmee"
    raw, eng2 = qwen3(model_dir, text=TextOptions(normalize=False))
    assert said(raw, eng2, "**$5**") == "**$5**"


def test_bad_lexicon_is_an_error_at_construction(model_dir: Path, tmp_path: Path) -> None:
    lex = tmp_path / "lex.txt"
    lex.write_text("no bars\n", "utf-8")
    with pytest.raises(LexiconError):
        Qwen3Synthesizer(
            Qwen3Options(model_dir=model_dir, text=TextOptions(lexicon=lex)),
            generator_loader=lambda paths, opts: ScriptedEngine("customvoice"),
        )
