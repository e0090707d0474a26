"""What a caller hears: streamed Kokoro speech is as intelligible as whole-sentence speech.

An offline recogniser (Whisper tiny.en, tests/asr_helpers.py) transcribes each
sentence twice, synthesised in the same run by the same model, voice and style:
streamed (whole-sentence prosody, audio decoded in windows: the default) and
whole-sentence (one inference per sentence, ``--no-split``). The streamed
output must not come back worse: its word error rate over the set at most
0.01 above the whole sentences', and no sentence more than one word worse.
(Window sizes follow the measured decode speed, so the cuts, and with them
the recogniser's borderline words, vary a little from run to run.)
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from asr_helpers import asr_available, normalize_words, transcribe, wer
from kokoro_helpers import shared_models_dir, speak

from engines.kokoro.synth import KokoroConfig, KokoroSynthesizer
from engines.runtime.synth import CallState

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not asr_available(), reason="faster-whisper / tiny.en not installed"),
]

SENTENCES = (
    "Please hold the line while I transfer your call to the billing department.",
    "I am sorry, the doctor is not available this afternoon.",
    "Could you spell your last name for me, please?",
    "Your package will arrive on Thursday between nine and noon.",
    "Thank you for calling, how can I help you today?",
    "I have booked your appointment for Monday morning, "
    "and you will get a reminder the day before.",
    "Your prescription is ready for pickup at the pharmacy counter.",
    "To reset your password, I will send a code to your phone.",
    "The technician will visit your home tomorrow afternoon.",
    "Is there anything else I can help you with today?",
    "Your account is up to date, and no payment is due this month.",
    "Please stay on the line, a representative will be with you shortly.",
)


def engine(models_dir: Path, *, split: bool) -> Iterator[KokoroSynthesizer]:
    synth = KokoroSynthesizer(
        KokoroConfig(
            models_dir=models_dir, prompt_cache_mb=0, lang="en", split=split, edge_cap=False
        )
    )
    synth.load()
    yield synth
    synth.close()


@pytest.fixture(scope="module")
def streamed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KokoroSynthesizer]:
    yield from engine(shared_models_dir(tmp_path_factory), split=True)


@pytest.fixture(scope="module")
def whole(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KokoroSynthesizer]:
    yield from engine(shared_models_dir(tmp_path_factory), split=False)


def test_streamed_speech_is_heard_as_well_as_whole_sentences(
    streamed: KokoroSynthesizer, whole: KokoroSynthesizer
) -> None:
    assert streamed.split and not whole.split
    errors = {"streamed": 0.0, "whole": 0.0}
    words = 0
    report = []
    for i, text in enumerate(SENTENCES):
        chunks = speak(streamed, text, CallState(call_id=100 + i))
        assert len(chunks) >= 2, "each sentence is streamed in more than one window"
        heard_s = transcribe(np.concatenate(chunks))
        heard_w = transcribe(np.concatenate(speak(whole, text, CallState(call_id=200 + i))))
        n = len(normalize_words(text))
        e_s, e_w = wer(text, heard_s) * n, wer(text, heard_w) * n
        errors["streamed"] += e_s
        errors["whole"] += e_w
        words += n
        report.append(f"{e_s:.0f}/{e_w:.0f} {text!r}: {heard_s!r} | {heard_w!r}")
        # sentence by sentence: at most one word worse than the whole sentence
        assert e_s <= e_w + 1, "\n".join(report)
    detail = "\n".join(report)
    print(f"word errors streamed {errors['streamed']:.0f}, whole {errors['whole']:.0f} of {words}")
    print(detail)
    assert errors["streamed"] / words <= errors["whole"] / words + 0.01, detail
