"""Kokoro's memory follows the runs in progress: a long window's arena regions go back to
the system when it ends, and so do the pages that glibc's arenas keep of freed blocks
after an utterance (backend Rule 3), read from the kernel's own counters.

The measurement runs in a fresh interpreter: in the test process other tests' threads and
objects would move its RSS while it is read."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import engines.kokoro.synth as synth_module
from engines.kokoro.backend import fix_mmap_threshold
from engines.kokoro.synth import KokoroSynthesizer
from engines.runtime.synth import CallState, CancelToken, SynthesisCancelled

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc/self/status and clear_refs"
)

#: What every measuring script starts with: the kernel's figure of this process.
STATUS = r"""
import json, sys
from pathlib import Path

def status_mb(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise SystemExit(f"no {field} in /proc/self/status")
"""
#: ... and, for a script that measures the engine, its loaded backend (the model files'
#: folder is the script's first argument) and a sentence to speak.
ENGINE = (
    STATUS
    + r"""
import numpy as np
from engines.kokoro.backend import PROSODY_KEEP_TOKENS, OnnxBackend
from engines.kokoro.synth import KokoroConfig, KokoroSynthesizer
from engines.runtime.synth import CancelToken

synth = KokoroSynthesizer(KokoroConfig(models_dir=Path(sys.argv[1]), prompt_cache_mb=0))
synth.load()
assert synth.wait_for_voice_norms(1800)  # no measurement beside the one measured here
backend = synth._backend
assert isinstance(backend, OnnxBackend) and synth.split
text = ("Your package will arrive on Thursday between nine and noon, and the driver "
        "will call you before he comes.")
"""
)

MEASURE = (
    ENGINE
    + r"""
tokens = []
for w in synth.phonemize(text).words:
    tokens += ([synth.frontend.vocab.space or 0] if tokens else []) + list(w.tokens)
style = synth._voices[synth.default_voice][len(tokens) - 1].astype(np.float32)
prosody = backend.prosody(tokens, style, 1.0, CancelToken())
assert prosody.n_frames >= 220, prosody.n_frames
for _ in range(2):  # the arena's steady size for short windows
    backend.decode(prosody, 0, 60, style, CancelToken())
try:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
except OSError:
    print(json.dumps({"skip": "/proc/self/clear_refs is not writable here"}))
    raise SystemExit(0)
before = status_mb("VmRSS")
backend.decode(prosody, 0, 220, style, CancelToken())  # 5.5 s of audio at once
print(json.dumps({"grew": status_mb("VmHWM") - before, "kept": status_mb("VmRSS") - before}))
"""
)


def _measure(script: str, *args: str) -> dict[str, Any]:
    """Run ``script`` in a fresh interpreter in the repository root; its last line of
    output, a JSON object."""
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True, text=True, cwd=root, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    got: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return got


def test_glibc_mmap_threshold_is_fixed() -> None:
    assert fix_mmap_threshold()


def test_a_long_windows_memory_is_returned_when_it_ends(kokoro_models_dir: Path) -> None:
    got = _measure(MEASURE, str(kokoro_models_dir))
    if "skip" in got:
        pytest.skip(got["skip"])
    grew, kept = got["grew"], got["kept"]
    assert grew > 40, f"the long window needed only {grew:.0f} MB: not a test of the arena"
    assert kept < grew / 4, f"kept {kept:.0f} of the {grew:.0f} MB the long window needed"


PROSODY = (
    ENGINE
    + r"""
tokens = []
for w in synth.phonemize((text + " ") * 4).words:
    tokens += ([synth.frontend.vocab.space or 0] if tokens else []) + list(w.tokens)
short, long = tokens[:PROSODY_KEEP_TOKENS], tokens[:PROSODY_KEEP_TOKENS + 150]
assert len(long) > PROSODY_KEEP_TOKENS, len(long)
style = synth._voices[synth.default_voice][len(short) - 1].astype(np.float32)
before = status_mb("VmRSS")
backend.prosody(short, style, 1.0, CancelToken())
kept_short = status_mb("VmRSS") - before
backend.prosody(short, style, 1.0, CancelToken())
again = status_mb("VmRSS") - before
backend.prosody(long, style, 1.0, CancelToken())
after_long = status_mb("VmRSS") - before
print(json.dumps({"kept_short": kept_short, "again": again, "after_long": after_long}))
"""
)


def test_a_prosody_pass_keeps_its_arena_up_to_a_bounded_length(kokoro_models_dir: Path) -> None:
    """A sentence's prosody pass leaves its session's arena as it is (the next one needs no
    new pages: faster before the first audio), up to ``PROSODY_KEEP_TOKENS``; the same
    length again needs no more, and a longer pass gives all of it back."""
    got = _measure(PROSODY, str(kokoro_models_dir))
    assert got["kept_short"] > 20, got  # the arena of the pass is kept
    assert got["again"] < got["kept_short"] + 5, got  # and reused
    assert got["after_long"] < got["kept_short"] / 4, got  # a longer pass shrinks it


#: Many blocks below the mmap threshold, freed but for every tenth (as a run's scratch
#: leaves them), from a thread (its own arena, as the engine's workers have): glibc keeps
#: the freed pages until ``trim_heap``.
FRAGMENT = (
    STATUS
    + r"""
import ctypes, threading
from engines.kokoro.backend import fix_mmap_threshold, trim_heap

libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
fix_mmap_threshold()
kept = []

def fragment():
    blocks = [libc.malloc(256 << 10) for _ in range(800)]  # 200 MB
    for b in blocks:
        ctypes.memset(b, 1, 256 << 10)
    for i, b in enumerate(blocks):
        (kept.append if i % 10 == 9 else libc.free)(b)

t = threading.Thread(target=fragment)
t.start(); t.join()
before = status_mb("VmRSS")
trimmed = trim_heap()
print(json.dumps({"trimmed": trimmed, "before": before, "after": status_mb("VmRSS")}))
"""
)


def test_trim_heap_returns_the_freed_pages_of_an_arena() -> None:
    got = _measure(FRAGMENT)
    assert got["trimmed"], "no malloc_trim in this C library"
    # 180 MB were freed between the kept blocks; most of it must leave the process
    assert got["before"] - got["after"] > 120, got


def test_an_utterance_trims_the_heap_at_most_every_interval(
    kokoro_synth: KokoroSynthesizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    trims: list[int] = []

    def counted() -> bool:
        trims.append(1)
        return True

    monkeypatch.setattr(synth_module, "trim_heap", counted)
    monkeypatch.setattr(kokoro_synth, "_trimmed_at", float("-inf"))
    kokoro_synth._cache.clear()
    before = kokoro_synth.stats()["heap_trims"]
    state = CallState(call_id=31)
    list(kokoro_synth.synthesize("One moment, please.", state, CancelToken()))
    assert trims == [1]
    assert kokoro_synth.stats()["heap_trims"] - before == 1
    # within the interval the next utterance leaves the heap as it is
    monkeypatch.setattr(synth_module, "HEAP_TRIM_EVERY_S", 1e9)
    list(kokoro_synth.synthesize("Thank you for waiting.", state, CancelToken()))
    assert trims == [1]
    # and a failed or cancelled utterance trims too (its runs freed their blocks as well)
    monkeypatch.setattr(synth_module, "HEAP_TRIM_EVERY_S", 0.0)
    cancel = CancelToken()
    cancel.cancel()
    with pytest.raises(SynthesisCancelled):
        list(kokoro_synth.synthesize("This is never spoken.", state, cancel))
    assert trims == [1, 1]

    async def on_the_loop() -> None:  # an utterance that ends on an event loop's thread
        list(kokoro_synth.synthesize("Goodbye.", state, CancelToken()))

    asyncio.run(on_the_loop())
    assert trims == [1, 1]
