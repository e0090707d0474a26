"""Waiting for a Kokoro engine's background measurement of its voices' statistics.

A new models directory has its voices' instance-norm statistics measured once
(``engines/kokoro/voice_norms.py``): the default voice before the engine docks, the
others in a background thread whenever no utterance is in progress. Calls come first,
but anything else timed meanwhile shares the CPU with it: a benchmark's baselines run
beside an idle engine (kokoro-onnx's whole sentence ran 1.5-1.9x slower on a 2-vCPU
AVX2 box while it measured, which flattered the first-audio ratio), and a probe that
calls the backend directly in the same process never makes it yield. So the
benchmarks wait for it first, and say how long they waited.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable

PENDING = "synth.voice_norms_pending"  # the engine's STATS field (voices still to do)
POLL_S = 0.5


async def wait_for_voice_statistics(
    stats: Callable[[], Awaitable[dict[str, float]]], limit_s: float
) -> str:
    """Poll ``stats`` (the engine's STATS, parsed) until it reports no voice pending, or
    ``limit_s`` s have passed; a line that says what happened (an engine without the field,
    or one that does not measure them, waits for nothing)."""
    t0 = time.monotonic()
    left = (await stats()).get(PENDING, 0.0)
    first = left
    while left > 0 and time.monotonic() - t0 < limit_s:
        await asyncio.sleep(POLL_S)
        left = (await stats()).get(PENDING, 0.0)
    waited = time.monotonic() - t0
    if first <= 0:
        return "voice statistics: all measured before the run"
    if left > 0:
        return (
            f"voice statistics: {left:.0f} of {first:.0f} voices still measured in the "
            f"background after {waited:.0f} s (timings below share the CPU with it)"
        )
    return (
        f"voice statistics: waited {waited:.0f} s for {first:.0f} voices measured in the background"
    )


def wait_in_process(wait: Callable[[float], bool], limit_s: float) -> str:
    """The same for an engine in this process: ``wait`` is its
    ``KokoroSynthesizer.wait_for_voice_norms`` (False: still measuring after ``limit_s``)."""
    t0 = time.monotonic()
    if not wait(limit_s):
        return (
            f"voice statistics: still measured in the background after {limit_s:.0f} s "
            "(timings below share the CPU with it)"
        )
    return f"voice statistics: ready after {time.monotonic() - t0:.0f} s"


def add_norms_argument(p: argparse.ArgumentParser) -> None:
    """``--norms-timeout S``: how long a benchmark waits for that measurement."""
    p.add_argument(
        "--norms-timeout",
        type=float,
        default=900.0,
        metavar="S",
        help="wait up to S s for the engine's voice statistics to be measured before timing "
        "(a new models directory measures them once, in the background; default 900)",
    )
