"""A long-lived task of the engine that fails, or returns while it should run, stops the
engine with exit status 1 (``task_failed:<task>``), so that the service manager restarts it."""

from __future__ import annotations

import asyncio

import pytest
from runtime_helpers import ToneSynth, free_port

from engines.runtime.app import Engine, EngineConfig
from engines.runtime.client import EngineClient


async def test_engine_dock_client_failure_is_fatal(monkeypatch: pytest.MonkeyPatch) -> None:
    async def broken_run(self: EngineClient, stop: asyncio.Event) -> None:
        await asyncio.sleep(0)
        raise RuntimeError("injected dock client failure")

    monkeypatch.setattr(EngineClient, "run", broken_run)
    synth = ToneSynth()
    synth.load()
    engine = Engine(synth, EngineConfig(name="tone", dock_port=free_port(), cmd_port=0))
    await asyncio.wait_for(engine.run(), 10)
    assert engine.exit_code == 1 and engine.stop_reason == "task_failed:dock-client"


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
