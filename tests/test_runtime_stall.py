"""The engine's dock-silence rule counts only time during which the engine could read.

An engine process that was not scheduled for longer than ``DOCK_SILENCE`` (host
overloaded, VM paused: the dock was not running either, so no PING arrived) must not
count that time as the dock's silence and drop a healthy link (and the calls on it).
"""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
from runtime_helpers import FakeDock, free_port, spawn_engine
from test_runtime_process import kill

from engines.runtime.client import DOCK_SILENCE

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="needs SIGSTOP"),
]


async def test_stalled_engine_keeps_its_dock_link() -> None:
    dock = FakeDock(ping_every=0)  # the test PINGs, and pauses with the engine
    await dock.start()
    proc = spawn_engine("--dock-port", str(dock.port), "--cmd-port", str(free_port()))
    try:
        sess = await dock.session(within=20)
        for _ in range(3):
            await sess.ping_rtt()
            await asyncio.sleep(0.2)
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(DOCK_SILENCE * 1.5)
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        for _ in range(4):  # keepalive rounds on the same link after the stall
            await sess.ping_rtt()
            await asyncio.sleep(0.2)
        assert not sess.closed.is_set(), "the engine dropped a dock that kept PINGing"
        assert len(dock.sessions) == 1
    finally:
        await dock.stop()
        err = kill(proc)
    assert '"reason": "silent"' not in err, err[-2000:]
