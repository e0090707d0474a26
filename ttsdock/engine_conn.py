"""One engine connection on the dock port (WIRE.md 3): a thin shell around
``protocol.hello.LineReader`` / ``parse_hello`` (handshake) and
``protocol.engine_frames.EngineFrameDecoder`` (tagged frames).

Rule 1: a peer mistake (non-loopback peer, bad HELLO, unknown tag or mgmt type,
oversize packet) closes only this connection, with the protocol's ``ERR`` line
where one exists and a WARN naming the reason; the active engine is untouched.
Rule 2: which engine is active is not decided here but in ``ttsdock.slot``; this
file only reports "passed HELLO" and "gone" to the dock.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, cast

import structlog

from protocol.engine_frames import EngineFrameDecoder
from protocol.errors import ProtocolError
from protocol.framing import NeedData
from protocol.hello import (
    OK_LINE,
    REASON_TIMEOUT_OR_TOO_LONG,
    Hello,
    HelloRejected,
    LineReader,
    parse_hello,
)
from protocol.mgmt import MAX_CUSTOM_ENGINE, Custom, Ping, Pong, encode_mgmt
from protocol.packet import Packet
from svc.net import is_loopback, tune_socket

if TYPE_CHECKING:
    from ttsdock.server import Dock

log = structlog.get_logger(__name__)

HELLO_TIMEOUT = 2.0  # WIRE.md 3: the HELLO line must arrive within 2 s
SHUTDOWN_GRACE = 2.0  # WIRE.md 3: a replaced engine is force-closed after 2 s
ENGINE_BUFFER_BYTES = 8 << 20  # text/mgmt queued for an engine that does not read

PING_FRAME = b"\x02\x04"
PONG_FRAME = b"\x02\x05"


def mgmt_frame(msg: Ping | Pong | Custom | object) -> bytes:
    return b"\x02" + encode_mgmt(msg, max_custom=MAX_CUSTOM_ENGINE)  # type: ignore[arg-type]


class EngineConn(asyncio.Protocol):
    """States: ``hello`` -> ``docked`` -> ``closed`` (or ``hello`` -> ``closed``)."""

    def __init__(self, dock: Dock) -> None:
        self.dock = dock
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.state = "hello"
        self.peer = ""
        self.name = ""
        self.generation = 0
        self.reader = LineReader()
        self.decoder = EngineFrameDecoder()
        self.last_pong = 0.0
        #: seconds since ``last_pong`` during which the dock's own loop was not running
        #: (set by the keepalive task; see ``Dock._keepalive``), and whether the PONG
        #: deadline had already passed at the previous keepalive tick
        self.stall_credit = 0.0
        self.overdue = False
        self.close_reason = "closed_by_engine"
        self._hello_timer: asyncio.TimerHandle | None = None
        self._kill_timer: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol -------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        host = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        self.peer = f"{host}:{peer[1]}" if host else ""
        self.dock.engine_conns.add(self)
        if not is_loopback(host):
            self.dock.engine_rejected(self, "non_loopback_peer")
            self.state = "closed"
            transport.abort()
            return
        tune_socket(transport.get_extra_info("socket"))
        self._hello_timer = self.loop.call_later(HELLO_TIMEOUT, self._hello_timed_out)

    def data_received(self, data: bytes) -> None:
        if self.state == "docked":
            self._frames(data)
        elif self.state == "hello":
            self._hello(data)

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        for timer in (self._hello_timer, self._kill_timer):
            if timer is not None:
                timer.cancel()
        was = self.state
        self.state = "closed"
        self.dock.engine_conns.discard(self)
        if was == "docked":
            self.dock.engine_gone(self, self.close_reason)

    # -- handshake --------------------------------------------------------------------
    def _hello(self, data: bytes) -> None:
        try:
            line = self.reader.feed(data)
            if line is None:
                return
            hello = parse_hello(line)
        except HelloRejected as exc:
            self._reject(exc)
            return
        self._accept(hello, self.reader.rest)

    def _hello_timed_out(self) -> None:
        self._hello_timer = None
        if self.state == "hello":
            self._reject(HelloRejected(REASON_TIMEOUT_OR_TOO_LONG, "no HELLO line within 2 s"))

    def _reject(self, exc: HelloRejected) -> None:
        self.state = "closed"
        if self._hello_timer is not None:
            self._hello_timer.cancel()
        self.dock.engine_rejected(self, exc.reason, exc.detail)
        if self.transport is not None:
            self.transport.write(exc.reply)
            self.transport.close()

    def _accept(self, hello: Hello, rest: bytes) -> None:
        if self._hello_timer is not None:
            self._hello_timer.cancel()
            self._hello_timer = None
        assert self.transport is not None
        self.name = hello.name
        self.state = "docked"
        self.last_pong = self.loop.time()
        self.stall_credit = 0.0
        self.transport.write(OK_LINE)
        self.generation = self.dock.engine_docked(self)
        if rest and self.state == "docked":
            self._frames(rest)

    # -- frames after OK --------------------------------------------------------------
    def _frames(self, data: bytes) -> None:
        decoder = self.decoder
        decoder.feed(data)
        dock = self.dock
        try:
            while True:
                ev = decoder.next_event()
                cls = type(ev)
                if cls is Packet:
                    assert isinstance(ev, Packet)
                    if self.generation == dock.slot.generation:
                        dock.forward_audio(ev)
                    else:
                        dock.stats.drops["stale_engine"] += 1
                elif cls is NeedData:
                    dock.flush_audio()
                    return
                elif cls is Pong:
                    self.last_pong = self.loop.time()
                    self.stall_credit = 0.0
                    self.overdue = False
                elif cls is Ping:
                    self.write(PONG_FRAME)
                # CALL_END / SPEECH_* / CUSTOM from an engine: read fully and ignored
                if self.state != "docked":
                    dock.flush_audio()
                    return
        except ProtocolError as exc:
            dock.flush_audio()
            dock.stats.drops["malformed_engine"] += 1
            log.warning(
                "engine_frame_rejected",
                engine=self.name,
                generation=self.generation,
                reason=exc.reason,
                detail=exc.detail,
            )
            self.close_reason = "protocol_error:" + exc.reason
            self.abort()

    def silent_for(self, now: float) -> float:
        """Seconds without a PONG, not counting time the dock's loop was stalled."""
        return now - self.last_pong - self.stall_credit

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
