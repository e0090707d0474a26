"""The dock's HTTP listener (``--http-port``): ``GET /metrics`` and ``GET /health``.

Rule 1: two read-only routes over what the cmd port already reports: ``/metrics`` is
the cmd port's ``METRICS`` (the same families, ``svc.metrics``), ``/health`` a JSON
summary of the slot and the links. The listener itself (loopback default, token,
timeouts) is ``svc.http``'s; aiohttp is imported only when ``--http-port`` is given.
Rule 2: nothing here changes the dock's state.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from svc.http import HttpServer, HttpSettings, read_token
from svc.metrics import CONTENT_TYPE
from ttsdock.commands import CommandTable
from ttsdock.config import Config

if TYPE_CHECKING:
    from aiohttp import web


class DockHttp:
    def __init__(self, commands: CommandTable) -> None:
        self.commands = commands

    def server(self, cfg: Config) -> HttpServer:
        assert cfg.http_port is not None
        token = read_token(cfg.http_token_file) if cfg.http_token_file is not None else None
        settings = HttpSettings(host=cfg.http_host, port=cfg.http_port, token=token)
        return HttpServer(
            settings, [("GET", "/metrics", self.metrics), ("GET", "/health", self.health)]
        )

    async def metrics(self, request: web.Request) -> web.StreamResponse:
        from aiohttp import web

        c = self.commands
        text = c.pipeline.stats.prometheus(c.gauges())
        return web.Response(body=text.encode(), headers={"Content-Type": CONTENT_TYPE})

    async def health(self, request: web.Request) -> web.StreamResponse:
        from aiohttp import web

        p = self.commands.pipeline
        slot = p.router.slot
        return web.json_response(
            {
                "status": "ok",
                "slot": slot.state.value,
                "engine": slot.active_name,
                "generation": slot.generation,
                "oap_connected": p.oap_mgmt is not None and p.oap_data is not None,
                "llama_connected": "llama_data" in p.llama,
                "uptime_s": round(time.monotonic() - self.commands.started_at, 1),
            }
        )
