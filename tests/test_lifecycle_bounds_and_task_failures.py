"""Lifecycle: bounded engine calls (idle eviction, LRU cap), long-lived task failures
are fatal in the engine and in the dock (non-zero exit status), and text meant for an
engine whose transport is closing is held instead of counted as delivered."""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from dock_helpers import FakeEngine, eventually
from runtime_helpers import ToneSynth, free_port, tone

from engines.runtime import app as engine_app
from engines.runtime.app import Engine, EngineConfig
from engines.runtime.calls import CallManager, CallPhase, EngineSettings
from engines.runtime.client import EngineClient
from engines.runtime.stats import RuntimeStats
from engines.runtime.synth import CallState, CancelToken
from protocol.mgmt import SpeechIdle
from protocol.packet import Packet
from ttsdock import server as dock_server
from ttsdock.config import Config
from ttsdock.server import Dock, Listeners

# --------------------------------------------------------------------------------------
# 1. bounded calls in the engine


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
    await asyncio.wait_for(task1, 5)  # its worker task is gone, not parked forever
    clock.t += 600
    assert calls.sweep() == 1 and not calls.calls
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


# --------------------------------------------------------------------------------------
# 2. engine: a failed long-lived task stops the engine with exit status 1


async def test_engine_dock_client_failure_is_fatal(monkeypatch: pytest.MonkeyPatch) -> None:
    async def broken_run(self: EngineClient, stop: asyncio.Event) -> None:
        await asyncio.sleep(0)
        raise RuntimeError("injected dock client failure")

    monkeypatch.setattr(EngineClient, "run", broken_run)
    cfg = EngineConfig(name="tone", dock_port=free_port(), cmd_port=0)
    rc = await asyncio.wait_for(engine_app._amain(ToneSynth(), cfg), 10)
    assert rc == 1


async def test_engine_dock_client_returning_early_is_fatal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def quitter(self: EngineClient, stop: asyncio.Event) -> None:
        return None

    monkeypatch.setattr(EngineClient, "run", quitter)
    synth = ToneSynth()
    synth.load()
    engine = Engine(synth, EngineConfig(name="tone", dock_port=free_port(), cmd_port=0))
    await asyncio.wait_for(engine.run(), 10)
    assert engine.exit_code == 1 and engine.stop_reason == "task_failed:dock-client"


async def test_engine_sweeper_failure_is_fatal(monkeypatch: pytest.MonkeyPatch) -> None:
    synth = ToneSynth()
    synth.load()
    engine = Engine(synth, EngineConfig(name="tone", dock_port=free_port(), cmd_port=0))

    async def broken_sweep() -> None:
        raise ValueError("injected sweeper failure")

    monkeypatch.setattr(engine.calls, "sweep_forever", broken_sweep)
    await asyncio.wait_for(engine.run(), 10)
    assert engine.exit_code == 1 and engine.stop_reason == "task_failed:call-sweeper"


# --------------------------------------------------------------------------------------
# 3. dock: a critical task that dies stops the dock with exit status 1


def _cfg() -> Config:
    # OAP on a port nobody listens on: the connector keeps retrying in the background
    return Config(llama_mgmt_port=0, llama_data_port=0, cmd_port=0, dock_port=0, oap_mgmt_port=1,
                  oap_data_port=1)  # fmt: skip


async def test_dock_critical_task_failure_stops_dock(monkeypatch: pytest.MonkeyPatch) -> None:
    async def broken_keepalive(self: Dock) -> None:
        await asyncio.sleep(0)
        raise RuntimeError("injected keepalive failure")

    monkeypatch.setattr(Dock, "_keepalive", broken_keepalive)
    cfg = _cfg()
    dock = Dock(cfg)
    await dock.start(Listeners.bind(cfg))
    try:
        await asyncio.wait_for(dock.stopping.wait(), 10)
        assert dock.exit_code == 1
    finally:
        await dock.stop()
    assert not dock.supervisor.tasks


async def test_dock_serve_returns_nonzero_after_task_death(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def broken_sweeper(self: Dock) -> None:
        await asyncio.sleep(0)
        raise RuntimeError("injected hold sweeper failure")

    monkeypatch.setattr(Dock, "_hold_sweeper", broken_sweeper)
    loop = asyncio.get_running_loop()
    handler = loop.get_exception_handler()
    try:
        rc = await asyncio.wait_for(dock_server.serve(_cfg()), 10)
    finally:
        gc.unfreeze()
        loop.set_exception_handler(handler)
    assert rc == 1


async def test_dock_helper_task_failure_not_fatal() -> None:
    cfg = _cfg()
    dock = Dock(cfg)
    await dock.start(Listeners.bind(cfg))
    try:

        async def oops() -> None:
            raise RuntimeError("a helper task failed")

        t = dock.supervisor.spawn(oops(), "flush_tts")
        await asyncio.wait({t})
        for _ in range(5):
            await asyncio.sleep(0)
        assert not dock.stopping.is_set() and dock.exit_code == 0
    finally:
        await dock.stop()
    assert dock.exit_code == 0


# --------------------------------------------------------------------------------------
# 4. dock: text for an engine whose transport is closing is held, not "delivered"


async def test_text_to_closing_engine_is_held_then_delivered() -> None:
    cfg = _cfg()
    dock = Dock(cfg)
    ports = await dock.start(Listeners.bind(cfg))
    first = FakeEngine(ports["dock"], "first")
    second = FakeEngine(ports["dock"], "second")
    try:
        assert await first.dock() == b"OK"
        await eventually(lambda: dock.pipeline.router.slot.active_name == "first", what="docked")
        dock.pipeline.on_text(Packet(9, b"before"))
        assert dock.stats.text_frames_to_engine == 1
        eng = dock.pipeline.engine
        assert eng is not None
        eng.abort("test_abort")  # connection_lost runs on a later loop turn
        assert dock.pipeline.engine is eng and not eng.writable()
        sent_mgmt = dock.stats.mgmt_frames_to_engine
        dock.pipeline.on_text(Packet(9, b"during close"))
        dock.pipeline.on_call_message(SpeechIdle(9))
        assert dock.stats.text_frames_to_engine == 1  # not counted as delivered
        assert dock.stats.text_held == 1
        assert dock.stats.mgmt_frames_to_engine == sent_mgmt
        # the safety net in _send_text: a closing engine's text is a counted drop
        dock.pipeline._send_text(Packet(9, b"direct"), from_hold=False)
        assert dock.stats.drops["engine_closing"] == 1
        assert dock.stats.text_frames_to_engine == 1
        await eventually(lambda: dock.pipeline.engine is None, what="engine gone")
        assert await second.dock() == b"OK"
        got = await second.next_of(Packet)
        assert got == Packet(9, b"during close")
        assert dock.stats.text_delivered_from_hold == 1
        assert dock.stats.text_frames_to_engine == 2
    finally:
        await first.close()
        await second.close()
        await dock.stop()
