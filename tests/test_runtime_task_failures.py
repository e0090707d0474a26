"""A long-lived task of the engine that fails, or returns while it should run, stops the
engine with exit status 1 (``task_failed:<task>``), so that the service manager restarts it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from runtime_helpers import ToneSynth, free_port

from engines.runtime.app import Engine, EngineConfig
from engines.runtime.client import EngineClient


def _engine() -> Engine:
    synth = ToneSynth()
    synth.load()
    return Engine(synth, EngineConfig(name="tone", dock_port=free_port(), cmd_port=0))


async def _dock_client_raises(self: EngineClient, stop: asyncio.Event) -> None:
    await asyncio.sleep(0)
    raise RuntimeError("injected dock client failure")


async def _dock_client_returns(self: EngineClient, stop: asyncio.Event) -> None:
    return None


@pytest.mark.parametrize(
    "run", [_dock_client_raises, _dock_client_returns], ids=["raises", "returns"]
)
async def test_engine_dock_client_failure_is_fatal(
    monkeypatch: pytest.MonkeyPatch, run: Callable[[EngineClient, asyncio.Event], Awaitable[None]]
) -> None:
    monkeypatch.setattr(EngineClient, "run", run)
    engine = _engine()
    await asyncio.wait_for(engine.run(), 10)
    assert engine.exit_code == 1 and engine.stop_reason == "task_failed:dock-client"


async def test_engine_sweeper_failure_is_fatal(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = _engine()

    async def broken_sweep() -> None:
        raise ValueError("injected sweeper failure")

    monkeypatch.setattr(engine.calls, "sweep_forever", broken_sweep)
    await asyncio.wait_for(engine.run(), 10)
    assert engine.exit_code == 1 and engine.stop_reason == "task_failed:call-sweeper"
