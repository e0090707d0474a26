"""Pipeline channels (docs/wire.md#pipeline-channels): LLaMA connects in (mgmt, data),
the dock connects out to OAP (mgmt, data). Thin shells: read bytes, feed
``protocol.framing.FrameDecoder``, open the optional AES-GCM body, hand bodies to the
dock; write what the dock says.

Rule 1: a framing error (an announced length over the bound, a body that fails AES-GCM
authentication) loses the frame boundary or the peer's trust: it closes only the
connection that sent it, with a WARN naming the reason. A well-framed body that is not a
valid Packet or mgmt message (call_id 0, payload size not matching the frame, size over
the limit, unknown mgmt type) costs only itself: it is dropped, counted
(``drop_bad_packet``) and logged as a rate-limited WARN, and the connection keeps reading,
as the reference does.
Rule 2: these shells decide nothing: they report to a ``ChannelSink`` (the dock).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Protocol, cast

import structlog

from protocol.errors import ProtocolError
from protocol.framing import LENGTH, FrameCipher, FrameDecoder, NeedData
from protocol.mgmt import (
    PONG,
    CallEnd,
    Custom,
    MgmtMessage,
    Ping,
    Pong,
    SpeechActive,
    SpeechIdle,
    decode_mgmt,
    encode_mgmt,
)
from protocol.packet import Packet, decode_packet
from svc.net import tune_socket

log = structlog.get_logger(__name__)

# every CUSTOM request from LLaMA is answered (docs/wire.md#mgmt-messages) with an empty
# CUSTOM body, the reference's bytes ``00000003 0a 0000``
CUSTOM_REPLY = Custom(b"")


class ChannelSink(Protocol):
    """What a pipeline channel reports; the dock implements it."""

    def channel_opened(self, ch: FramedChannel) -> None: ...

    def channel_closed(self, ch: FramedChannel) -> None: ...

    def channel_failed(self, ch: FramedChannel, exc: ProtocolError) -> None:
        """A framing error: the channel closes."""

    def bad_packet(self, ch: FramedChannel, exc: ProtocolError) -> None:
        """A well-framed bad body: dropped, the channel stays."""

    def on_text(self, pkt: Packet) -> None: ...

    def on_mgmt(self, ch: FramedChannel, msg: MgmtMessage) -> None:
        """A mgmt message from LLaMA (PING and CUSTOM are answered by the channel)."""

    def oap_data_unexpected(self) -> None: ...

    def oap_write_paused(self) -> None: ...

    def oap_write_resumed(self) -> None: ...


class FramedChannel(asyncio.Protocol):
    """One pipeline connection. ``role`` names it in logs: llama_mgmt, llama_data, oap_mgmt,
    oap_data."""

    role = "channel"

    def __init__(self, sink: ChannelSink, cipher: FrameCipher | None) -> None:
        self.sink = sink
        self.cipher = cipher
        self.decoder = FrameDecoder()
        self.transport: asyncio.Transport | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.peer = ""

    # -- asyncio.Protocol -------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport = cast(asyncio.Transport, transport)
        tune_socket(transport.get_extra_info("socket"))
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and peer else ""
        self.sink.channel_opened(self)

    def data_received(self, data: bytes) -> None:
        decoder = self.decoder
        decoder.feed(data)
        cipher = self.cipher
        while True:
            try:  # framing: a bad length or a failed authentication closes the channel
                body = decoder.next_body()
                if isinstance(body, NeedData):
                    return
                if cipher is not None:
                    body = cipher.open(body)
            except ProtocolError as exc:
                self.fail(exc)
                return
            try:  # the body: a bad Packet or mgmt message costs only itself
                self.on_body(body)
            except ProtocolError as exc:
                self.sink.bad_packet(self, exc)
            if self.transport is None or self.transport.is_closing():
                return

    def eof_received(self) -> bool | None:
        return None  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if not self.closed.done():
            self.closed.set_result(None)
        self.sink.channel_closed(self)

    # -- helpers ----------------------------------------------------------------------
    def fail(self, exc: ProtocolError) -> None:
        self.sink.channel_failed(self, exc)
        self.close()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    @property
    def connected(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    def send_body(self, body: bytes) -> None:
        t = self.transport
        if t is None or t.is_closing():
            return
        if self.cipher is not None:
            body = self.cipher.seal(body)
        t.write(LENGTH.pack(len(body)) + body)

    def send_mgmt(self, msg: MgmtMessage) -> None:
        self.send_body(encode_mgmt(msg))

    def on_body(self, body: bytes) -> None:
        raise NotImplementedError


class LlamaMgmt(FramedChannel):
    role = "llama_mgmt"

    def on_body(self, body: bytes) -> None:
        msg = decode_mgmt(body)
        if isinstance(msg, Ping):
            self.send_mgmt(PONG)
        elif isinstance(msg, Custom):
            log.info("custom_received", channel=self.role, text=msg.text[:200])
            self.send_mgmt(CUSTOM_REPLY)
        self.sink.on_mgmt(self, msg)


class LlamaData(FramedChannel):
    role = "llama_data"

    def on_body(self, body: bytes) -> None:
        self.sink.on_text(decode_packet(body))


REPLY_EXPIRY = 5.0  # seconds after which an unanswered CUSTOM request to OAP is forgotten
MAX_OUTSTANDING = 64  # CUSTOM requests to OAP awaiting a reply, at most


class OapMgmt(FramedChannel):
    """The dock's mgmt connection to OAP: FLUSH_TTS requests await a CUSTOM reply."""

    role = "oap_mgmt"

    def __init__(self, sink: ChannelSink, cipher: FrameCipher | None) -> None:
        super().__init__(sink, cipher)
        # CUSTOM requests sent and not answered yet, oldest first: (sent at, reply future)
        self.waiters: deque[tuple[float, asyncio.Future[bytes]]] = deque()

    @property
    def outstanding(self) -> int:
        return len(self.waiters)

    def _forget_stale(self, now: float) -> None:
        """A request unanswered for ``REPLY_EXPIRY`` seconds never will be: forget it, so that
        a later CUSTOM *request* from OAP is not mistaken for its reply and left unanswered.
        A reply slower than that would be answered like a request (harmless: an empty
        CUSTOM), which is why the expiry is far beyond the 200 ms FLUSH_TTS wait."""
        while self.waiters and (
            now - self.waiters[0][0] > REPLY_EXPIRY or len(self.waiters) > MAX_OUTSTANDING
        ):
            _, fut = self.waiters.popleft()
            if not fut.done():
                fut.cancel()

    def request(self, msg: Custom) -> asyncio.Future[bytes]:
        """Send a CUSTOM request; the future gets the reply's bytes (the caller may stop
        waiting early: a late reply is still consumed as the reply, never answered)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bytes] = loop.create_future()
        self.send_mgmt(msg)
        self.waiters.append((loop.time(), fut))
        self._forget_stale(loop.time())
        return fut

    def on_body(self, body: bytes) -> None:
        msg = decode_mgmt(body)
        if isinstance(msg, Ping):
            self.send_mgmt(PONG)
        elif isinstance(msg, Custom):
            self._forget_stale(asyncio.get_running_loop().time())
            if self.waiters:
                _, fut = self.waiters.popleft()
                if not fut.done():
                    fut.set_result(msg.data)
            else:  # a request from OAP: every CUSTOM request gets a reply
                self.send_mgmt(Custom(b""))
        elif isinstance(msg, CallEnd | SpeechActive | SpeechIdle | Pong):
            pass  # nothing flows upstream from OAP through the dock

    def connection_lost(self, exc: Exception | None) -> None:
        for _, fut in self.waiters:
            if not fut.done():
                fut.cancel()
        self.waiters.clear()
        super().connection_lost(exc)


class OapData(FramedChannel):
    """The dock's data connection to OAP. Its transport's write-buffer marks drive the
    back-pressure on the active engine (``ttsdock.hop``): above ``high`` asyncio calls
    ``pause_writing``, below ``low`` ``resume_writing``."""

    role = "oap_data"

    def __init__(self, sink: ChannelSink, cipher: FrameCipher | None, high: int, low: int) -> None:
        super().__init__(sink, cipher)
        self.high, self.low = high, low

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        cast(asyncio.Transport, transport).set_write_buffer_limits(high=self.high, low=self.low)
        super().connection_made(transport)

    def pause_writing(self) -> None:
        self.sink.oap_write_paused()

    def resume_writing(self) -> None:
        self.sink.oap_write_resumed()

    def on_body(self, body: bytes) -> None:
        self.sink.oap_data_unexpected()  # OAP sends nothing on data
