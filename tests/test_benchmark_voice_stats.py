"""The Kokoro benchmarks wait for the engine's background measurement of its voices'
statistics before they time anything (``benchmarks/voice_stats.py``)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import voice_stats
from voice_stats import PENDING, wait_for_voice_statistics, wait_in_process


def _engine(pending: list[float]) -> tuple[list[int], Callable[[], Awaitable[dict[str, float]]]]:
    """A STATS poller that reports ``pending`` voices in turn (then the last, forever)."""
    polls = [0]

    async def stats() -> dict[str, float]:
        value = pending[min(polls[0], len(pending) - 1)]
        polls[0] += 1
        return {PENDING: value, "synth.voice_norms_ready": 1.0}

    return polls, stats


def test_it_polls_until_no_voice_is_left(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(voice_stats, "POLL_S", 0.0)
    polls, stats = _engine([3.0, 2.0, 1.0, 0.0])
    line = asyncio.run(wait_for_voice_statistics(stats, 60.0))
    assert polls[0] == 4
    assert line.startswith("voice statistics: waited") and "3 voices" in line


def test_an_engine_done_or_without_the_field_is_not_waited_for() -> None:
    polls, stats = _engine([0.0])
    line = asyncio.run(wait_for_voice_statistics(stats, 60.0))
    assert polls[0] == 1 and line == "voice statistics: all measured before the run"

    async def older_engine() -> dict[str, float]:
        return {"synth.voice_norms_ready": 1.0}

    assert "all measured" in asyncio.run(wait_for_voice_statistics(older_engine, 60.0))


def test_past_the_limit_it_says_the_timings_share_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(voice_stats, "POLL_S", 0.0)
    _, stats = _engine([4.0])  # never done
    line = asyncio.run(wait_for_voice_statistics(stats, 0.05))
    assert "4 of 4 voices still measured" in line and "share the CPU" in line


def test_an_engine_in_this_process_is_waited_for_with_its_own_wait() -> None:
    limits: list[float] = []

    def done(limit_s: float) -> bool:
        limits.append(limit_s)
        return True

    assert wait_in_process(done, 30.0).startswith("voice statistics: ready after")
    assert limits == [30.0]
    assert "still measured" in wait_in_process(lambda limit_s: False, 30.0)
