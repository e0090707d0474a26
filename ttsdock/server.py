"""``ttsdock serve``: the dock daemon (DESIGN.md "ttsdock/").

One ``Dock`` object is the lifecycle owner (in the manner of aiohttp's runner): it is given
bound listening sockets, starts every server and task, and on shutdown closes listeners and
connections and cancels and awaits every task it started (``Supervisor``).

A long-lived task (OAP connectors, keepalive, hold sweeper, systemd watchdog) that dies is
fatal, by choice over an in-process restart: its state at the failure is unknown (a
keepalive that died mid-tick, a connector that no longer reconnects), a dock quietly
running without OAP or keepalive is worse than a short outage, and the engines and LLaMA
reconnect on their own (every 200 ms, WIRE.md 2). The dock logs ``task_failed``, stops
in order and ``serve`` returns exit status 1, so that systemd's ``Restart=on-failure``
starts a fresh dock. Short-lived helper tasks (a FLUSH_TTS reply wait) are only logged.

The per-frame work lives in the thin protocol shells of ``channels`` and ``engine_conn``;
decisions live in the sans-I/O cores ``slot``, ``calls`` and ``hold``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import signal
import socket
import struct
import sys
import time
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from structlog.contextvars import bound_contextvars

from protocol.audio import check_audio_payload
from protocol.cmd import MAX_DOCK_COMMAND
from protocol.engine_frames import encode_engine_frame
from protocol.errors import ProtocolError
from protocol.framing import LENGTH
from protocol.mgmt import FLUSH_TTS, SHUTDOWN, CallEnd, CallMessage, SpeechActive
from protocol.packet import PACKET_HEADER, Packet
from svc.logs import configure_logging
from svc.net import is_loopback, start_cmd_server
from svc.systemd import sd_notify, watchdog_loop
from ttsdock.calls import Action, CallEvent, CallTracker
from ttsdock.channels import FramedChannel, LlamaData, LlamaMgmt, OapData, OapMgmt
from ttsdock.commands import CommandTable
from ttsdock.config import Config, parse_args
from ttsdock.engine_conn import ENGINE_BUFFER_BYTES, PING_FRAME, EngineConn, mgmt_frame
from ttsdock.hold import Discard, HoldBuffer
from ttsdock.ratelimit import RateLimit
from ttsdock.slot import Slot
from ttsdock.stats import Stats

log = structlog.get_logger(__name__)

CONNECT_RETRY = 0.2  # WIRE.md 2: a connecting side retries every 200 ms
CONNECT_TIMEOUT = 2.0  # WIRE.md 2: connect timeout 2 s
FLUSH_REPLY_TIMEOUT = 0.2  # FLUSH_TTS reply awaited at most 200 ms
PING_INTERVAL = 0.2  # WIRE.md 3: PING the active engine every 200 ms
PONG_TIMEOUT = 0.6  # WIRE.md 3: > 600 ms without a PONG clears the slot
KEEPALIVE_TICK = 0.05  # how often the PONG deadline is checked
STALL_SLACK = 0.1  # a keepalive tick later than this: the dock itself was stalled
HOLD_SWEEP = 0.1  # how often held text is checked against its deadline
_OAP_HDR = struct.Struct(">III")  # frame length, call_id, payload_size


class Supervisor:
    """Owns every task the dock starts; ``close`` cancels and awaits them all.

    A task spawned ``critical`` must run until ``close``: if it raises, ``on_fatal`` is
    called with it (the dock stops with exit status 1). A failed non-critical task is
    only logged."""

    def __init__(self, on_fatal: Callable[[asyncio.Task[Any]], None] | None = None) -> None:
        self.tasks: set[asyncio.Task[Any]] = set()
        self.critical: set[asyncio.Task[Any]] = set()
        self.on_fatal = on_fatal

    def spawn(
        self, coro: Coroutine[Any, Any, Any], name: str, *, critical: bool = False
    ) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self.tasks.add(task)
        if critical:
            self.critical.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self.tasks.discard(task)
        critical = task in self.critical
        self.critical.discard(task)
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            log.error(
                "task_failed", task=task.get_name(), error=repr(exc), fatal=critical, exc_info=exc
            )
            if critical and self.on_fatal is not None:
                self.on_fatal(task)

    async def close(self) -> None:
        while self.tasks:
            tasks = list(self.tasks)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.tasks.difference_update(tasks)


@dataclass(slots=True)
class Listeners:
    """Bound listening sockets, passed to ``Dock.start`` (tests and socket activation)."""

    llama_mgmt: socket.socket
    llama_data: socket.socket
    dock: socket.socket

    @classmethod
    def bind(cls, cfg: Config) -> Listeners:
        return cls(
            _bind(cfg.llama_host, cfg.llama_mgmt_port),
            _bind(cfg.llama_host, cfg.llama_data_port),
            _bind(cfg.dock_host, cfg.dock_port),
        )

    def close(self) -> None:
        for s in (self.llama_mgmt, self.llama_data, self.dock):
            s.close()


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def _port(sock: socket.socket) -> int:
    return int(sock.getsockname()[1])


class Dock:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.cipher = cfg.cipher()
        self.loop = asyncio.get_running_loop()
        self.stats = Stats()
        self.tracker = CallTracker(ended_memory=cfg.ended_calls)
        self.hold = HoldBuffer(
            cfg.hold_packets, cfg.hold_bytes, cfg.hold_seconds, cfg.hold_calls, cfg.hold_total_bytes
        )
        self.slot: Slot[EngineConn] = Slot()
        self.engine: EngineConn | None = None  # the active engine (mirror of slot.active)
        self.engine_conns: set[EngineConn] = set()
        self.channels: set[FramedChannel] = set()
        self.llama: dict[str, FramedChannel] = {}
        self.oap_mgmt: OapMgmt | None = None
        self.oap_data: OapData | None = None
        self.oap_pending: deque[tuple[float, bytes]] = deque()  # audio while OAP data is down
        self.oap_pending_bytes = 0
        self._batch: list[bytes] = []  # header/body pairs of chunks of the current engine read
        self._batch_size = 0
        self.supervisor = Supervisor(on_fatal=self._task_died)
        self.exit_code = 0  # 1 once a critical task has died (``serve`` returns it)
        self.servers: list[asyncio.Server] = []
        self.ports: dict[str, int] = {}
        self.started_at = time.monotonic()
        self.warn_limit = RateLimit(1.0)
        self.stopping = asyncio.Event()
        self.commands = CommandTable(self)
        self.closing = False
        self.last_switch_us = 0.0
        self.max_switch_us = 0.0

    # ---------------------------------------------------------------- lifecycle
    async def start(self, listeners: Listeners) -> dict[str, int]:
        loop = self.loop
        specs: list[tuple[str, socket.socket, Any]] = [
            ("llama_mgmt", listeners.llama_mgmt, lambda: LlamaMgmt(self, self.cipher)),
            ("llama_data", listeners.llama_data, lambda: LlamaData(self, self.cipher)),
            ("dock", listeners.dock, lambda: EngineConn(self)),
        ]
        for name, sock, factory in specs:
            self.servers.append(await loop.create_server(factory, sock=sock))
            self.ports[name] = _port(sock)
        cmd = await start_cmd_server(
            self.cfg.cmd_host, self.cfg.cmd_port, self.commands.handle, max_len=MAX_DOCK_COMMAND
        )
        assert cmd is not None
        self.servers.append(cmd)
        self.ports["cmd"] = int(cmd.sockets[0].getsockname()[1])
        for name, host in (
            ("llama", self.cfg.llama_host),
            ("dock", self.cfg.dock_host),
            ("cmd", self.cfg.cmd_host),
        ):
            if not is_loopback(host):
                log.warning("listener_not_loopback", listener=name, host=host)
        sup = self.supervisor
        oap_mgmt = self._oap_connector("oap_mgmt", self.cfg.oap_mgmt_port)
        sup.spawn(oap_mgmt, "oap_mgmt", critical=True)
        oap_data = self._oap_connector("oap_data", self.cfg.oap_data_port)
        sup.spawn(oap_data, "oap_data", critical=True)
        sup.spawn(self._keepalive(), "keepalive", critical=True)
        sup.spawn(self._hold_sweeper(), "hold_sweeper", critical=True)
        sup.spawn(watchdog_loop(), "watchdog", critical=True)
        log.info(
            "dock_started",
            pid=os.getpid(),
            encryption=self.cipher is not None,
            oap=f"{self.cfg.oap_host}:{self.cfg.oap_mgmt_port}/{self.cfg.oap_data_port}",
            **{f"{k}_port": v for k, v in self.ports.items()},
        )
        return dict(self.ports)

    def _task_died(self, task: asyncio.Task[Any]) -> None:
        """A critical task raised: stop the dock, exit status 1 (see the module docstring)."""
        if self.closing:
            return
        self.exit_code = 1
        log.error("dock_task_died", task=task.get_name(), action="stopping, exit status 1")
        self.stopping.set()

    async def stop(self) -> None:
        log.info("dock_stopping")
        self.closing = True
        for server in self.servers:
            server.close()
        for conn in list(self.engine_conns):
            conn.abort("dock_stopping")
        for ch in list(self.channels):
            ch.abort()
        await self.supervisor.close()
        for server in self.servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 1.0)
        log.info("dock_stopped")

    # ---------------------------------------------------------------- OAP side
    async def _oap_connector(self, role: str, port: int) -> None:
        """Connect to OAP, and again after every loss (WIRE.md 2)."""
        host = self.cfg.oap_host
        factory = OapMgmt if role == "oap_mgmt" else OapData
        failures = 0
        connected_before = False
        while True:
            try:
                async with asyncio.timeout(CONNECT_TIMEOUT):
                    _, proto = await self.loop.create_connection(
                        lambda: factory(self, self.cipher), host, port
                    )
            except (OSError, TimeoutError) as exc:
                if failures == 0:
                    log.info("oap_connect_failed", channel=role, port=port, error=str(exc))
                failures += 1
                await asyncio.sleep(CONNECT_RETRY)
                continue
            if connected_before:
                self.stats.oap_reconnects += 1
            connected_before = True
            log.info("oap_connected", channel=role, port=port, attempts=failures + 1)
            failures = 0
            await asyncio.shield(proto.closed)
            log.warning("oap_disconnected", channel=role, port=port)
            await asyncio.sleep(CONNECT_RETRY)

    def channel_opened(self, ch: FramedChannel) -> None:
        self.channels.add(ch)
        if isinstance(ch, OapMgmt):
            self.oap_mgmt = ch
        elif isinstance(ch, OapData):
            self.oap_data = ch
            self._flush_pending(ch)
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
        elif self.llama.get(ch.role) is ch:
            del self.llama[ch.role]
            log.info("llama_disconnected", channel=ch.role, peer=ch.peer)

    def _flush_pending(self, ch: OapData) -> None:
        """OAP data is back: send what was queued while it was down, unless stale."""
        limit = time.monotonic() - self.cfg.oap_queue_seconds
        t = ch.transport
        while self.oap_pending:
            ts, frame = self.oap_pending.popleft()
            self.oap_pending_bytes -= len(frame)
            if ts < limit or t is None:
                self.stats.drops["oap_queue_stale"] += 1
                continue
            t.write(frame)
            self.stats.audio_frames_out += 1
            self.stats.audio_bytes_out += len(frame) - 12

    def forward_audio(self, pkt: Packet) -> None:
        """The hop: one engine audio Packet to OAP data, as bytes (PCM never decoded)."""
        stats = self.stats
        payload = pkt.payload
        n = len(payload)
        stats.audio_frames_in += 1
        stats.audio_bytes_in += n
        try:
            t_out = check_audio_payload(payload).t_engine_out_us
        except ProtocolError as exc:
            stats.drops["bad_audio"] += 1
            self._warn_drop("audio_dropped", pkt.call_id, exc.reason, detail=exc.detail)
            return
        if self.cipher is None:
            parts = (_OAP_HDR.pack(n + 8, pkt.call_id, n), payload)
            size = n + 12
        else:
            sealed = self.cipher.seal(PACKET_HEADER.pack(pkt.call_id, n) + payload)
            parts = (LENGTH.pack(len(sealed)), sealed)
            size = len(sealed) + 4
        oap = self.oap_data
        t = oap.transport if oap is not None else None
        if t is not None:
            if t.get_write_buffer_size() + self._batch_size + size > self.cfg.oap_buffer_bytes:
                stats.drops["oap_backlog"] += 1
                self._warn_drop("audio_dropped", pkt.call_id, "oap_backlog")
                return
            hop = time.monotonic_ns() // 1000 - t_out
            # collected per engine read and written with one writev in flush_audio(): a burst
            # of chunks costs one syscall, a single chunk leaves at once all the same
            self._batch += parts
            self._batch_size += size
            stats.audio_frames_out += 1
            stats.audio_bytes_out += n
            if hop >= 0:
                stats.add_hop(hop)
            return
        if self.oap_pending_bytes + size > self.cfg.oap_buffer_bytes:
            stats.drops["oap_down"] += 1
            self._warn_drop("audio_dropped", pkt.call_id, "oap_down")
            return
        self.oap_pending.append((time.monotonic(), b"".join(parts)))
        self.oap_pending_bytes += size

    def flush_audio(self) -> None:
        """Write the chunks collected from one engine read to OAP data (one writev)."""
        batch = self._batch
        if not batch:
            return
        self._batch = []
        self._batch_size = 0
        oap = self.oap_data
        t = oap.transport if oap is not None else None
        if t is not None and not t.is_closing():
            t.writelines(batch)
        else:  # OAP went away within this read: nothing else can have been written since
            self.stats.drops["oap_down"] += len(batch) // 2

    def flush_oap(self, why: str) -> None:
        """CUSTOM FLUSH_TTS to OAP; the reply is awaited in its own task (<= 200 ms)."""
        self.stats.flushes_sent += 1
        # audio queued while OAP was down belongs to the engine that is gone
        self.stats.drops["oap_queue_flushed"] += len(self.oap_pending)
        self.oap_pending.clear()
        self.oap_pending_bytes = 0
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

    # ---------------------------------------------------------------- upstream
    def on_text(self, pkt: Packet) -> None:
        stats = self.stats
        stats.text_frames_in += 1
        stats.text_bytes_in += len(pkt.payload)
        cid = pkt.call_id
        if self.tracker.apply(cid, CallEvent.TEXT) is Action.DROP:
            stats.drops["call_ended"] += 1
            self._warn_drop("text_dropped", cid, "call_ended")
            return
        eng = self.engine
        # an engine that is closing (aborted, connection_lost not yet run) would drop the
        # write silently: hold the text for the next engine as if none were docked
        if eng is not None and eng.writable():
            self._send_text(eng, pkt)
            return
        discard = self.hold.hold(cid, pkt.payload, time.monotonic())
        if discard is not None:
            self._count_discard(discard)
        else:
            stats.text_held += 1

    def _send_text(self, eng: EngineConn, pkt: Packet) -> None:
        if eng.buffered() > ENGINE_BUFFER_BYTES:
            self.stats.drops["engine_backlog"] += 1
            self._warn_drop("text_dropped", pkt.call_id, "engine_backlog")
            return
        if not eng.write(encode_engine_frame(pkt)):
            self.stats.drops["engine_closing"] += 1
            self._warn_drop("text_dropped", pkt.call_id, "engine_closing")
            return
        self.stats.text_frames_to_engine += 1
        self.stats.text_bytes_to_engine += len(pkt.payload)

    def on_call_message(self, msg: CallMessage) -> None:
        action = self.tracker.apply_message(msg)
        cid = msg.call_id
        if action is Action.FORWARD:
            if isinstance(msg, CallEnd):
                self.stats.calls_ended += 1
                discard = self.hold.discard(cid, "call_ended")
                if discard is not None:
                    self._count_discard(discard)
                with bound_contextvars(call_id=cid):
                    log.info("call_ended")
            elif isinstance(msg, SpeechActive):
                # barge-in: text still waiting for an engine would be spoken over the caller
                discard = self.hold.discard(cid, "barge_in")
                if discard is not None:
                    self._count_discard(discard)
            oap = self.oap_mgmt
            if oap is not None and oap.connected:
                oap.send_mgmt(msg)
                self.stats.mgmt_frames_to_oap += 1
            else:
                self.stats.drops["mgmt_oap_down"] += 1
                self._warn_drop("mgmt_dropped", cid, "oap_mgmt_down", type=type(msg).__name__)
            eng = self.engine
            if eng is not None and eng.write(mgmt_frame(msg)):
                self.stats.mgmt_frames_to_engine += 1
        elif action is Action.DROP:
            reason = "duplicate_call_end" if isinstance(msg, CallEnd) else "speech_after_end"
            self.stats.drops[reason] += 1

    def _count_discard(self, d: Discard) -> None:
        self.stats.drops[d.reason] += d.packets
        self._warn_drop("text_dropped", d.call_id, d.reason, packets=d.packets, bytes=d.nbytes)

    def _warn_drop(self, event: str, call_id: int, reason: str, **kw: Any) -> None:
        # audio drops are rate-limited per reason, text drops per reason and call
        key = (event, reason) if event == "audio_dropped" else (event, reason, call_id)
        ok, suppressed = self.warn_limit.allow(key, time.monotonic())
        if ok:
            with bound_contextvars(call_id=call_id):
                log.warning(event, reason=reason, suppressed=suppressed, **kw)

    async def _hold_sweeper(self) -> None:
        while True:
            await asyncio.sleep(HOLD_SWEEP)
            for d in self.hold.expire(time.monotonic()):
                self._count_discard(d)

    # ---------------------------------------------------------------- engines
    def engine_rejected(self, conn: EngineConn, reason: str, detail: str = "") -> None:
        self.stats.engines_rejected += 1
        self.stats.drops["engine_" + reason] += 1
        log.warning("engine_rejected", peer=conn.peer, reason=reason, detail=detail)

    def engine_docked(self, conn: EngineConn) -> int:
        """HELLO passed: switch the slot at once (last connect wins)."""
        t0 = time.perf_counter_ns()
        result = self.slot.dock(conn.name, conn, time.monotonic())
        self.engine = conn
        old = result.replaced
        if old is not None:
            old.handle.retire(SHUTDOWN)
        for cid, payload in self.hold.drain():  # held text, in order, to the newcomer
            self._send_text(conn, Packet(cid, payload))
            self.stats.text_delivered_from_hold += 1
        switch_us = (time.perf_counter_ns() - t0) / 1000
        self.last_switch_us = switch_us
        self.max_switch_us = max(self.max_switch_us, switch_us)
        self.stats.engines_docked += 1
        with bound_contextvars(engine=conn.name):
            if old is not None:
                self.stats.swaps += 1
                log.info(
                    "engine_swapped",
                    generation=result.generation,
                    old=old.name,
                    old_generation=old.generation,
                    switch_us=round(switch_us, 1),
                )
                self.flush_oap("swap")
            else:
                log.info("engine_docked", generation=result.generation, peer=conn.peer)
        return result.generation

    def engine_gone(self, conn: EngineConn, reason: str) -> None:
        was_active = self.slot.leave(conn.generation, time.monotonic(), reason)
        if self.closing:
            self.engine = None
            return
        with bound_contextvars(engine=conn.name):
            if was_active:
                self.engine = None
                log.warning("engine_left", generation=conn.generation, reason=reason)
                self.flush_oap(reason)
            else:
                log.info("engine_closed", generation=conn.generation, reason=reason)

    async def _keepalive(self) -> None:
        """PING the active engine every 200 ms; > 600 ms without PONG clears the slot.

        Only time during which the dock could have read a PONG counts as silence:
        when this task wakes more than ``STALL_SLACK`` late, the dock's own process
        was not running (host overloaded, VM paused), the engine's answers may be
        sitting unread in the socket, so the lateness is credited to the engine.
        And a deadline seen at one tick only clears the slot if it still holds at
        the next tick: the loop has polled its sockets in between (uvloop runs due
        timers before it reads), so a PONG that was already there counts.
        """
        next_ping = 0.0
        last_tick = self.loop.time()
        while True:
            await asyncio.sleep(KEEPALIVE_TICK)
            now = self.loop.time()
            late = now - last_tick - KEEPALIVE_TICK
            last_tick = now
            eng = self.engine
            if eng is None:
                continue
            if late > STALL_SLACK:
                eng.stall_credit += late
                log.info("keepalive_stalled", engine=eng.name, late_ms=int(late * 1000))
            silent = eng.silent_for(now)
            if silent > PONG_TIMEOUT:
                if eng.overdue:
                    self.stats.keepalive_timeouts += 1
                    log.warning(
                        "keepalive_timed_out",
                        engine=eng.name,
                        generation=eng.generation,
                        silent_ms=int(silent * 1000),
                    )
                    eng.abort("keepalive_timeout")
                    continue
                eng.overdue = True
            else:
                eng.overdue = False
            if now >= next_ping:
                eng.write(PING_FRAME)
                next_ping = now + PING_INTERVAL


async def serve(cfg: Config) -> int:
    try:
        listeners = Listeners.bind(cfg)
    except OSError as exc:
        log.error("bind_failed", error=str(exc))
        return 1
    try:
        dock = Dock(cfg)
    except ValueError as exc:
        listeners.close()
        log.error("config_invalid", error=str(exc))
        return 2
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(_loop_exception)
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, dock.stopping.set)
    try:
        ports = await dock.start(listeners)
    except OSError as exc:
        log.error("bind_failed", error=str(exc))
        await dock.stop()
        return 1
    if cfg.ready_file is not None:
        _write_ready(cfg.ready_file, ports)
    # start-up objects never become garbage: keep them out of every later GC pass, so that
    # collections stay short on the hot path
    gc.collect()
    gc.freeze()
    sd_notify("READY=1")
    try:
        await dock.stopping.wait()
    finally:
        sd_notify("STOPPING=1")
        await dock.stop()
        if cfg.ready_file is not None:
            with contextlib.suppress(OSError):
                cfg.ready_file.unlink()
    return dock.exit_code


def _loop_exception(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """A bug in a callback: log it as one structured ERROR line; the dock keeps serving."""
    exc = context.get("exception")
    log.error("callback_failed", message=context.get("message"), error=repr(exc), exc_info=exc)


def _write_ready(path: Path, ports: dict[str, int]) -> None:
    data = json.dumps({"pid": os.getpid(), **ports})
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(data + "\n")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    configure_logging("TTS", cfg.log_level, udp_log=cfg.udp_log)
    from svc.loop import run

    try:
        return run(serve(cfg))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
