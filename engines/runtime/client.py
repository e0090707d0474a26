"""EngineClient: the engine's connection to the dock (docs/wire.md#engine-dock, engine side).

Rule 1: connect, HELLO, read ``OK``/``ERR``, then read tagged frames, answer
PING with PONG inside the same read callback, hand every other event to the
``LinkHandler``, and write audio packets; reconnect forever until stopped.
Rule 2: this file does not know calls or models; it moves bytes and signals.

Reconnect rule (and the C++ bug it avoids): every path out of a session --
connect refused or timed out, ``ERR``, no HELLO answer, malformed frame, EOF,
reset, or a dock that sends nothing for ``DOCK_SILENCE`` (the dock PINGs every
200 ms) -- closes the socket and comes back to one loop that waits
``RETRY_DELAY`` before the next attempt, whatever the outcome was. There is
no other loop and no read without a timeout, so nothing can spin or hang.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Protocol, cast

import structlog

from protocol.audio import encode_audio_header
from protocol.connection import EngineDockConnection, Phase, Role
from protocol.engine_frames import EngineEvent, encode_engine_frame, encode_engine_packet_header
from protocol.errors import ProtocolError
from protocol.framing import NeedData
from protocol.hello import Hello, HelloReply
from protocol.mgmt import PONG, Ping
from svc.keepalive import Keepalive, Ticks
from svc.net import tune_socket

log = structlog.get_logger(__name__)

CONNECT_TIMEOUT = 2.0  # docs/wire.md#engine-reconnects: connect timeout 2 s
HELLO_TIMEOUT = 2.0  # docs/wire.md#engine-reconnects: HELLO answer timeout 2 s
RETRY_DELAY = 0.2  # docs/wire.md#engine-reconnects: reconnect every 200 ms, retry 200 ms after ERR
DOCK_SILENCE = 1.0  # no frame at all for 1 s: the dock (PING every 200 ms) is gone
SILENCE_CHECK = 0.1  # how often the silence rule is checked
STALL_SLACK = 0.1  # a check later than this: our own process was stalled (not counted)
WRITE_HIGH_WATER = 512 * 1024  # bytes buffered towards the dock before senders wait
UNREACHABLE_LOG_EVERY = 30.0  # seconds between repeated "dock unreachable" INFO lines

_PONG_FRAME = encode_engine_frame(PONG)


class LinkHandler(Protocol):
    def on_docked(self) -> None: ...

    def on_undocked(self) -> None: ...

    def on_event(self, event: EngineEvent, t_rx_ns: int) -> None:
        """Every decoded frame except PING (answered here); runs in the read callback."""


class _Counters(Protocol):
    docks: int
    dock_losses: int
    hello_rejections: int
    frames_malformed: int
    pings_answered: int


class DockLink(asyncio.Protocol):
    """One TCP connection to the dock: the phases of ``protocol.connection`` (engine side):
    hello -> frames -> closed."""

    def __init__(self, handler: LinkHandler, stats: _Counters) -> None:
        loop = asyncio.get_running_loop()
        self.handler = handler
        self.stats = stats
        self.transport: asyncio.Transport | None = None
        self.conn = EngineDockConnection(Role.ENGINE)
        self.reply: asyncio.Future[HelloReply] = loop.create_future()
        self.lost: asyncio.Future[None] = loop.create_future()
        self.last_rx = time.monotonic()
        self._paused = False
        self._drain: asyncio.Future[None] | None = None

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses; same interface
        self.transport = cast(asyncio.Transport, transport)
        tune_socket(transport.get_extra_info("socket"))
        self.transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)

    @property
    def phase(self) -> Phase:
        return self.conn.phase

    def data_received(self, data: bytes) -> None:
        t_ns = time.monotonic_ns()
        self.last_rx = t_ns / 1e9
        conn = self.conn
        if conn.phase is Phase.FRAMES:
            conn.frames.feed(data)
            self._frames(t_ns)
            return
        if conn.phase is not Phase.HELLO:
            return
        try:
            conn.feed(data)
        except ProtocolError as exc:
            if not self.reply.done():
                self.reply.set_exception(exc)
            self.abort()
            return
        reply = conn.next_event()
        if isinstance(reply, HelloReply):
            if not self.reply.done():
                self.reply.set_result(reply)
            if reply.ok:
                self._frames(t_ns)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.conn.phase is not Phase.CLOSED:
            self.conn.close()
        if not self.reply.done():
            self.reply.set_exception(ConnectionError("dock closed the connection"))
        if not self.lost.done():
            self.lost.set_result(None)
        self._wake_drain()

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._wake_drain()

    # -- frames ----------------------------------------------------------------------------

    def _frames(self, t_ns: int) -> None:
        conn = self.conn
        try:
            while conn.phase is Phase.FRAMES:
                event = conn.next_event()
                if isinstance(event, NeedData):
                    return
                if isinstance(event, Ping):
                    # PONG at once, before anything else in this read is handled.
                    assert self.transport is not None
                    self.transport.write(_PONG_FRAME)
                    self.stats.pings_answered += 1
                    continue
                assert not isinstance(event, Hello | HelloReply)
                try:
                    self.handler.on_event(event, t_ns)
                except Exception:  # a runtime bug must not cost the link
                    log.exception("event_handler_failed", event=type(event).__name__)
        except ProtocolError as exc:
            self.stats.frames_malformed += 1
            log.warning("frame_malformed", reason=exc.reason, detail=exc.detail)
            self.abort()

    # -- writing ---------------------------------------------------------------------------

    @property
    def docked(self) -> bool:
        return self.conn.phase is Phase.FRAMES

    @property
    def write_paused(self) -> bool:
        return self._paused

    def write(self, data: bytes) -> None:
        if self.transport is not None and self.conn.phase is not Phase.CLOSED:
            self.transport.write(data)

    async def drain(self) -> None:
        if not self._paused or self.conn.phase is Phase.CLOSED:
            return
        if self._drain is None or self._drain.done():
            self._drain = asyncio.get_running_loop().create_future()
        await asyncio.shield(self._drain)

    def _wake_drain(self) -> None:
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    def abort(self) -> None:
        if self.conn.phase is not Phase.CLOSED:
            self.conn.close()
        if self.transport is not None:
            self.transport.abort()

    def close(self) -> None:
        """Flush what is buffered, then close (orderly)."""
        if self.conn.phase is not Phase.CLOSED:
            self.conn.close()
        if self.transport is not None:
            self.transport.close()


class EngineClient:
    """Keeps the engine docked: connect, HELLO, serve the link, reconnect."""

    def __init__(
        self,
        name: str,
        host: str,
        port: int,
        handler: LinkHandler,
        stats: _Counters,
    ) -> None:
        self.hello = EngineDockConnection(Role.ENGINE).hello(Hello(name))
        self.host = host
        self.port = port
        self.handler = handler
        self.stats = stats
        self.link: DockLink | None = None
        self.attempts = 0

    @property
    def docked(self) -> bool:
        return self.link is not None and self.link.docked

    # -- AudioSink -------------------------------------------------------------------------

    def send_audio(self, call_id: int, pcm: bytes) -> bool:
        """Write one audio packet now, stamped with the current monotonic time
        (docs/wire.md#audio-payload)."""
        link = self.link
        if link is None or not link.docked:
            return False
        t_us = time.monotonic_ns() // 1000
        link.write(
            encode_engine_packet_header(call_id, 12 + len(pcm)) + encode_audio_header(t_us) + pcm
        )
        return True

    @property
    def write_paused(self) -> bool:
        link = self.link
        return link is not None and link.write_paused

    async def drain(self) -> None:
        link = self.link
        if link is not None:
            await link.drain()

    # -- the reconnect loop ----------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Dock and stay docked until ``stop`` is set; then close the link."""
        stop_wait: asyncio.Future[bool] = asyncio.ensure_future(stop.wait())
        last_info = 0.0
        try:
            while not stop.is_set():
                self.attempts += 1
                outcome = await self._session(stop_wait)
                if stop.is_set():
                    break
                if outcome == "unreachable":
                    now = time.monotonic()
                    if now - last_info >= UNREACHABLE_LOG_EVERY:
                        last_info = now
                        log.info(
                            "dock_unreachable",
                            host=self.host,
                            port=self.port,
                            attempts=self.attempts,
                            retry_s=RETRY_DELAY,
                        )
                else:
                    last_info = 0.0
                await asyncio.wait({stop_wait}, timeout=RETRY_DELAY)
        finally:
            stop_wait.cancel()
            link, self.link = self.link, None
            if link is not None:
                link.close()

    async def _session(self, stop_wait: asyncio.Future[bool]) -> str:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                _t, link = await loop.create_connection(
                    lambda: DockLink(self.handler, self.stats), self.host, self.port
                )
        except (OSError, TimeoutError) as exc:
            log.debug("dock_connect_failed", error=str(exc) or type(exc).__name__)
            return "unreachable"
        assert isinstance(link, DockLink)
        link.write(self.hello)
        try:
            async with asyncio.timeout(HELLO_TIMEOUT):
                waits: set[asyncio.Future[Any]] = {link.reply, stop_wait}
                done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            if link.reply not in done:
                link.abort()
                return "stopped"
            reply = link.reply.result()
        except TimeoutError:
            log.warning("hello_unanswered", timeout_s=HELLO_TIMEOUT)
            link.abort()
            return "failed"
        except ProtocolError as exc:
            log.warning("hello_reply_malformed", reason=exc.reason, detail=exc.detail)
            link.abort()
            return "failed"
        except ConnectionError:
            log.info("hello_connection_lost")
            return "failed"
        if not reply.ok:
            self.stats.hello_rejections += 1
            log.warning("hello_rejected", reason=reply.reason, retry_s=RETRY_DELAY)
            link.abort()
            return "failed"
        self.link = link
        self.stats.docks += 1
        self.attempts = 0
        log.info("engine_docked", host=self.host, port=self.port)
        self.handler.on_docked()
        try:
            return await self._watch(link, stop_wait)
        finally:
            self.link = None
            if link.phase is not Phase.CLOSED:
                link.close()  # stopping: flush what is buffered, then close
            self.handler.on_undocked()

    async def _watch(self, link: DockLink, stop_wait: asyncio.Future[bool]) -> str:
        """Until the link closes, stop is set, or the dock is silent for ``DOCK_SILENCE``.

        Silence is ``svc.keepalive``'s rule (the dock's PONG deadline, with any frame from
        the dock as the sign of life): a check that wakes more than ``STALL_SLACK`` late
        (the process was descheduled) credits the lateness, and the verdict needs two
        checks in a row, so frames that arrived during a stall are read first (uvloop
        runs due timers before I/O).
        """
        ticks = Ticks(time.monotonic(), SILENCE_CHECK, STALL_SLACK)
        silence = Keepalive(link.last_rx, DOCK_SILENCE)
        while True:
            waits: set[asyncio.Future[Any]] = {link.lost, stop_wait}
            done, _ = await asyncio.wait(
                waits, timeout=SILENCE_CHECK, return_when=asyncio.FIRST_COMPLETED
            )
            if stop_wait in done:
                return "stopped"
            if link.lost in done:
                self.stats.dock_losses += 1
                log.warning("dock_lost", reason="connection closed")
                return "lost"
            now = time.monotonic()
            late = ticks.late(now)
            if link.last_rx != silence.last_pong:  # a frame arrived: the credit starts over
                silence.pong(link.last_rx)
            if late:
                silence.stalled(late)
            if not silence.tick(now):
                continue
            self.stats.dock_losses += 1
            log.warning("dock_lost", reason="silent", silent_s=round(silence.silent_for(now), 3))
            link.abort()
            return "lost"
