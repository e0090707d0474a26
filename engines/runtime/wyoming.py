"""The engine's Wyoming TTS server (``--wyoming-uri tcp://127.0.0.1:10200``), on the
``wyoming`` package.

Rule 1: one ``WyomingSession`` per connection (a ``wyoming.server.AsyncEventHandler``)
answers ``describe`` with ``info`` (voices, languages,
``supports_synthesize_streaming``), ``synthesize`` (one shot), and the streaming
``synthesize-start`` / ``synthesize-chunk`` / ``synthesize-stop`` (ending with
``synthesize-stopped``); audio goes out as ``audio-start`` / ``audio-chunk`` /
``audio-stop`` in 16-bit mono PCM at 24 kHz. Each synthesis is a protocol request
(``engines.runtime.requests``): a call of its own in the runtime. Bad input and
refusals are ``error`` events with a reason (``code``); the connection stays open.
Unknown event types are ignored (forward compatibility: Home Assistant adds events).
Rule 2: the events and their JSON are the ``wyoming`` package's; only the reading is
ours (``read_event``), because ``wyoming.event.async_read_event`` puts no bound on the
announced ``data_length``/``payload_length`` (STYLE.md 5) and no timeout on an idle
peer. A closed connection cancels that session's request at once (a barge-in), since
the session keeps reading while its audio is written by a second task.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import structlog
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Attribution, Describe, Info, TtsProgram, TtsVoice
from wyoming.ping import Ping, Pong
from wyoming.server import AsyncEventHandler, AsyncServer
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeStopped,
)

from engines.runtime.admission import Refusal
from engines.runtime.requests import ProtocolRequest, ProtocolRequests, SentenceBuffer
from engines.runtime.synth import SAMPLE_RATE, Synthesizer
from engines.runtime.threads import in_thread

log = structlog.get_logger(__name__)

MAX_HEADER_LINE = 64 * 1024  # bytes of the JSON header line (asyncio StreamReader default)
MAX_DATA = 64 * 1024  # bytes of an event's extra JSON data
MAX_PAYLOAD = 1 << 20  # bytes of a payload (a TTS server expects none; bounded anyway)
IDLE_TIMEOUT = 60.0  # s without an event while no synthesis runs: the connection closes
CHUNK_SAMPLES = 4800  # samples per audio-chunk (200 ms, like the dock's packets)
LANGUAGES = ["en", "de"]  # the text front end's languages (engines.text.lang)
ATTRIBUTION = Attribution(name="ttsdock", url="https://github.com/whispertalk/ttsdock")


class BadEvent(Exception):
    """A frame that breaks the bounds or is not an event: the connection is closed."""


async def read_event(reader: asyncio.StreamReader) -> Event | None:
    """One Wyoming event, bounded (``MAX_*``); ``None`` at EOF; ``BadEvent`` otherwise."""
    try:
        line = await reader.readline()  # limit: MAX_HEADER_LINE (ValueError beyond)
    except ValueError as exc:
        raise BadEvent(f"header line over {MAX_HEADER_LINE} bytes") from exc
    if not line:
        return None
    try:
        head = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadEvent(f"header is not JSON: {exc}") from exc
    if not isinstance(head, dict) or not isinstance(head.get("type"), str):
        raise BadEvent("header has no event type")
    data = head.get("data") or {}
    if not isinstance(data, dict):
        raise BadEvent("data is not an object")
    data_length = _length(head, "data_length", MAX_DATA)
    payload_length = _length(head, "payload_length", MAX_PAYLOAD)
    try:
        if data_length:
            extra = json.loads(await reader.readexactly(data_length))
            if not isinstance(extra, dict):
                raise BadEvent("data is not an object")
            data.update(extra)
        payload = await reader.readexactly(payload_length) if payload_length else None
    except asyncio.IncompleteReadError:
        return None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadEvent(f"data is not JSON: {exc}") from exc
    return Event(type=head["type"], data=data, payload=payload)


def _length(head: dict[str, Any], key: str, limit: int) -> int:
    n = head.get(key) or 0
    if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= limit:
        raise BadEvent(f"{key} {n!r} outside 0..{limit}")
    return n


class WyomingSession(AsyncEventHandler):
    """One connection: reads events until EOF, runs at most one synthesis at a time."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        server: WyomingServer,
    ) -> None:
        super().__init__(reader, writer)
        self.server = server
        self.request: ProtocolRequest | None = None
        self.speaker: asyncio.Task[None] | None = None
        self.streaming = False
        self.buffer = SentenceBuffer()
        self.chars = 0

    # -- reading ---------------------------------------------------------------------

    async def run(self) -> None:
        try:
            while True:
                busy = self.speaker is not None and not self.speaker.done()
                try:
                    async with asyncio.timeout(None if busy else self.server.idle_timeout):
                        event = await read_event(self.reader)
                except TimeoutError:
                    log.info("wyoming_idle_closed", idle_s=self.server.idle_timeout)
                    break
                except BadEvent as exc:
                    log.info("wyoming_bad_event", error=str(exc))
                    await self._error(str(exc), "bad_event")
                    break
                if event is None or not await self.handle_event(event):
                    break
        except (ConnectionError, OSError):
            pass
        finally:
            await self.disconnect()
            self.writer.close()

    async def disconnect(self) -> None:
        """The client is gone: its synthesis stops at once (a barge-in)."""
        if self.request is not None:
            self.request.cancel("client_disconnected")
        if self.speaker is not None:
            self.speaker.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.speaker

    # -- events ----------------------------------------------------------------------

    async def handle_event(self, event: Event) -> bool:
        if Describe.is_type(event.type):
            await self.write_event((await self.server.info()).event())
        elif Ping.is_type(event.type):
            await self.write_event(Pong(text=Ping.from_event(event).text).event())
        elif Synthesize.is_type(event.type):
            if self.streaming:  # sent inside a stream for backwards compatibility: ignore
                return True
            try:
                syn = Synthesize.from_event(event)
            except (KeyError, TypeError, AttributeError):
                await self._error("synthesize needs 'text'", "bad_request")
                return True
            voice = syn.voice.name if syn.voice is not None else None
            text = syn.text if isinstance(syn.text, str) else ""
            if len(text) > self.server.requests.max_input:  # refused before any audio-start
                self.server.requests.stats.rejected["text"] += 1
                await self._error(self._too_long(), "text_too_long")
            elif await self._start(voice, stream=False):
                await self._say(text, final=True)
        elif SynthesizeStart.is_type(event.type):
            try:
                start = SynthesizeStart.from_event(event)
            except (KeyError, TypeError, AttributeError):
                await self._error("bad synthesize-start", "bad_request")
                return True
            voice = start.voice.name if start.voice is not None else None
            await self._start(voice, stream=True)
        elif SynthesizeChunk.is_type(event.type):
            if self.streaming and self.request is not None:
                piece = event.data.get("text")
                if isinstance(piece, str):
                    await self._say(piece, final=False)
        elif SynthesizeStop.is_type(event.type):
            if self.streaming and self.request is not None:
                await self._say("", final=True)
        else:
            log.debug("wyoming_event_ignored", type=event.type[:64])
        return True

    async def _start(self, voice: str | None, *, stream: bool) -> bool:
        srv = self.server
        if self.speaker is not None and not self.speaker.done():
            await self._error("a synthesis is already running on this connection", "busy")
            return False
        if voice is not None:
            names = await in_thread(srv.synth.voices)
            if voice not in names:
                srv.requests.stats.rejected["voice"] += 1
                await self._error(
                    f"unknown voice {voice[:64]!r}; voices: {', '.join(names)}", "bad_voice"
                )
                return False
        req = srv.requests.start("wyoming", voice, None)
        if isinstance(req, Refusal):
            await self._error(f"{req.message} (retry after {req.retry_after_s} s)", req.reason)
            return False
        self.request = req
        self.streaming = stream
        self.buffer = SentenceBuffer()
        self.chars = 0
        self.speaker = asyncio.get_running_loop().create_task(
            self._speak(req, stream), name=f"wyoming-{req.call_id}"
        )
        return True

    async def _say(self, text: str, *, final: bool) -> None:
        req = self.request
        if req is None:
            return
        self.chars += len(text)
        if self.chars > self.server.requests.max_input:
            self.server.requests.stats.rejected["text"] += 1
            await self._error(self._too_long(), "text_too_long")
            req.cancel("text_too_long")
            return
        sentences = self.buffer.feed(text) if self.streaming else [text]
        if final and self.streaming:
            sentences += self.buffer.flush()
        for s in sentences:
            if s.strip() and not req.say(s):
                req.cancel("not_queued")
                return
        if final:
            req.finish()

    # -- writing ---------------------------------------------------------------------

    async def _speak(self, req: ProtocolRequest, stream: bool) -> None:
        """The request's audio as audio-start / audio-chunk... / audio-stop
        (+ synthesize-stopped for a stream)."""
        fmt: dict[str, int] = {"rate": SAMPLE_RATE, "width": 2, "channels": 1}
        step = CHUNK_SAMPLES * 2
        try:
            await self.write_event(AudioStart(**fmt).event())
            while (pcm := await req.audio.next_pcm16()) is not None:
                for i in range(0, len(pcm), step):
                    await self.write_event(AudioChunk(audio=pcm[i : i + step], **fmt).event())
            if req.cancelled:
                return
            await self.write_event(AudioStop().event())
            if stream:
                await self.write_event(SynthesizeStopped().event())
        except (ConnectionError, OSError):
            req.cancel("client_disconnected")
        finally:
            req.close()
            if self.request is req:
                self.request = None
                self.streaming = False

    def _too_long(self) -> str:
        return f"text over the limit of {self.server.requests.max_input} characters"

    async def _error(self, text: str, code: str) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            await self.write_event(Error(text=text, code=code).event())


class WyomingServer:
    """The listener (``wyoming.server.AsyncServer.from_uri``: tcp:// or unix://) and its
    sessions; ``stop`` closes every session (their requests are cancelled)."""

    def __init__(
        self,
        uri: str,
        name: str,
        synth: Synthesizer,
        requests: ProtocolRequests,
        idle_timeout: float = IDLE_TIMEOUT,
    ) -> None:
        if not uri.startswith(("tcp://", "unix://")):
            raise ValueError(f"--wyoming-uri {uri!r}: only tcp:// and unix:// are served")
        self.uri = uri
        self.name = name
        self.synth = synth
        self.requests = requests
        self.idle_timeout = idle_timeout
        self.sessions: set[WyomingSession] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self._server: AsyncServer | None = None
        self._info: Info | None = None
        self.port: int | None = None

    def _session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> Any:
        # the reader is asyncio.start_server's, with its 64 KiB limit (= MAX_HEADER_LINE)
        return WyomingSession(reader, writer, self)

    async def start(self) -> None:
        server = AsyncServer.from_uri(self.uri)
        await server.start(self._session)
        self._server = server
        # getattr: the wyoming library's private attributes (no public API for the bound
        # port or the open sessions); absent in another version, then we do without
        inner = getattr(server, "_server", None)
        socks = getattr(inner, "sockets", None) or []
        if socks and self.uri.startswith("tcp://"):
            self.port = int(socks[0].getsockname()[1])
        log.info("wyoming_listening", uri=self.uri, port=self.port)

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        handlers = dict(getattr(server, "_handlers", {}))  # private: see ``start``
        with contextlib.suppress(Exception):
            await server.stop()
        if handlers:
            await asyncio.wait(list(handlers), timeout=1.0)

    async def info(self) -> Info:
        if self._info is None:
            names = await in_thread(self.synth.voices)
            voices = [
                TtsVoice(
                    name=v,
                    description=v,
                    attribution=ATTRIBUTION,
                    installed=True,
                    version=None,
                    languages=list(LANGUAGES),
                )
                for v in names
            ]
            self._info = Info(
                tts=[
                    TtsProgram(
                        name=self.name,
                        description=f"ttsdock {self.name} engine",
                        attribution=ATTRIBUTION,
                        installed=True,
                        version=None,
                        voices=voices,
                        supports_synthesize_streaming=True,
                    )
                ]
            )
        return self._info
