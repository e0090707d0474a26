"""The dock's keepalive counts only time during which the dock itself could read.

A dock process that is not scheduled (host overloaded, VM paused) must not blame the
engine for the PONGs it could not read meanwhile; a genuinely silent engine is still
dropped (docs/wire.md#keepalive: > 600 ms without a PONG clears the slot).
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest
from dock_helpers import eventually, make_rig

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="needs SIGSTOP")

STALL_S = 0.9  # longer than the 600 ms PONG deadline


async def stall(pid: int, seconds: float) -> None:
    """Stop the process for ``seconds`` (it is not scheduled at all), then let it go on."""
    os.kill(pid, signal.SIGSTOP)
    try:
        await asyncio.sleep(seconds)
    finally:
        os.kill(pid, signal.SIGCONT)


async def test_stalled_dock_keeps_the_answering_engine(tmp_path: Path) -> None:
    async with make_rig(tmp_path) as rig:
        eng = await rig.engine()
        await eventually(lambda: eng.pings >= 2, what="PINGs every 200 ms")
        assert rig.dock.proc is not None
        await stall(rig.dock.proc.pid, STALL_S)
        seen = eng.pings
        await eventually(lambda: eng.pings >= seen + 4, what="PINGs go on after the stall")
        assert await rig.dock.stat("keepalive_timeouts") == 0
        assert await rig.status_is("ACTIVE fake")
        assert rig.dock.events("keepalive_stalled"), "the dock's own stall was not noticed"


async def test_stalled_dock_still_drops_a_silent_engine(tmp_path: Path) -> None:
    async with make_rig(tmp_path) as rig:
        eng = await rig.engine()
        await eventually(lambda: eng.pings >= 2, what="PINGs every 200 ms")
        assert rig.dock.proc is not None
        eng.answer_ping = False
        await stall(rig.dock.proc.pid, STALL_S)
        await eventually(lambda: rig.status_is("NONE"), what="silent engine dropped")
        assert await rig.dock.stat("keepalive_timeouts") == 1
        timed_out = rig.dock.events("keepalive_timed_out")[0]
        # only time the dock was running counts: the stall itself is not in the silence
        assert 600 < timed_out["silent_ms"] < 600 + STALL_S * 1000, timed_out
