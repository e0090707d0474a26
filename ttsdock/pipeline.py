"""The glue between the connection shells and the sans-I/O cores.

Rule 1: ``Pipeline`` implements the shells' narrow sinks (``channels.ChannelSink``,
``engine_conn.EngineSink``): it feeds each event to the core that decides (``router``
for upstream traffic and the slot, ``hop`` for audio) and performs the actions the core
returns on the connections it knows (the active engine, OAP mgmt and data); it logs drops
(rate-limited WARN). It decides nothing itself but what only I/O can tell: whether a
write is possible right now.
Rule 2: no lifecycle here: listeners, connectors and long-lived tasks belong to
``server.Dock``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import structlog
from structlog.contextvars import bound_contextvars

from protocol.engine_frames import encode_engine_frame
from protocol.errors import ProtocolError
from protocol.framing import FrameCipher
from protocol.mgmt import FLUSH_TTS, SHUTDOWN, CallMessage, Custom, MgmtMessage, Ping, Pong
from protocol.packet import Packet
from svc.tasks import Supervisor
from ttsdock import hop as hop_actions
from ttsdock import router as ra
from ttsdock.calls import CallTracker
from ttsdock.channels import FramedChannel, OapData, OapMgmt
from ttsdock.config import Config
from ttsdock.engine_conn import ENGINE_BUFFER_BYTES, EngineConn, mgmt_frame
from ttsdock.hold import HoldBuffer
from ttsdock.hop import AudioHop
from ttsdock.ratelimit import RateLimit
from ttsdock.router import Router
from ttsdock.stats import Stats

log = structlog.get_logger(__name__)

FLUSH_REPLY_TIMEOUT = 0.2  # FLUSH_TTS reply awaited at most 200 ms


class Pipeline:
    def __init__(self, cfg: Config, cipher: FrameCipher | None, supervisor: Supervisor) -> None:
        self.cfg = cfg
        self.cipher = cipher
        self.supervisor = supervisor
        self.stats = Stats()
        self.router: Router[EngineConn] = Router(
            self.stats,
            CallTracker(ended_memory=cfg.ended_calls),
            HoldBuffer(
                cfg.hold_packets,
                cfg.hold_bytes,
                cfg.hold_seconds,
                cfg.hold_calls,
                cfg.hold_total_bytes,
            ),
        )
        self.hop = AudioHop(
            self.stats,
            cipher.seal if cipher is not None else None,
            cfg.oap_buffer_bytes,
            cfg.oap_queue_seconds,
        )
        self.engine: EngineConn | None = None  # the active engine (mirror of the slot)
        self.engine_conns: set[EngineConn] = set()
        self.channels: set[FramedChannel] = set()
        self.llama: dict[str, FramedChannel] = {}
        self.oap_mgmt: OapMgmt | None = None
        self.oap_data: OapData | None = None
        self.warn_limit = RateLimit(1.0)
        self.closing = False
        self.last_switch_us = 0.0
        self.max_switch_us = 0.0

    # ================================================================ ChannelSink
    def channel_opened(self, ch: FramedChannel) -> None:
        self.channels.add(ch)
        if isinstance(ch, OapMgmt):
            self.oap_mgmt = ch
        elif isinstance(ch, OapData):
            self.oap_data = ch
            self._apply_hop(self.hop.oap_connected(time.monotonic()))
        else:
            old = self.llama.get(ch.role)
            self.llama[ch.role] = ch
            self.stats.llama_connects += 1
            if old is not None:
                log.info("llama_replaced", channel=ch.role, old=old.peer, new=ch.peer)
                old.close()
            else:
                log.info("llama_connected", channel=ch.role, peer=ch.peer)

    def channel_closed(self, ch: FramedChannel) -> None:
        self.channels.discard(ch)
        if ch is self.oap_mgmt:
            self.oap_mgmt = None
        elif ch is self.oap_data:
            self.oap_data = None
            self._apply_hop(self.hop.oap_disconnected())
        elif self.llama.get(ch.role) is ch:
            del self.llama[ch.role]
            log.info("llama_disconnected", channel=ch.role, peer=ch.peer)

    def channel_failed(self, ch: FramedChannel, exc: ProtocolError) -> None:
        self.stats.drops["malformed_" + ch.role] += 1
        log.warning(
            "frame_rejected", channel=ch.role, peer=ch.peer, reason=exc.reason, detail=exc.detail
        )

    def bad_packet(self, ch: FramedChannel, exc: ProtocolError) -> None:
        self.stats.drops["bad_packet"] += 1
        ok, suppressed = self.warn_limit.allow(("bad_packet", ch.role), time.monotonic())
        if ok:
            log.warning(
                "packet_dropped",
                channel=ch.role,
                peer=ch.peer,
                reason=exc.reason,
                detail=exc.detail,
                suppressed=suppressed,
            )

    def on_text(self, pkt: Packet) -> None:
        eng = self.engine
        ready = eng is not None and eng.writable()
        self._apply(self.router.text(pkt, time.monotonic(), ready))

    def on_mgmt(self, ch: FramedChannel, msg: MgmtMessage) -> None:
        self.stats.mgmt_frames_in += 1
        if not isinstance(msg, Ping | Pong | Custom):
            self.on_call_message(msg)

    def on_call_message(self, msg: CallMessage) -> None:
        self._apply(self.router.call_message(msg))

    def oap_data_unexpected(self) -> None:
        self.stats.drops["oap_data_unexpected"] += 1

    def oap_write_paused(self) -> None:
        self._apply_hop(self.hop.oap_write_paused())

    def oap_write_resumed(self) -> None:
        self._apply_hop(self.hop.oap_write_resumed())

    # ================================================================ EngineSink
    def engine_opened(self, conn: EngineConn) -> None:
        self.engine_conns.add(conn)

    def engine_rejected(self, conn: EngineConn, reason: str, detail: str = "") -> None:
        self.stats.engines_rejected += 1
        self.stats.drops["engine_" + reason] += 1
        log.warning("engine_rejected", peer=conn.peer, reason=reason, detail=detail)

    def engine_docked(self, conn: EngineConn) -> int:
        """HELLO passed: switch the slot at once (last connect wins)."""
        t0 = time.perf_counter_ns()
        old = self.engine
        generation, actions = self.router.dock(conn.name, conn, time.monotonic())
        conn.generation = generation
        self.engine = conn
        if old is not None:
            old.resume_reading()  # a replaced engine's frames are dropped: let it drain
        if self.hop.engine_paused:
            conn.pause_reading()  # OAP is still above its high-water mark
        self._apply(actions)
        switch_us = (time.perf_counter_ns() - t0) / 1000
        self.last_switch_us = switch_us
        self.max_switch_us = max(self.max_switch_us, switch_us)
        with bound_contextvars(engine=conn.name):
            if old is not None:
                log.info(
                    "engine_swapped",
                    generation=generation,
                    old=old.name,
                    old_generation=old.generation,
                    switch_us=round(switch_us, 1),
                )
            else:
                log.info("engine_docked", generation=generation, peer=conn.peer)
        return generation

    def engine_audio(self, conn: EngineConn, pkt: Packet) -> None:
        current = conn is self.engine
        dropped = self.hop.audio(pkt.call_id, pkt.payload, current, time.monotonic())
        if dropped is not None:
            self._warn_drop("audio_dropped", dropped.call_id, dropped.reason, detail=dropped.detail)

    def engine_read_done(self, conn: EngineConn) -> None:
        oap = self.oap_data
        t = oap.transport if oap is not None else None
        w = self.hop.end_of_read(t is not None and not t.is_closing(), time.monotonic())
        if w is not None and t is not None:
            # the chunks of one engine read leave with one writev: a burst costs one
            # syscall, a single chunk leaves at once all the same
            t.writelines(w.parts)

    def engine_malformed(self, conn: EngineConn, exc: ProtocolError) -> None:
        self.stats.drops["malformed_engine"] += 1
        log.warning(
            "engine_frame_rejected",
            engine=conn.name,
            generation=conn.generation,
            reason=exc.reason,
            detail=exc.detail,
        )

    def engine_gone(self, conn: EngineConn, reason: str, was_docked: bool) -> None:
        self.engine_conns.discard(conn)
        if not was_docked:
            return
        actions = self.router.leave(conn.generation, time.monotonic(), reason)
        if conn is self.engine:
            self.engine = None
        if self.closing:
            return
        with bound_contextvars(engine=conn.name):
            if actions:
                log.warning("engine_left", generation=conn.generation, reason=reason)
                self._apply(actions)
            else:
                log.info("engine_closed", generation=conn.generation, reason=reason)

    # ================================================================ actions
    def _apply_hop(self, actions: list[hop_actions.HopAction]) -> None:
        for a in actions:
            if isinstance(a, hop_actions.Write):
                oap = self.oap_data
                if oap is not None and oap.transport is not None:
                    oap.transport.writelines(a.parts)
            elif isinstance(a, hop_actions.PauseEngine):
                if self.engine is not None:
                    self.engine.pause_reading()
            elif self.engine is not None:
                self.engine.resume_reading()

    def _apply(self, actions: list[ra.RouterAction[EngineConn]]) -> None:
        for a in actions:
            if isinstance(a, ra.SendText):
                self._send_text(a.packet, a.from_hold)
            elif isinstance(a, ra.SendMgmt):
                eng = self.engine
                if eng is not None and eng.write(mgmt_frame(a.message)):
                    self.stats.mgmt_frames_to_engine += 1
            elif isinstance(a, ra.ToOap):
                self._to_oap(a.message)
            elif isinstance(a, ra.Dropped):
                self._warn_drop(a.event, a.call_id, a.reason, **a.extra)
            elif isinstance(a, ra.FlushOap):
                self.flush_oap(a.why)
            elif isinstance(a, ra.Retire):
                a.record.handle.retire(SHUTDOWN)
            elif isinstance(a, ra.CallEnded):
                with bound_contextvars(call_id=a.call_id):
                    log.info("call_ended")

    def _send_text(self, pkt: Packet, from_hold: bool) -> None:
        eng = self.engine
        if eng is None or not eng.writable():
            self.stats.drops["engine_closing"] += 1
            self._warn_drop("text_dropped", pkt.call_id, "engine_closing")
            return
        if eng.buffered() > ENGINE_BUFFER_BYTES:
            self.stats.drops["engine_backlog"] += 1
            self._warn_drop("text_dropped", pkt.call_id, "engine_backlog")
            return
        eng.write(encode_engine_frame(pkt))
        self.stats.text_frames_to_engine += 1
        self.stats.text_bytes_to_engine += len(pkt.payload)
        if from_hold:
            self.stats.text_delivered_from_hold += 1

    def _to_oap(self, msg: CallMessage) -> None:
        oap = self.oap_mgmt
        if oap is not None and oap.connected:
            oap.send_mgmt(msg)
            self.stats.mgmt_frames_to_oap += 1
        else:
            self.stats.drops["mgmt_oap_down"] += 1
            self._warn_drop("mgmt_dropped", msg.call_id, "oap_mgmt_down", type=type(msg).__name__)

    def flush_oap(self, why: str) -> None:
        """CUSTOM FLUSH_TTS to OAP; the reply is awaited in its own task (<= 200 ms)."""
        self.stats.flushes_sent += 1
        self.hop.flush()  # audio queued while OAP was down belongs to the engine that is gone
        oap = self.oap_mgmt
        if oap is None or not oap.connected:
            self.stats.flushes_unanswered += 1
            log.warning("flush_skipped", reason="oap_mgmt_down", why=why)
            return
        fut = oap.request(FLUSH_TTS)
        self.supervisor.spawn(self._await_flush(fut, why), "flush_tts")

    async def _await_flush(self, fut: asyncio.Future[bytes], why: str) -> None:
        done, _ = await asyncio.wait({fut}, timeout=FLUSH_REPLY_TIMEOUT)
        if not done or fut.cancelled():
            fut.cancel()
            self.stats.flushes_unanswered += 1
            log.warning("flush_unanswered", why=why, timeout_ms=int(FLUSH_REPLY_TIMEOUT * 1000))
            return
        self.stats.flushes_answered += 1
        log.info("flush_answered", why=why, reply=fut.result().decode("utf-8", "replace")[:100])

    def expire_held(self, now: float) -> None:
        self._apply(self.router.expire(now))

    def _warn_drop(self, event: str, call_id: int, reason: str, **kw: Any) -> None:
        # audio drops are rate-limited per reason, text drops per reason and call
        key = (event, reason) if event == "audio_dropped" else (event, reason, call_id)
        ok, suppressed = self.warn_limit.allow(key, time.monotonic())
        if ok:
            with bound_contextvars(call_id=call_id):
                log.warning(event, reason=reason, suppressed=suppressed, **kw)
