"""The dock's lifecycle in-process (listeners passed in on port 0) and what a subprocess
cannot show: a non-loopback engine peer is refused before it can send a byte."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from dock_helpers import FakeEngine, eventually

from protocol.packet import Packet
from ttsdock.config import Config
from ttsdock.engine_conn import EngineConn
from ttsdock.server import Dock, Listeners


class FakeTransport:
    def __init__(self, peer: tuple[str, int]) -> None:
        self.peer = peer
        self.aborted = False
        self.written: list[bytes] = []

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.peer if name == "peername" else default

    def abort(self) -> None:
        self.aborted = True

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def is_closing(self) -> bool:
        return self.aborted


def _cfg() -> Config:
    # OAP on a port nobody listens on: the connector keeps retrying in the background
    return Config(llama_mgmt_port=0, llama_data_port=0, cmd_port=0, dock_port=0, oap_mgmt_port=1,
                  oap_data_port=1)  # fmt: skip


async def test_non_loopback_engine_refused() -> None:
    dock = Dock(_cfg())
    for host in ("10.1.2.3", "192.168.0.5", "2001:db8::1"):
        conn = EngineConn(dock.pipeline)
        t = FakeTransport((host, 40000))
        conn.connection_made(t)  # type: ignore[arg-type]
        assert t.aborted and conn.state == "closed" and t.written == []
    assert dock.stats.engines_rejected == 3
    assert dock.stats.drops["engine_non_loopback_peer"] == 3
    for host in ("127.0.0.1", "::1", "::ffff:127.0.0.1"):
        conn = EngineConn(dock.pipeline)
        t = FakeTransport((host, 40000))
        conn.connection_made(t)  # type: ignore[arg-type]
        assert not t.aborted and conn.state == "hello"
        conn.connection_lost(None)


async def test_lifecycle_in_process() -> None:
    cfg = _cfg()
    listeners = Listeners.bind(cfg)
    dock = Dock(cfg)
    ports = await dock.start(listeners)
    assert set(ports) == {"llama_mgmt", "llama_data", "dock", "cmd"}
    assert all(p > 0 for p in ports.values())
    eng = FakeEngine(ports["dock"], "inproc")
    t0 = time.perf_counter_ns()
    assert await eng.dock() == b"OK"
    await eventually(lambda: dock.pipeline.router.slot.active_name == "inproc", what="docked")
    handshake_us = (time.perf_counter_ns() - t0) / 1000
    assert await dock.commands.handle(b"STATUS\n") == "ACTIVE inproc"
    # consistency, not a time budget: the switch was measured (in microseconds) and is a
    # part of the handshake this test saw from the outside
    assert 0 < dock.pipeline.last_switch_us <= handshake_us
    eng.audio(3)
    hop = dock.pipeline.hop
    await eventually(lambda: dock.stats.drops["oap_down"] == 0 and hop.pending, what="queued")
    tasks = set(dock.supervisor.tasks)
    assert tasks
    await dock.stop()
    assert all(t.done() for t in tasks) and not dock.supervisor.tasks
    await asyncio.wait_for(eng.closed.wait(), 5)
    assert dock.pipeline.router.slot.active is None
    await eng.close()
    # the listeners are closed: nothing answers on the dock port any more
    try:
        _, w = await asyncio.open_connection("127.0.0.1", ports["dock"])
    except OSError:
        pass
    else:
        w.close()
        raise AssertionError("dock port still open after stop")
    assert Packet(3, b"x").call_id == 3
