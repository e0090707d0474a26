"""Kokoro's memory follows the runs in progress: a long window's arena regions go back to
the system when it ends (backend Rule 3), read from the kernel's own counters."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from engines.kokoro.backend import OnnxBackend, fix_mmap_threshold
from engines.kokoro.synth import KokoroConfig, KokoroSynthesizer
from engines.runtime.synth import CancelToken

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc/self/status and clear_refs"
)


def status_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field} in /proc/self/status")


def reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS


@pytest.fixture(scope="module")
def synth(kokoro_models_dir: Path) -> Iterator[KokoroSynthesizer]:
    s = KokoroSynthesizer(KokoroConfig(models_dir=kokoro_models_dir, prompt_cache_mb=0))
    s.load()
    yield s
    s.close()


def test_glibc_mmap_threshold_is_fixed() -> None:
    assert fix_mmap_threshold()


def test_a_long_windows_memory_is_returned_when_it_ends(synth: KokoroSynthesizer) -> None:
    backend = synth._backend
    assert isinstance(backend, OnnxBackend) and synth.split
    text = ("Your package will arrive on Thursday between nine and noon, and the driver "
            "will call you before he comes.")  # fmt: skip
    phon = synth.phonemize(text)
    tokens: list[int] = []
    for w in phon.words:
        tokens += ([synth.frontend.vocab.space or 0] if tokens else []) + list(w.tokens)
    voice = synth._voices[synth.default_voice]
    style = voice[len(tokens) - 1].astype(np.float32)
    prosody = backend.prosody(tokens, style, 1.0, CancelToken())
    assert prosody.n_frames >= 220
    for _ in range(2):  # the arena's steady size for short windows
        backend.decode(prosody, 0, 60, style, CancelToken())
    try:
        reset_peak()
    except OSError:
        pytest.skip("/proc/self/clear_refs is not writable here")
    before = status_mb("VmRSS")
    backend.decode(prosody, 0, 220, style, CancelToken())  # 5.5 s of audio at once
    grew = status_mb("VmHWM") - before
    kept = status_mb("VmRSS") - before
    assert grew > 40, f"the long window needed only {grew:.0f} MB: not a test of the arena"
    assert kept < grew / 4, f"kept {kept:.0f} of the {grew:.0f} MB the long window needed"
