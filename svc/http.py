"""The HTTP listener of the dock and the engines (``--http-port``), on aiohttp.

Rule 1: lifecycle, security and limits of the listener live here: one
``AppRunner`` + ``TCPSite`` inside the process's own (uv)loop, loopback by
default, a bearer token required for any other address (compared in constant
time), an idle timeout that also bounds how long a client may take to send its
request head (slowloris), a body size limit, and OpenAI-style JSON errors for
everything the router refuses (404, 405, 413, 401).
Rule 2: this file knows no route of ours; the dock and the engines pass theirs.

Why aiohttp: it is asyncio-native and runs in the loop we already have (uvloop),
with no second server thread; ``AppRunner``/``TCPSite`` separate the lifecycle from
the listener (one place starts and stops everything) and make port 0 in tests easy;
``StreamResponse`` gives streamed bodies with back-pressure (``await write`` waits for the
socket), and
``handler_cancellation`` turns a client disconnect into a cancelled handler, which
is our barge-in. uvicorn would need an ASGI framework on top (starlette) and hides
the transport behind ASGI messages. aiohttp is imported only when a listener is
asked for: it belongs to the optional ``http`` extra.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from svc.net import is_loopback

if TYPE_CHECKING:
    from aiohttp import web

log = structlog.get_logger(__name__)

IDLE_TIMEOUT = 15.0  # s: an idle keep-alive connection, or one still sending its request head
READ_TIMEOUT = 10.0  # s: a request body must arrive within this
MAX_BODY = 64 * 1024  # bytes of request body (the speech endpoint's JSON)
MAX_TOKEN = 4096  # bytes of a token file
SHUTDOWN_GRACE = 1.0  # s given to open requests when the process stops

Handler = Callable[["web.Request"], Awaitable["web.StreamResponse"]]


class HttpConfigError(ValueError):
    """A listener that must not start (non-loopback without a token, unreadable token)."""


@dataclass(frozen=True, slots=True)
class HttpSettings:
    host: str = "127.0.0.1"
    port: int = 0
    token: str | None = None
    idle_timeout: float = IDLE_TIMEOUT
    read_timeout: float = READ_TIMEOUT
    max_body: int = MAX_BODY

    def check(self) -> None:
        """Refuse to serve a non-loopback address without a token: anyone on the network
        could otherwise read the metrics or make the engine speak."""
        if not is_loopback(self.host) and not self.token:
            raise HttpConfigError(
                f"--http-host {self.host} is not a loopback address: --http-token-file is "
                "required (requests then need 'Authorization: Bearer <token>')"
            )


def read_token(path: Path) -> str:
    """The first line of ``path``, stripped; raises ``HttpConfigError`` naming the file."""
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_TOKEN + 1)
    except OSError as exc:
        raise HttpConfigError(f"cannot read --http-token-file {path}: {exc.strerror}") from None
    if len(raw) > MAX_TOKEN:
        raise HttpConfigError(f"--http-token-file {path} is longer than {MAX_TOKEN} bytes")
    token = raw.decode("utf-8", errors="strict").strip().splitlines()[0] if raw.strip() else ""
    if len(token) < 16:
        raise HttpConfigError(f"--http-token-file {path}: the token needs 16 characters or more")
    return token


def json_error(
    status: int,
    message: str,
    *,
    param: str | None = None,
    type_: str = "invalid_request_error",
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    """An OpenAI-style error body: ``{"error": {"message", "type", "param", "code"}}``."""
    from aiohttp import web

    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return web.json_response(body, status=status, headers=headers)


def token_ok(header: str | None, token: str) -> bool:
    """``Authorization: Bearer <token>``, compared in constant time."""
    if not header:
        return False
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode(), token.encode())


def _middlewares(settings: HttpSettings) -> list[Any]:
    from aiohttp import web

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        token = settings.token
        if token is not None and not token_ok(request.headers.get("Authorization"), token):
            return json_error(
                401,
                "missing or wrong bearer token",
                type_="authentication_error",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )
        try:
            return await handler(request)
        except web.HTTPException as exc:  # 404, 405, 413, ...: JSON like every other error
            if exc.status < 400:
                raise
            return json_error(exc.status, exc.reason, code=str(exc.status))

    return [guard]


class HttpServer:
    """One listener: ``start`` binds (port 0 picks one: ``port``), ``close`` stops it."""

    def __init__(self, settings: HttpSettings, routes: list[tuple[str, str, Handler]]) -> None:
        settings.check()
        self.settings = settings
        self.routes = routes
        self.port: int | None = None
        self._runner: web.AppRunner | None = None

    async def start(self) -> int:
        from aiohttp import web

        s = self.settings
        app = web.Application(client_max_size=s.max_body, middlewares=_middlewares(s))
        for method, path, handler in self.routes:
            app.router.add_route(method, path, handler)
        runner = web.AppRunner(
            app,
            handle_signals=False,  # the process owns its signals
            access_log=None,
            keepalive_timeout=s.idle_timeout,
            handler_cancellation=True,  # a disconnect cancels the handler: our barge-in
            shutdown_timeout=SHUTDOWN_GRACE,
        )
        await runner.setup()
        site = web.TCPSite(runner, s.host, s.port, reuse_address=True)
        try:
            await site.start()
        except OSError:
            await runner.cleanup()
            raise
        self._runner = runner
        server = getattr(site, "_server", None)
        socks = getattr(server, "sockets", None) or []
        self.port = int(socks[0].getsockname()[1]) if socks else s.port
        log.info("http_listening", host=s.host, port=self.port, auth=s.token is not None)
        return self.port

    async def close(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()


async def read_json(request: web.Request, read_timeout: float) -> tuple[Any, web.Response | None]:
    """The request body as JSON within ``read_timeout`` s: ``(value, None)`` or
    ``(None, error response)`` (400 over the size limit or bad JSON, 408 too slow)."""
    import asyncio

    from aiohttp import web

    try:
        async with asyncio.timeout(read_timeout):
            body = await request.read()
    except TimeoutError:
        return None, json_error(408, f"request body not received within {read_timeout:g} s")
    except web.HTTPRequestEntityTooLarge:
        limit = request.app._client_max_size
        return None, json_error(
            400, f"request body over {limit} bytes", param="body", code="body_too_large"
        )
    try:
        return json.loads(body), None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return None, json_error(400, f"malformed JSON body: {exc}", param="body")
