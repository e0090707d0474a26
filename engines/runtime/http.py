"""The engine's HTTP endpoints (``--http-port``): OpenAI speech, models, voices, health,
metrics.

Rule 1: request validation and the response formats live here: ``POST
/v1/audio/speech`` (OpenAI-compatible: ``model``, ``input``, ``voice``, ``speed``,
``response_format`` wav | pcm, 24 kHz 16-bit mono, and ``stream``), ``GET
/v1/models``, ``GET /v1/audio/voices``, ``GET /health``, ``GET /metrics``. Bad input
is a 400 with an OpenAI-style error naming the field; a refusal by admission is a
503 (no headroom) or 429 (too many requests) with ``Retry-After``.
Rule 2: a speech request is a call of its own (``engines.runtime.requests``); the
listener's lifecycle, token check and timeouts are ``svc.http``'s. A client that
disconnects cancels its handler (aiohttp ``handler_cancellation``): that is a
barge-in on its call, and its work leaves the scheduler at once.

``stream`` (default false): false answers once the audio is complete, with its
length (a WAV a player can seek); true sends the audio as it is made (chunked
transfer), a WAV header first whose sizes say "unknown" (0xFFFFFFFF), as streamed
WAV servers do.
"""

from __future__ import annotations

import asyncio
import math
import struct
import time
from typing import TYPE_CHECKING, Any

import structlog

from engines.runtime.admission import Refusal
from engines.runtime.requests import ProtocolRequest, ProtocolRequests
from engines.runtime.synth import (
    SAMPLE_RATE,
    SPEED_MAX,
    SPEED_MIN,
    ExecutionPlan,
    PlanInfo,
    Synthesizer,
)
from engines.runtime.threads import in_thread
from svc.http import HttpServer, HttpSettings, json_error, read_json
from svc.metrics import CONTENT_TYPE

if TYPE_CHECKING:
    from aiohttp import web

    from engines.runtime.cmdport import CommandHandler, DockState

log = structlog.get_logger(__name__)

FORMATS = {"wav": "audio/wav", "pcm": "audio/pcm"}
MODEL_ALIASES = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")  # what OpenAI clients send
WAV_UNKNOWN = 0xFFFFFFFF  # RIFF/data size of a streamed WAV


def wav_header(data_bytes: int | None, rate: int = SAMPLE_RATE) -> bytes:
    """44-byte header of a 16-bit mono PCM WAV; ``None``: length unknown (streamed)."""
    data = WAV_UNKNOWN if data_bytes is None else data_bytes
    riff = WAV_UNKNOWN if data_bytes is None else 36 + data_bytes
    return (
        b"RIFF"
        + struct.pack("<I", riff)
        + b"WAVEfmt "
        + struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16)
        + b"data"
        + struct.pack("<I", data)
    )


class SpeechParams:
    __slots__ = ("fmt", "input", "model", "speed", "stream", "voice")

    def __init__(
        self, model: str, text: str, voice: str, speed: float, fmt: str, stream: bool
    ) -> None:
        self.model = model
        self.input = text
        self.voice = voice
        self.speed = speed
        self.fmt = fmt
        self.stream = stream


class BadRequest(Exception):
    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param
        self.message = message


class EngineHttp:
    """The routes of one engine process; ``server()`` makes its ``svc.http`` listener."""

    def __init__(
        self,
        name: str,
        synth: Synthesizer,
        requests: ProtocolRequests,
        commands: CommandHandler,
        dock: DockState,
    ) -> None:
        self.name = name
        self.synth = synth
        self.requests = requests
        self.commands = commands
        self.dock = dock
        self.read_timeout = 10.0

    def server(self, settings: HttpSettings) -> HttpServer:
        self.read_timeout = settings.read_timeout
        return HttpServer(
            settings,
            [
                ("GET", "/metrics", self.metrics),
                ("GET", "/health", self.health),
                ("GET", "/v1/models", self.models),
                ("GET", "/v1/audio/voices", self.voices),
                ("POST", "/v1/audio/speech", self.speech),
            ],
        )

    # -- small GETs --------------------------------------------------------------------

    async def metrics(self, request: web.Request) -> web.StreamResponse:
        from aiohttp import web

        text = self.commands.metrics_text()
        return web.Response(body=text.encode(), headers={"Content-Type": CONTENT_TYPE})

    async def health(self, request: web.Request) -> web.StreamResponse:
        from aiohttp import web

        body: dict[str, Any] = {
            "status": "ok",
            "engine": self.name,
            "loaded": True,  # the listener starts only once the model is loaded and warm
            "docked": self.dock.docked,
            "calls_active": self.requests.calls.active_calls(),
            "protocol_requests_active": self.requests.admission.active,
        }
        plan = await self._plan()
        if plan is not None:
            body["plan"] = plan
        return web.json_response(body)

    async def _plan(self) -> object | None:
        """The synthesiser's execution plan (``ExecutionPlan``: name, source, RTF by thread
        count, capacity), or ``plan.*`` keys of its stats; ``None`` when it exposes none."""
        try:
            if isinstance(self.synth, ExecutionPlan):
                info = self.synth.plan()
                if isinstance(info, PlanInfo):
                    return {
                        "name": info.name,
                        "source": info.source,
                        "rtf": {str(n): r for n, r in sorted(info.rtf.items())},
                        "capacity_audio_s_per_s": info.capacity,
                    }
                return str(info)
            stats = await in_thread(self.synth.stats)
        except Exception as exc:
            log.warning("plan_unavailable", error=f"{type(exc).__name__}: {exc}")
            return None
        found = {k[5:]: v for k, v in stats.items() if k.startswith("plan.")}
        return found or None

    async def models(self, request: web.Request) -> web.StreamResponse:
        from aiohttp import web

        data = [
            {"id": m, "object": "model", "created": 0, "owned_by": "ttsdock"}
            for m in (self.name, *MODEL_ALIASES)
        ]
        return web.json_response({"object": "list", "data": data})

    async def voices(self, request: web.Request) -> web.StreamResponse:
        from aiohttp import web

        names = await in_thread(self.synth.voices)
        default = await in_thread(lambda: self.synth.default_voice)
        return web.json_response({"voices": names, "default": default})

    # -- POST /v1/audio/speech ---------------------------------------------------------

    async def _params(self, body: object) -> SpeechParams:
        if not isinstance(body, dict):
            raise BadRequest("body", "the body must be a JSON object")
        model = body.get("model", self.name)
        if not isinstance(model, str) or model not in (self.name, *MODEL_ALIASES):
            raise BadRequest(
                "model",
                f"unknown model {str(model)[:64]!r}: use {self.name!r} (or an OpenAI alias "
                f"{', '.join(MODEL_ALIASES)})",
            )
        text = body.get("input")
        if not isinstance(text, str) or not text.strip():
            raise BadRequest("input", "'input' must be a non-empty string")
        limit = self.requests.max_input
        if len(text) > limit:
            raise BadRequest("input", f"'input' has {len(text)} characters, the limit is {limit}")
        names = await in_thread(self.synth.voices)
        voice = body.get("voice")
        if voice is None:
            voice = await in_thread(lambda: self.synth.default_voice)
        if isinstance(voice, dict):  # newer OpenAI clients may send {"id": ...}
            voice = voice.get("id")
        if not isinstance(voice, str) or voice not in names:
            raise BadRequest(
                "voice", f"unknown voice {str(voice)[:64]!r}; voices: {', '.join(names)}"
            )
        speed = body.get("speed", 1.0)
        if (
            isinstance(speed, bool)
            or not isinstance(speed, int | float)
            or not math.isfinite(speed)
            or not SPEED_MIN <= speed <= SPEED_MAX
        ):
            raise BadRequest("speed", f"'speed' must be a number in {SPEED_MIN}..{SPEED_MAX}")
        fmt = body.get("response_format", "wav")
        if fmt not in FORMATS:
            raise BadRequest(
                "response_format",
                f"unsupported response_format {str(fmt)[:32]!r}; supported: " + ", ".join(FORMATS),
            )
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise BadRequest("stream", "'stream' must be true or false")
        stream_format = body.get("stream_format", "audio")
        if stream_format != "audio":
            raise BadRequest("stream_format", "only stream_format 'audio' is supported")
        return SpeechParams(model, text, voice, float(speed), str(fmt), stream)

    async def speech(self, request: web.Request) -> web.StreamResponse:
        body, error = await read_json(request, self.read_timeout)
        if error is not None:
            self.requests.stats.rejected["body"] += 1
            return error
        try:
            params = await self._params(body)
        except BadRequest as exc:
            self.requests.stats.rejected[exc.param] += 1
            log.info("request_rejected", protocol="http", param=exc.param)
            return json_error(400, exc.message, param=exc.param)
        req = self.requests.start("http", params.voice, params.speed)
        if isinstance(req, Refusal):
            return refusal_response(req)
        try:
            if not req.say(params.input):
                req.cancel("not_queued")
                return json_error(503, "the engine did not take the text", type_="server_error")
            req.finish()
            if params.stream:
                return await self._stream(request, req, params)
            return await self._whole(req, params)
        except (asyncio.CancelledError, ConnectionError):
            req.cancel("client_disconnected")  # a barge-in: its work stops at once
            raise
        finally:
            req.close()

    async def _whole(self, req: ProtocolRequest, params: SpeechParams) -> web.StreamResponse:
        from aiohttp import web

        parts: list[bytes] = []
        while (pcm := await req.audio.next_pcm16()) is not None:
            parts.append(pcm)
        data = b"".join(parts)
        if not data:
            return json_error(500, "synthesis produced no audio", type_="server_error")
        if params.fmt == "wav":
            data = wav_header(len(data)) + data
        return web.Response(body=data, headers={"Content-Type": FORMATS[params.fmt]})

    async def _stream(
        self, request: web.Request, req: ProtocolRequest, params: SpeechParams
    ) -> web.StreamResponse:
        from aiohttp import web

        resp = web.StreamResponse(headers={"Content-Type": FORMATS[params.fmt]})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        if params.fmt == "wav":
            await resp.write(wav_header(None))
        t0 = time.monotonic()
        while (pcm := await req.audio.next_pcm16()) is not None:
            # waits while the client's socket is full (back-pressure), but not for ever: a
            # client that stops reading loses its request and its connection
            try:
                async with asyncio.timeout(req.audio.write_timeout):
                    await resp.write(pcm)
            except TimeoutError:
                req.cancel("client_not_reading")
                if request.transport is not None:
                    request.transport.abort()
                return resp
        await resp.write_eof()
        log.debug("speech_streamed", call_id=req.call_id, took_s=round(time.monotonic() - t0, 3))
        return resp


def refusal_response(r: Refusal) -> web.Response:
    return json_error(
        r.status,
        r.message,
        type_="server_error" if r.status >= 500 else "rate_limit_error",
        code=r.reason,
        headers={"Retry-After": str(r.retry_after_s)},
    )
