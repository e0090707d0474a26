"""One engine connection on the dock port (docs/wire.md#engine-dock): a thin shell around
``protocol.connection.EngineDockConnection`` (HELLO phase, then tagged frames).

Rule 1: a peer mistake (non-loopback peer, bad HELLO, unknown tag or mgmt type, oversize
packet: on this channel there is no length prefix, so a bad header loses the frame
boundary) closes only this connection, with the protocol's ``ERR`` line where one exists
and a WARN naming the reason; the active engine and every other connection are untouched.
Rule 2: which engine is active, what becomes of its audio, and when reading pauses are
decided elsewhere (``ttsdock.slot``, ``ttsdock.hop``); this file reports events to its
``EngineSink`` and does what it is told (write, pause or resume reading, retire, abort).
"""

from __future__ import annotations

import asyncio
from typing import Protocol, cast

import structlog

from protocol.connection import EngineDockConnection, Phase, Role
from protocol.errors import ProtocolError
from protocol.framing import NEED_DATA
from protocol.hello import REASON_TIMEOUT_OR_TOO_LONG, Hello, HelloRejected
from protocol.mgmt import MAX_CUSTOM_ENGINE, Custom, MgmtMessage, Ping, Pong, encode_mgmt
from protocol.packet import Packet
from svc.keepalive import Keepalive
from svc.net import is_loopback, tune_socket

log = structlog.get_logger(__name__)

HELLO_TIMEOUT = 2.0  # docs/wire.md#handshake: the HELLO line must arrive within 2 s
SHUTDOWN_GRACE = 2.0  # docs/wire.md#engine-slot: a replaced engine is force-closed after 2 s
PONG_TIMEOUT = 0.6  # docs/wire.md#keepalive: > 600 ms without a PONG clears the slot
ENGINE_BUFFER_BYTES = 8 << 20  # text/mgmt queued for an engine that does not read

PING_FRAME = b"\x02\x04"
PONG_FRAME = b"\x02\x05"


def mgmt_frame(msg: MgmtMessage) -> bytes:
    return b"\x02" + encode_mgmt(msg, max_custom=MAX_CUSTOM_ENGINE)


class EngineSink(Protocol):
    """What an engine connection reports; the dock implements it."""

    def engine_opened(self, conn: EngineConn) -> None: ...

    def engine_rejected(self, conn: EngineConn, reason: str, detail: str = "") -> None: ...

    def engine_docked(self, conn: EngineConn) -> int:
        """HELLO passed; returns the connection's generation."""

    def engine_audio(self, conn: EngineConn, pkt: Packet) -> None: ...

    def engine_read_done(self, conn: EngineConn) -> None:
        """Every complete frame of one socket read has been reported."""

    def engine_malformed(self, conn: EngineConn, exc: ProtocolError) -> None: ...

    def engine_gone(self, conn: EngineConn, reason: str, was_docked: bool) -> None:
        """The connection is closed (``was_docked``: it had passed HELLO)."""


class EngineConn(asyncio.Protocol):
    """Phases from ``protocol.connection``: hello -> deciding -> frames -> closed."""

    def __init__(self, sink: EngineSink) -> None:
        self.sink = sink
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.conn = EngineDockConnection(Role.DOCK)
        self.peer = ""
        self.name = ""
        self.generation = 0
        self.keepalive = Keepalive(self.loop.time(), PONG_TIMEOUT)
        self.close_reason = "closed_by_engine"
        self._hello_timer: asyncio.TimerHandle | None = None
        self._kill_timer: asyncio.TimerHandle | None = None

    @property
    def docked(self) -> bool:
        return self.conn.phase is Phase.FRAMES

    @property
    def state(self) -> str:
        return self.conn.phase.value

    # -- asyncio.Protocol -------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        host = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        self.peer = f"{host}:{peer[1]}" if host else ""
        self.sink.engine_opened(self)
        if not is_loopback(host):
            self.sink.engine_rejected(self, "non_loopback_peer")
            self.conn.close()
            transport.abort()
            return
        tune_socket(transport.get_extra_info("socket"))
        self._hello_timer = self.loop.call_later(HELLO_TIMEOUT, self._hello_timed_out)

    def data_received(self, data: bytes) -> None:
        conn = self.conn
        if conn.phase is Phase.FRAMES:
            conn.frames.feed(data)
            self._frames()
            return
        try:
            conn.feed(data)
        except HelloRejected as exc:
            self._reject(exc)
            return
        ev = conn.next_event()
        if isinstance(ev, Hello):
            self._accept(ev)

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        for timer in (self._hello_timer, self._kill_timer):
            if timer is not None:
                timer.cancel()
        was_docked = self.docked
        self.conn.close()
        self.sink.engine_gone(self, self.close_reason, was_docked)

    # -- handshake --------------------------------------------------------------------
    def _hello_timed_out(self) -> None:
        self._hello_timer = None
        if self.conn.phase is Phase.HELLO:
            self._reject(HelloRejected(REASON_TIMEOUT_OR_TOO_LONG, "no HELLO line within 2 s"))

    def _reject(self, exc: HelloRejected) -> None:
        if self._hello_timer is not None:
            self._hello_timer.cancel()
        reply = self.conn.reject(exc)
        self.sink.engine_rejected(self, exc.reason, exc.detail)
        if self.transport is not None:
            self.transport.write(reply)
            self.transport.close()

    def _accept(self, hello: Hello) -> None:
        if self._hello_timer is not None:
            self._hello_timer.cancel()
            self._hello_timer = None
        assert self.transport is not None
        self.name = hello.name
        self.transport.write(self.conn.accept())
        self.keepalive = Keepalive(self.loop.time(), PONG_TIMEOUT)
        self.generation = self.sink.engine_docked(self)
        if self.docked:
            self._frames()

    # -- frames after OK --------------------------------------------------------------
    def _frames(self) -> None:
        """Hot path: every complete frame of this read, then ``engine_read_done``."""
        next_event = self.conn.frames.next_event
        sink = self.sink
        try:
            while True:
                ev = next_event()
                cls = type(ev)
                if cls is Packet:
                    sink.engine_audio(self, ev)  # type: ignore[arg-type]
                elif cls is Pong:
                    self.keepalive.pong(self.loop.time())
                elif cls is Ping:
                    self.write(PONG_FRAME)
                elif ev is NEED_DATA:
                    break
                # CALL_END / SPEECH_* / CUSTOM from an engine: read fully and ignored
                if self.transport is None or self.transport.is_closing():
                    break
        except ProtocolError as exc:
            sink.engine_read_done(self)
            sink.engine_malformed(self, exc)
            self.close_reason = "protocol_error:" + exc.reason
            self.abort()
            return
        sink.engine_read_done(self)

    # -- control ----------------------------------------------------------------------
    def writable(self) -> bool:
        """``False`` once the transport is closing (aborted, ``connection_lost`` pending):
        a write would be dropped silently."""
        t = self.transport
        return t is not None and not t.is_closing()

    def write(self, data: bytes) -> bool:
        """Write now; ``False`` (nothing written) when the transport is gone or closing."""
        t = self.transport
        if t is not None and not t.is_closing():
            t.write(data)
            return True
        return False

    def buffered(self) -> int:
        return self.transport.get_write_buffer_size() if self.transport is not None else 0

    def pause_reading(self) -> None:
        """Back-pressure: stop reading this engine; its keepalive deadline stops counting."""
        t = self.transport
        if t is not None and not self.keepalive.paused:
            self.keepalive.pause(self.loop.time())
            t.pause_reading()

    def resume_reading(self) -> None:
        t = self.transport
        if self.keepalive.paused:
            self.keepalive.resume(self.loop.time())
            if t is not None and not t.is_closing():
                t.resume_reading()

    def retire(self, shutdown: Custom) -> None:
        """Replaced by a newer engine: CUSTOM SHUTDOWN now, force-close after the grace."""
        self.write(mgmt_frame(shutdown))
        if self.transport is not None:
            self._kill_timer = self.loop.call_later(SHUTDOWN_GRACE, self._force_close)

    def _force_close(self) -> None:
        self._kill_timer = None
        if self.transport is not None:
            log.info("engine_force_closed", engine=self.name, generation=self.generation)
            self.close_reason = "force_closed"
            self.transport.abort()

    def abort(self, reason: str | None = None) -> None:
        if reason is not None:
            self.close_reason = reason
        if self.transport is not None:
            self.transport.abort()
