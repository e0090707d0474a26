"""The engine's protocol listeners (HTTP ``--http-port``, Wyoming ``--wyoming-uri``).

Rule 1: one owner for both listeners and the ``ProtocolRequests`` they share:
``serve`` binds them (retrying every 200 ms while the port is held, as the cmd port
does during a hot swap) and ``stop`` cancels every open request and closes them.
Both are off unless a flag asks for them; aiohttp and wyoming are imported only then
(the optional ``http`` extra).
Rule 2: admission asks the engine-wide load meter (``CallManager.headroom_calls``),
then, where it does not know, the scheduler fallback (``admission.SchedulerHeadroom``);
a ``headroom`` passed in replaces both.
"""

from __future__ import annotations

import asyncio
import errno
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog

from engines.runtime.admission import (
    MIN_HEADROOM_CALLS,
    FirstKnown,
    Headroom,
    SchedulerHeadroom,
)
from engines.runtime.requests import MAX_INPUT_CHARS, MAX_REQUESTS, ProtocolRequests
from svc.http import HttpSettings

if TYPE_CHECKING:
    from engines.runtime.calls import CallManager
    from engines.runtime.cmdport import CommandHandler, DockState
    from engines.runtime.synth import Synthesizer

log = structlog.get_logger(__name__)

BIND_RETRY = 0.2  # s, like the cmd port (docs/wire.md#engine-cmd-port)


@dataclass(frozen=True, slots=True)
class ProtocolConfig:
    http: HttpSettings | None = None  # None: no HTTP listener
    wyoming_uri: str | None = None  # None: no Wyoming server
    max_requests: int = MAX_REQUESTS
    max_input: int = MAX_INPUT_CHARS
    min_headroom: float = MIN_HEADROOM_CALLS  # calls of predicted headroom a request needs


class ProtocolServers:
    def __init__(
        self,
        name: str,
        synth: Synthesizer,
        calls: CallManager,
        commands: CommandHandler,
        dock: DockState,
        config: ProtocolConfig,
        headroom: Headroom | None = None,
    ) -> None:
        self.config = config
        self.requests = ProtocolRequests(
            calls,
            headroom if headroom is not None else FirstKnown(calls, SchedulerHeadroom(calls)),
            max_requests=config.max_requests,
            max_input=config.max_input,
            min_headroom=config.min_headroom,
        )
        commands.metric_sources.append(self.requests.families)
        self.name = name
        self.synth = synth
        self.commands = commands
        self.dock = dock
        self.http: Any = None  # svc.http.HttpServer once bound
        self.wyoming: Any = None  # engines.runtime.wyoming.WyomingServer once bound

    @property
    def enabled(self) -> bool:
        return self.config.http is not None or self.config.wyoming_uri is not None

    async def serve(self, stop: asyncio.Event) -> None:
        """Bind the configured listeners (retrying while a port is held); returns once
        bound (or stopped)."""
        cfg = self.config
        if cfg.http is not None:
            from engines.runtime.http import EngineHttp

            routes = EngineHttp(self.name, self.synth, self.requests, self.commands, self.dock)
            server = routes.server(cfg.http)
            if await _bind_retrying(server.start, "http", stop):
                self.http = server
        if cfg.wyoming_uri is not None:
            from engines.runtime.wyoming import WyomingServer

            wy = WyomingServer(cfg.wyoming_uri, self.name, self.synth, self.requests)
            if await _bind_retrying(wy.start, "wyoming", stop):
                self.wyoming = wy

    async def stop(self) -> None:
        self.requests.cancel_all()
        for srv in (self.wyoming, self.http):
            if srv is not None:
                try:
                    await asyncio.wait_for(srv.close() if srv is self.http else srv.stop(), 1.5)
                except (TimeoutError, OSError) as exc:
                    log.warning("protocol_listener_close_slow", error=repr(exc))
        self.http = self.wyoming = None


async def _bind_retrying(start: Any, what: str, stop: asyncio.Event) -> bool:
    logged = False
    while not stop.is_set():
        try:
            await start()
            return True
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            if not logged:
                log.info("listener_busy", listener=what, error=exc.strerror)
                logged = True
            await asyncio.sleep(BIND_RETRY)
    return False
