"""Bounded calls in the engine: a call idle for ``call_idle_s`` is evicted by the sweeper,
a speaking call never is, and over ``max_calls`` the least recently active idle call goes."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from dock_helpers import eventually
from runtime_helpers import ToneSynth, free_port, tone

from engines.runtime.app import Engine, EngineConfig
from engines.runtime.calls import CallManager, CallPhase, EngineSettings
from engines.runtime.stats import RuntimeStats
from engines.runtime.synth import CallState, CancelToken


class GateSynth(ToneSynth):
    """Speaks one phrase, then holds the utterance open until ``gate`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.speaking = threading.Event()

    def synthesize(self, text: str, state: CallState, cancel: CancelToken) -> Iterator[Any]:
        yield tone(3, 50)
        self.speaking.set()
        while not self.gate.wait(0.01):
            cancel.raise_if_cancelled()


class NullSink:
    write_paused = False

    def __init__(self) -> None:
        self.packets = 0

    def send_audio(self, call_id: int, pcm: bytes) -> bool:
        self.packets += 1
        return True

    async def drain(self) -> None:
        return None


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _manager(synth: ToneSynth, clock: Clock, **kw: Any) -> CallManager:
    synth.load()
    return CallManager(synth, NullSink(), RuntimeStats(), EngineSettings(), 2, clock=clock, **kw)


async def _settle(calls: CallManager) -> None:
    """Let every worker reach its wait (a few loop turns; no wall-clock)."""
    for _ in range(20):
        await asyncio.sleep(0)


async def test_idle_call_evicted_after_idle_time() -> None:
    clock = Clock()
    calls = _manager(ToneSynth(), clock, idle_s=600.0)
    calls.on_speech_idle(1)
    calls.on_speech_idle(2)
    await _settle(calls)
    task1 = calls.calls[1].task
    assert task1 is not None
    clock.t += 300
    calls.on_speech_active(2, 0)  # call 2 is alive: its idle time restarts
    clock.t += 299.9
    assert calls.sweep() == 0 and set(calls.calls) == {1, 2}
    clock.t += 0.2  # call 1: 600.1 s without an event
    assert calls.sweep() == 1
    assert set(calls.calls) == {2}
    assert calls.calls_evicted == {"idle": 1, "cap": 0}
    # the pool's grants count the calls the table holds (``UnitGrant.calls``)
    assert calls.pool is not None and calls.pool.live_calls() == 1
    await asyncio.wait_for(task1, 5)  # its worker task is gone, not parked forever
    clock.t += 600
    assert calls.sweep() == 1 and not calls.calls
    assert calls.pool.live_calls() == 0
    assert calls.calls_evicted["idle"] == 2
    # an evicted call is not "ended": text for it reopens it (fresh state)
    calls.on_speech_idle(1)
    assert 1 in calls.calls and calls.calls[1].phase is CallPhase.IDLE
    await calls.close(1.0)


async def test_speaking_call_never_evicted() -> None:
    clock = Clock()
    synth = GateSynth()
    calls = _manager(synth, clock, idle_s=10.0, max_calls=2)
    try:
        calls.on_text(1, b"long answer", 0)
        await asyncio.to_thread(synth.speaking.wait, 10)
        w = calls.calls[1]
        assert w.phase is CallPhase.SPEAKING and not w.idle
        clock.t += 1e6
        assert calls.sweep() == 0 and 1 in calls.calls
        # over the cap with only speaking calls at the front: the idle one goes instead
        calls.on_speech_idle(2)
        calls.on_speech_idle(3)  # cap 2: call 2 (idle) is evicted, call 1 (speaking) kept
        assert set(calls.calls) == {1, 3}
        assert calls.calls_evicted == {"idle": 0, "cap": 1}
        synth.gate.set()
        await eventually(lambda: calls.stats.utterances_completed == 1, what="utterance done")
        await eventually(lambda: calls.calls[1].idle, what="call 1 idle")
        # idle time counts from the end of speech: not evicted right after a long utterance
        assert calls.sweep() == 0
        clock.t += 10
        assert calls.sweep() == 2  # both now idle for 10 s
    finally:
        synth.gate.set()
        await calls.close(1.0)


async def test_lru_cap_evicts_least_recently_active_idle_call() -> None:
    clock = Clock()
    calls = _manager(ToneSynth(), clock, max_calls=3)
    for cid in (1, 2, 3):
        clock.t += 1
        calls.on_speech_idle(cid)
    clock.t += 1
    calls.on_speech_idle(1)  # 1 becomes the most recently active
    tasks = {cid: w.task for cid, w in calls.calls.items()}
    calls.on_speech_idle(4)
    assert list(calls.calls) == [3, 1, 4]
    assert calls.calls_evicted == {"idle": 0, "cap": 1}
    t2 = tasks[2]
    assert t2 is not None
    await asyncio.wait_for(t2, 5)
    for cid in range(5, 105):
        calls.on_speech_idle(cid)
    assert len(calls.calls) == 3 and list(calls.calls) == [102, 103, 104]
    assert calls.calls_evicted["cap"] == 101
    await calls.close(1.0)


def test_call_bounds_validated() -> None:
    with pytest.raises(ValueError, match="max_calls"):
        EngineConfig(name="x", max_calls=0)
    with pytest.raises(ValueError, match="call_idle_s"):
        EngineConfig(name="x", call_idle_s=0)


async def test_engine_runs_the_sweeper() -> None:
    synth = ToneSynth()
    synth.load()
    cfg = EngineConfig(name="tone", dock_port=free_port(), cmd_port=0, call_idle_s=0.05)
    engine = Engine(synth, cfg)
    await engine.start()
    try:
        engine.calls.on_speech_idle(9)
        assert 9 in engine.calls.calls
        await eventually(lambda: engine.calls.calls_evicted["idle"] == 1, what="idle sweep")
        assert not engine.calls.calls
    finally:
        engine.request_stop("test")
        await engine.shutdown()
    assert engine.exit_code == 0
