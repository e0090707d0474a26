"""The engine process: one place that starts and stops everything (STYLE.md 2).

Rule 1: lifecycle only: load + warm up off-loop, then the dock client, the
cmd port, the idle-call sweeper and the systemd watchdog run side by side
until SHUTDOWN, SIGTERM or SIGINT; then an orderly stop within
``SHUTDOWN_BUDGET`` and exit 0. Every one of those tasks is watched: if one
raises (or the dock client returns before a stop was asked for), the engine
logs ``task_failed`` and stops with exit status 1, so that systemd's
``Restart=on-failure`` starts it afresh instead of an engine that no longer
docks but keeps serving its cmd port.
Rule 2: this file routes events (dock frames -> calls) but holds no protocol
or call logic itself.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from engines.runtime.calls import CallManager, EngineSettings
from engines.runtime.calltable import CALL_IDLE_S, MAX_CALLS
from engines.runtime.client import EngineClient
from engines.runtime.cmdport import CommandHandler, reload_lexicon_reply
from engines.runtime.protocols import ProtocolConfig, ProtocolServers
from engines.runtime.schedule import SYNTH_WORKERS
from engines.runtime.stats import RuntimeStats
from engines.runtime.synth import ExecutionPlan, Synthesizer
from engines.runtime.threads import in_thread, live_threads
from protocol.cmd import MAX_ENGINE_COMMAND
from protocol.engine_frames import EngineEvent
from protocol.mgmt import CallEnd, Custom, Pong, SpeechActive, SpeechIdle
from protocol.packet import Packet
from svc import loop as svc_loop
from svc.logs import configure_logging
from svc.net import is_loopback, start_cmd_server
from svc.systemd import sd_notify, watchdog_loop
from svc.tasks import Supervisor

log = structlog.get_logger(__name__)

# seconds from SHUTDOWN/SIGTERM to exit: inside the dock's 2 s grace before it force-closes
SHUTDOWN_BUDGET = 2.0
WORKERS_GRACE = 0.4  # of which: waiting for call workers to notice the cancel
THREADS_GRACE = 0.9  # of which (from the start): synthesis threads leaving the model
CLOSE_GRACE = 0.8  # of which: Synthesizer.close()
SWITCH_INTERVAL = 0.001  # GIL hand-off for CPU-bound Python synthesis threads (PONG latency)


@dataclass
class EngineConfig:
    name: str
    dock_host: str = "127.0.0.1"
    dock_port: int = 13143
    cmd_host: str = "127.0.0.1"
    cmd_port: int = 13144
    max_concurrent: int = 4
    out_dir: Path = field(default_factory=lambda: Path("."))
    log_level: str = "INFO"
    udp_log: tuple[str, int] | None = None
    speed: float = 1.0
    voice: str | None = None
    call_idle_s: float = CALL_IDLE_S  # a call without events this long is forgotten
    max_calls: int = MAX_CALLS  # live calls kept (least recently active idle one evicted)
    synth_workers: int = SYNTH_WORKERS  # inference pool threads (not self-scheduled engines)
    protocols: ProtocolConfig = field(default_factory=ProtocolConfig)  # HTTP, Wyoming: off

    def __post_init__(self) -> None:
        if self.synth_workers < 1:
            raise ValueError(f"synth_workers must be >= 1, got {self.synth_workers}")
        if self.max_concurrent < 1:
            raise ValueError(f"max_concurrent must be >= 1, got {self.max_concurrent}")
        if not self.call_idle_s > 0:
            raise ValueError(f"call_idle_s must be > 0, got {self.call_idle_s}")
        if self.max_calls < 1:
            raise ValueError(f"max_calls must be >= 1, got {self.max_calls}")
        if not 0 <= self.dock_port <= 65535 or not 0 <= self.cmd_port <= 65535:
            raise ValueError("ports must be in 0..65535")


class Engine:
    """Dock client + calls + cmd port around one ``Synthesizer``."""

    def __init__(self, synth: Synthesizer, config: EngineConfig) -> None:
        self.synth = synth
        self.config = config
        self.stats = RuntimeStats()
        self.settings = EngineSettings(voice=config.voice, speed=config.speed)
        self.client = EngineClient(
            config.name, config.dock_host, config.dock_port, self, self.stats
        )
        self.calls = CallManager(
            synth,
            self.client,
            self.stats,
            self.settings,
            config.max_concurrent,
            idle_s=config.call_idle_s,
            max_calls=config.max_calls,
            synth_workers=config.synth_workers,
        )
        self.commands = CommandHandler(
            synth, self.settings, self.calls, self.client, self.stats, config.out_dir
        )
        self.protocols = ProtocolServers(
            config.name, synth, self.calls, self.commands, self.client, config.protocols
        )
        self.stop = asyncio.Event()
        self.stop_reason = ""
        self.exit_code = 0  # 1 once a long-lived task has failed
        self.cmd_server: asyncio.Server | None = None
        self.cmd_port: int | None = None
        self.supervisor = Supervisor(on_fatal=self._task_failed)

    # -- LinkHandler -----------------------------------------------------------------------

    def on_docked(self) -> None:
        pass

    def on_undocked(self) -> None:
        self.calls.on_link_lost()

    def on_event(self, event: EngineEvent, t_rx_ns: int) -> None:
        if isinstance(event, Packet):
            self.calls.on_text(event.call_id, event.payload, t_rx_ns)
        elif isinstance(event, SpeechActive):
            self.calls.on_speech_active(event.call_id, t_rx_ns)
        elif isinstance(event, SpeechIdle):
            self.calls.on_speech_idle(event.call_id)
        elif isinstance(event, CallEnd):
            self.calls.on_call_end(event.call_id)
        elif isinstance(event, Custom):
            text = event.text
            if text == "SHUTDOWN":
                log.info("shutdown_requested", source="dock")
                self.request_stop("dock_shutdown")
            elif text == "FLUSH_TTS":
                log.debug("custom_ignored", command=text)
            else:
                log.info("custom_ignored", command=text[:64])
        elif isinstance(event, Pong):
            pass

    def request_stop(self, reason: str) -> None:
        if not self.stop.is_set():
            self.stop_reason = reason
            self.calls.stop_intake()  # stop taking work at once
            self.supervisor.begin_close()
            self.stop.set()

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        c = self.config
        if not is_loopback(c.cmd_host):
            log.warning("cmd_port_not_loopback", host=c.cmd_host)
        sup = self.supervisor
        # The cmd port is bound before the engine docks, so that it answers as soon as
        # the dock lists the engine; a port still held (the old engine of a hot swap) is
        # retried in the background.
        try:
            server = await start_cmd_server(
                c.cmd_host, c.cmd_port, self.commands, max_len=MAX_ENGINE_COMMAND
            )
        except OSError:
            sup.spawn(self._serve_cmd(), "cmd-port", critical=True)
        else:
            if server is not None:  # (without retry_bind it never is None)
                self._cmd_bound(server)
        # the dock client returns only once a stop was asked for: earlier is fatal
        sup.spawn(self.client.run(self.stop), "dock-client", must_run=True)
        sup.spawn(self.calls.sweep_forever(), "call-sweeper", critical=True)
        if self.protocols.enabled:  # HTTP / Wyoming listeners (bound with retry, like 13144)
            sup.spawn(self.protocols.serve(self.stop), "protocol-listeners", critical=True)
        sup.spawn(watchdog_loop(), "watchdog", critical=True)

    def _task_failed(self, task: asyncio.Task[None]) -> None:
        """A long-lived task raised, or the dock client gave up before a stop was asked
        for (``svc.tasks``): exit status 1. Anything else (cancelled at shutdown, the cmd
        port bound, no systemd watchdog configured) is a normal end."""
        self.exit_code = 1
        self.request_stop(f"task_failed:{task.get_name()}")

    async def _serve_cmd(self) -> None:
        c = self.config
        server = await start_cmd_server(
            c.cmd_host,
            c.cmd_port,
            self.commands,
            max_len=MAX_ENGINE_COMMAND,
            retry_bind=True,
            stop=self.stop,
        )
        if server is not None:
            self._cmd_bound(server)

    def _cmd_bound(self, server: asyncio.Server) -> None:
        self.cmd_server = server
        sock = server.sockets[0] if server.sockets else None
        self.cmd_port = sock.getsockname()[1] if sock is not None else self.config.cmd_port
        log.info("cmd_port_listening", host=self.config.cmd_host, port=self.cmd_port)

    async def run(self) -> None:
        await self.start()
        await self.stop.wait()
        await self.shutdown()

    async def shutdown(self) -> None:
        t0 = time.monotonic()
        sd_notify("STOPPING=1")
        log.info("engine_stopping", reason=self.stop_reason)
        self.supervisor.begin_close()
        self.stop.set()
        await self.protocols.stop()
        await self.calls.close(WORKERS_GRACE)
        if self.cmd_server is not None:
            self.cmd_server.close()
        try:  # the dock client closes its link on its own (flushing it); the rest is cancelled
            await asyncio.wait_for(
                self.supervisor.close(keep=lambda t: t.get_name() == "dock-client"), 0.3
            )
        except TimeoutError:
            await self.supervisor.close()
        # Release the model only once no thread is inside it any more: freeing a session
        # under a running inference could crash the process instead of exiting 0.
        deadline = t0 + THREADS_GRACE
        # thread liveness has no awaitable: poll
        while (self.calls.live_threads() or live_threads()) and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        busy = self.calls.live_threads() + live_threads()
        if busy:
            log.warning(
                "model_close_skipped", reason="synthesis threads still running", threads=busy
            )
        else:
            try:
                await asyncio.wait_for(in_thread(self.synth.close), CLOSE_GRACE)
            except TimeoutError:
                log.warning("model_close_slow", waited_s=CLOSE_GRACE)
            except Exception as exc:
                log.error("model_close_failed", error=f"{type(exc).__name__}: {exc}")
        log.info(
            "engine_stopped",
            reason=self.stop_reason,
            took_ms=round((time.monotonic() - t0) * 1000, 1),
        )


async def _amain(synth: Synthesizer, config: EngineConfig) -> int:
    loop = asyncio.get_running_loop()
    structlog.contextvars.bind_contextvars(engine=config.name)
    early_stop = asyncio.Event()

    def on_signal(signame: str) -> None:
        log.info("signal_received", signal=signame)
        early_stop.set()
        if engine is not None:
            engine.request_stop(signame.lower())

    engine: Engine | None = None
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, on_signal, sig.name)
        except (NotImplementedError, RuntimeError):
            pass
    reloads: set[asyncio.Task[None]] = set()

    def on_hup() -> None:  # SIGHUP: reload the pronunciation lexicon (engines.text)
        log.info("signal_received", signal="SIGHUP")
        task = asyncio.ensure_future(_reload_lexicon(synth))
        reloads.add(task)
        task.add_done_callback(reloads.discard)

    if hasattr(signal, "SIGHUP"):  # the platform's: Windows has none
        try:
            loop.add_signal_handler(signal.SIGHUP, on_hup)
        except (NotImplementedError, RuntimeError):
            pass

    t0 = time.monotonic()
    log.info("model_loading", engine=config.name)
    load = asyncio.ensure_future(in_thread(_load_and_warm, synth))
    stop_wait = asyncio.ensure_future(early_stop.wait())
    await asyncio.wait({load, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
    stop_wait.cancel()
    if not load.done():
        log.info("engine_stopped", reason="signal during model load")
        return 0
    exc = load.exception()
    if exc is not None:
        log.error("model_load_failed", error=f"{type(exc).__name__}: {exc}")
        print(f"ttsdock {config.name}: cannot load the model: {exc}", file=sys.stderr)
        return 1
    plan = synth.plan() if isinstance(synth, ExecutionPlan) else None
    log.info(
        "model_ready",
        load_s=round(time.monotonic() - t0, 3),
        plan=None if plan is None else plan.name,
        plan_source=None if plan is None else plan.source,
        rtf=None if plan is None else {n: round(r, 3) for n, r in plan.rtf.items()},
        capacity_audio_s_per_s=None if plan is None else round(plan.capacity, 2),
    )

    engine = Engine(synth, config)
    if early_stop.is_set():
        return 0
    sd_notify("READY=1")
    await engine.run()
    return engine.exit_code


async def _reload_lexicon(synth: Synthesizer) -> None:
    """SIGHUP: the same reload as cmd ``RELOAD_LEXICON``; the outcome goes to the log."""
    try:
        reply = await reload_lexicon_reply(synth)
    except Exception as exc:  # e.g. the model is still loading
        log.warning("lexicon_reload_failed", error=f"{type(exc).__name__}: {exc}")
        return
    if reply.startswith("OK"):
        log.info("lexicon_reloaded", reply=reply)
    else:
        log.warning("lexicon_reload_rejected", reply=reply[:512])


def _load_and_warm(synth: Synthesizer) -> None:
    synth.load()
    synth.warm_up()


def serve_forever(synth: Synthesizer, config: EngineConfig) -> int:
    """Run the engine process to completion and return its exit status."""
    configure_logging(config.name, config.log_level, udp_log=config.udp_log)
    sys.setswitchinterval(SWITCH_INTERVAL)
    rc = svc_loop.run(_amain(synth, config))
    busy = [t for t in threading.enumerate() if t.daemon and t.is_alive()]
    if busy or live_threads():
        # A model call that ignores cancellation must not hold the exit hostage
        # (SHUTDOWN budget, docs/wire.md#engine-slot); daemon threads in native code are best not
        # finalised by the interpreter either.
        log.warning("threads_abandoned", count=len(busy), names=[t.name for t in busy][:8])
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    return rc
