"""``ttsdock serve``: the dock daemon.

One ``Dock`` object is the lifecycle owner (in the manner of aiohttp's runner): it is given
bound listening sockets, starts every server and task, and on shutdown closes listeners and
connections and cancels and awaits every task it started (``svc.tasks.Supervisor``).

A long-lived task (OAP connectors, keepalive, hold sweeper, systemd watchdog) that dies is
fatal, by choice over an in-process restart: its state at the failure is unknown (a
keepalive that died mid-tick, a connector that no longer reconnects), a dock quietly
running without OAP or keepalive is worse than a short outage, and the engines and LLaMA
reconnect on their own (every 200 ms, docs/wire.md#pipeline-channels). The dock logs
``task_failed``, stops in order and ``serve`` returns exit status 1, so that systemd's
``Restart=on-failure`` starts a fresh dock. Short-lived helper tasks (a FLUSH_TTS reply
wait) are only logged.

The per-frame work lives in the thin protocol shells of ``channels`` and ``engine_conn``;
decisions live in the sans-I/O cores ``router`` (with ``slot``, ``calls``, ``hold``) and
``hop``; ``pipeline`` feeds the cores and performs their actions.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from protocol.cmd import MAX_DOCK_COMMAND
from svc.keepalive import Ticks
from svc.logs import configure_logging
from svc.net import is_loopback, start_cmd_server
from svc.systemd import sd_notify, watchdog_loop
from svc.tasks import Supervisor
from ttsdock.channels import FramedChannel, LlamaData, LlamaMgmt, OapData, OapMgmt
from ttsdock.commands import CommandTable
from ttsdock.config import Config, parse_args
from ttsdock.engine_conn import PING_FRAME, EngineConn
from ttsdock.pipeline import Pipeline

log = structlog.get_logger(__name__)

CONNECT_RETRY = 0.2  # docs/wire.md#pipeline-channels: a connecting side retries every 200 ms
CONNECT_TIMEOUT = 2.0  # docs/wire.md#pipeline-channels: connect timeout 2 s
PING_INTERVAL = 0.2  # docs/wire.md#keepalive: PING the active engine every 200 ms
KEEPALIVE_TICK = 0.05  # how often the PONG deadline is checked
STALL_SLACK = 0.1  # a keepalive tick later than this: the dock itself was stalled
HOLD_SWEEP = 0.1  # how often held text is checked against its deadline


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
    """Lifecycle and wiring only: listeners, OAP connectors, keepalive, hold sweeper and
    watchdog tasks under one ``Supervisor``; every connection reports to the ``Pipeline``."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.cipher = cfg.cipher()
        self.loop = asyncio.get_running_loop()
        self.supervisor = Supervisor(on_fatal=self._task_died)
        self.pipeline = Pipeline(cfg, self.cipher, self.supervisor)
        self.stats = self.pipeline.stats
        self.exit_code = 0  # 1 once a critical task has died (``serve`` returns it)
        self.servers: list[asyncio.Server] = []
        self.ports: dict[str, int] = {}
        self.started_at = time.monotonic()
        self.stopping = asyncio.Event()
        self.commands = CommandTable(self.pipeline, self.started_at)
        self.closing = False
        self.http: Any = None  # svc.http.HttpServer with --http-port

    # ---------------------------------------------------------------- lifecycle
    async def start(self, listeners: Listeners) -> dict[str, int]:
        loop = self.loop
        p = self.pipeline
        specs: list[tuple[str, socket.socket, Any]] = [
            ("llama_mgmt", listeners.llama_mgmt, lambda: LlamaMgmt(p, self.cipher)),
            ("llama_data", listeners.llama_data, lambda: LlamaData(p, self.cipher)),
            ("dock", listeners.dock, lambda: EngineConn(p)),
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
        if self.cfg.http_port is not None:  # optional: GET /metrics, /health (http extra)
            from ttsdock.http import DockHttp

            self.http = DockHttp(self.commands).server(self.cfg)
            self.ports["http"] = await self.http.start()
        for name, host in (
            ("llama", self.cfg.llama_host),
            ("dock", self.cfg.dock_host),
            ("cmd", self.cfg.cmd_host),
        ):
            if not is_loopback(host):
                log.warning("listener_not_loopback", listener=name, host=host)
        cfg = self.cfg
        sup = self.supervisor
        sup.spawn(
            self._oap_connector("oap_mgmt", cfg.oap_mgmt_port, lambda: OapMgmt(p, self.cipher)),
            "oap_mgmt",
            critical=True,
        )
        sup.spawn(
            self._oap_connector(
                "oap_data",
                cfg.oap_data_port,
                lambda: OapData(p, self.cipher, cfg.oap_high_water, cfg.oap_low_water),
            ),
            "oap_data",
            critical=True,
        )
        sup.spawn(self._keepalive(), "keepalive", critical=True)
        sup.spawn(self._hold_sweeper(), "hold_sweeper", critical=True)
        sup.spawn(watchdog_loop(), "watchdog", critical=True)
        log.info(
            "dock_started",
            pid=os.getpid(),
            encryption=self.cipher is not None,
            oap=f"{cfg.oap_host}:{cfg.oap_mgmt_port}/{cfg.oap_data_port}",
            oap_high_water=cfg.oap_high_water,
            oap_low_water=cfg.oap_low_water,
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
        self.pipeline.closing = True
        for server in self.servers:
            server.close()
        if self.http is not None:
            await self.http.close()
        for conn in list(self.pipeline.engine_conns):
            conn.abort("dock_stopping")
        for ch in list(self.pipeline.channels):
            ch.abort()
        await self.supervisor.close()
        for server in self.servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 1.0)
        log.info("dock_stopped")

    # ---------------------------------------------------------------- OAP side
    async def _oap_connector(
        self, role: str, port: int, factory: Callable[[], FramedChannel]
    ) -> None:
        """Connect to OAP, and again after every loss (docs/wire.md#pipeline-channels)."""
        host = self.cfg.oap_host
        failures = 0
        connected_before = False
        while True:
            try:
                async with asyncio.timeout(CONNECT_TIMEOUT):
                    _, proto = await self.loop.create_connection(factory, host, port)
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

    async def _hold_sweeper(self) -> None:
        while True:
            await asyncio.sleep(HOLD_SWEEP)
            self.pipeline.expire_held(time.monotonic())

    # ---------------------------------------------------------------- engines
    async def _keepalive(self) -> None:
        """PING the active engine every 200 ms; > 600 ms without PONG clears the slot.

        What counts as silence is ``svc.keepalive``'s rule: not the time the dock's own
        loop was stalled (this task woke more than ``STALL_SLACK`` late), not the time the
        dock paused reading the engine (back-pressure), and a deadline must hold at two
        ticks in a row. PINGs go out while reading is paused (writing is not)."""
        next_ping = 0.0
        ticks = Ticks(self.loop.time(), KEEPALIVE_TICK, STALL_SLACK)
        while True:
            await asyncio.sleep(KEEPALIVE_TICK)
            now = self.loop.time()
            late = ticks.late(now)
            eng = self.pipeline.engine
            if eng is None:
                continue
            ka = eng.keepalive
            if late:
                ka.stalled(late)
                log.info("keepalive_stalled", engine=eng.name, late_ms=int(late * 1000))
            if ka.tick(now):
                self.stats.keepalive_timeouts += 1
                log.warning(
                    "keepalive_timed_out",
                    engine=eng.name,
                    generation=eng.generation,
                    silent_ms=int(ka.silent_for(now) * 1000),
                )
                eng.abort("keepalive_timeout")
                continue
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
    except ValueError as exc:  # svc.http.HttpConfigError: no token for a public address
        log.error("config_invalid", error=str(exc))
        print(f"ttsdock serve: {exc}", file=sys.stderr)
        await dock.stop()
        return 2
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
