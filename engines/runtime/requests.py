"""Protocol requests (OpenAI speech over HTTP, Wyoming): each one is a call of its own.

Rule 1: a request is a call in ``CallManager`` like a docked one: its text goes
through ``on_text`` (same front end, lexicon, voices, inference scheduler and
deadlines), a client that goes away is a barge-in (``on_speech_active``: its work
leaves the scheduler at once, counted in STATS ``bargeins`` and
``utterances_cancelled``), and the end is ``on_call_end``. The only difference is
where its audio goes: ``RequestAudio``, an ``AudioSink`` that the HTTP or Wyoming
handler reads, instead of the dock socket.
Rule 2: this file knows no HTTP and no Wyoming; ``engines.runtime.http`` and
``engines.runtime.wyoming`` adapt it.

Call ids. Docked calls carry a u32 call id on the wire (docs/wire.md#packet, ``Packet``), so
protocol requests number their calls from ``REQUEST_CALL_BASE = 2**32`` upwards:
no dock call can ever have one of these ids, and STATS/METRICS list them as
``call.4294967296`` and so on. They never leave the process.

Pacing. The scheduler treats a request like a phone call whose listener plays in
real time from its first packet: the request gets its audio as fast as a caller
would need it, plus up to ``MAX_AHEAD_S`` ahead, never ahead of phone calls whose
listeners run dry first. A slow client (it reads less than real time) makes its
own call wait in ``drain``; after ``WRITE_TIMEOUT`` it is dropped like a barge-in,
so it never holds synthesis capacity.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import time
from collections import Counter, deque
from dataclasses import dataclass, field

import numpy as np
import structlog

from engines.runtime.admission import MIN_HEADROOM_CALLS, Admission, Headroom, Refusal
from engines.runtime.calls import CallManager
from engines.runtime.metrics import window_summary
from engines.runtime.stats import LatencyWindow
from engines.runtime.synth import SAMPLE_RATE
from svc.metrics import Family, gauge, labelled

log = structlog.get_logger(__name__)

REQUEST_CALL_BASE = 1 << 32  # first protocol call id: above every u32 dock call id
HIGH_WATER = 256 * 1024  # bytes of float32 PCM queued for a client before its call waits
LOW_WATER = 64 * 1024
WRITE_TIMEOUT = 10.0  # s a client may not read before its request is dropped
MAX_INPUT_CHARS = 4096  # default --protocol-max-input
MAX_REQUESTS = 2  # default --protocol-max-requests
PIECE_CHARS = 400  # later sentences are packed into texts of about this many characters
MAX_PIECES = 64  # texts one request may queue (MAX_QUEUED_TEXTS is 256 per call)

_SENTENCE_END = re.compile(r"(?<=[.!?;:。！？])[\"')\]]*\s+|\n\s*\n")


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text`` (split after ``.!?;:`` + space, or at a blank line)."""
    return [s.strip() for s in _SENTENCE_END.split(text) if s and s.strip()]


def pieces(text: str, piece_chars: int = PIECE_CHARS) -> list[str]:
    """The texts one request queues: the first sentence alone (first audio leaves early),
    then the rest packed up to ``piece_chars`` characters at sentence boundaries, at most
    ``MAX_PIECES`` (the last one takes whatever is left). Linear in ``len(text)``."""
    sentences = split_sentences(text)
    if not sentences:
        return []
    out = [sentences[0]]
    cur: list[str] = []
    size = 0
    for s in sentences[1:]:
        if cur and size + len(s) > piece_chars and len(out) < MAX_PIECES - 1:
            out.append(" ".join(cur))
            cur, size = [], 0
        cur.append(s)
        size += len(s) + 1
    if cur:
        out.append(" ".join(cur))
    return out


class SentenceBuffer:
    """Text streamed in arbitrary pieces (Wyoming ``synthesize-chunk``: not on word or
    sentence boundaries) -> complete sentences. Bounded by the caller's input limit."""

    def __init__(self) -> None:
        self._buf = ""

    def feed(self, text: str) -> list[str]:
        """The sentences completed by ``text`` (a sentence end needs the space after it,
        so "Dr." at the end of a chunk waits for the next one)."""
        self._buf += text
        last = None
        for last in _SENTENCE_END.finditer(self._buf):  # noqa: B007 (the last match)
            pass
        if last is None:
            return []
        done, self._buf = self._buf[: last.end()], self._buf[last.end() :]
        return split_sentences(done)

    def flush(self) -> list[str]:
        rest, self._buf = self._buf.strip(), ""
        return [rest] if rest else []


class RequestAudio:
    """``AudioSink`` of one request: float32 packets in (from the call), 16-bit PCM out."""

    def __init__(self, write_timeout: float = WRITE_TIMEOUT) -> None:
        self._chunks: deque[bytes] = deque()
        self._bytes = 0
        self._wake = asyncio.Event()  # a chunk, the end, or a close
        self._drained = asyncio.Event()
        self._drained.set()
        self.closed = False  # the client is gone (or the request was cancelled)
        self.ended = False  # every utterance of the request has ended
        self.write_timeout = write_timeout
        self.first_audio_ns: int | None = None
        self.samples = 0

    # -- AudioSink (the call's side) ---------------------------------------------------

    def send_audio(self, call_id: int, pcm: bytes) -> bool:
        if self.closed:
            return False
        if self.first_audio_ns is None:
            self.first_audio_ns = time.monotonic_ns()
        self._chunks.append(pcm)
        self._bytes += len(pcm)
        self.samples += len(pcm) // 4
        if self._bytes >= HIGH_WATER:
            self._drained.clear()
        self._wake.set()
        return True

    @property
    def write_paused(self) -> bool:
        return self._bytes >= HIGH_WATER and not self.closed

    async def drain(self) -> None:
        try:
            async with asyncio.timeout(self.write_timeout):
                await self._drained.wait()
        except TimeoutError:
            log.warning("request_client_slow", waited_s=self.write_timeout)
            self.close()

    # -- the handler's side --------------------------------------------------------------

    async def next_pcm16(self) -> bytes | None:
        """The next audio as 16-bit little-endian PCM; ``None`` once the request is over."""
        while not self._chunks:
            if self.ended or self.closed:
                return None
            self._wake.clear()
            await self._wake.wait()
        data = b"".join(self._chunks)
        self._chunks.clear()
        self._bytes = 0
        self._drained.set()
        f = np.frombuffer(data, dtype="<f4")
        return (np.clip(f, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()

    def end(self) -> None:
        self.ended = True
        self._wake.set()

    def close(self) -> None:
        self.closed = True
        self._chunks.clear()
        self._bytes = 0
        self._wake.set()
        self._drained.set()


@dataclass
class ProtocolStats:
    started: Counter[str] = field(default_factory=Counter)  # by protocol
    completed: Counter[str] = field(default_factory=Counter)
    cancelled: Counter[str] = field(default_factory=Counter)  # client gone mid-request
    rejected: Counter[str] = field(default_factory=Counter)  # bad input, by field
    ttfa: LatencyWindow = field(default_factory=LatencyWindow)


class ProtocolRequest:
    """One request's call: ``say`` text, ``finish`` the input, read ``audio``; ``cancel``
    when the client goes away; ``close`` always (idempotent)."""

    def __init__(
        self,
        owner: ProtocolRequests,
        call_id: int,
        protocol: str,
        voice: str | None,
        speed: float | None,
    ) -> None:
        self.owner = owner
        self.call_id = call_id
        self.protocol = protocol
        self.voice = voice
        self.speed = speed
        self.audio = RequestAudio(owner.write_timeout)
        self.pending = 0  # texts queued and not yet ended
        self.input_done = False
        self.t_start_ns = time.monotonic_ns()
        self._closed = False
        self.cancelled = False

    # -- RequestHooks ------------------------------------------------------------------

    def utterance_ended(self) -> None:
        self.pending = max(0, self.pending - 1)
        self._maybe_end()

    # -- the handler's side ------------------------------------------------------------

    def say(self, text: str) -> bool:
        """Queue ``text`` (one or more sentences) on the call; ``False`` if the call would not
        take it (the engine is shutting down, or the request is over)."""
        if self._closed or self.audio.closed:
            return False
        calls = self.owner.calls
        for piece in pieces(text):
            if not calls.is_open(self.call_id):  # evicted (--max-calls): never reopen it, as
                return False  # a new call would send its audio to the dock
            dropped = calls.stats.texts_dropped
            self.pending += 1
            calls.on_text(self.call_id, piece.encode("utf-8"), time.monotonic_ns())
            if calls.stats.texts_dropped != dropped or not calls.is_open(self.call_id):
                self.pending -= 1
                return False
        return True

    def finish(self) -> None:
        """No more text: the audio ends after the last queued utterance."""
        self.input_done = True
        self._maybe_end()

    def cancel(self, reason: str) -> None:
        """The client went away (or wrote too slowly): a barge-in on this call."""
        if self._closed:
            return
        if not self.audio.ended:
            self.cancelled = True
            self.owner.stats.cancelled[self.protocol] += 1
            log.info("request_cancelled", call_id=self.call_id, reason=reason)
        self.audio.close()
        if self.owner.calls.is_open(self.call_id):
            self.owner.calls.on_speech_active(self.call_id, time.monotonic_ns())
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.audio.close()
        self.owner.calls.on_call_end(self.call_id)
        self.owner.finished(self)

    def _maybe_end(self) -> None:
        if self.input_done and self.pending == 0 and not self.audio.ended:
            self.audio.end()


class ProtocolRequests:
    """Opens protocol requests on the engine's calls, after admission; their metrics."""

    def __init__(
        self,
        calls: CallManager,
        headroom: Headroom,
        *,
        max_requests: int = MAX_REQUESTS,
        max_input: int = MAX_INPUT_CHARS,
        min_headroom: float = MIN_HEADROOM_CALLS,
        write_timeout: float = WRITE_TIMEOUT,
    ) -> None:
        if max_input < 1:
            raise ValueError(f"max_input must be >= 1, got {max_input}")
        self.calls = calls
        self.admission = Admission(headroom, max_requests, min_headroom)
        self.max_input = max_input
        self.write_timeout = write_timeout
        self.stats = ProtocolStats()
        self.open: dict[int, ProtocolRequest] = {}
        self._ids = itertools.count(REQUEST_CALL_BASE)

    def start(
        self, protocol: str, voice: str | None, speed: float | None
    ) -> ProtocolRequest | Refusal:
        """Admit and open a request, or say why not (counted)."""
        if self.calls.closing:
            self.admission.refused["shutting_down"] += 1
            return Refusal(503, "shutting_down", "the engine is shutting down")
        refusal = self.admission.admit()
        if refusal is not None:
            log.info("request_refused", protocol=protocol, reason=refusal.reason)
            return refusal
        call_id = next(self._ids)
        req = ProtocolRequest(self, call_id, protocol, voice, speed)
        self.calls.open_request(call_id, req.audio, req)
        self.open[call_id] = req
        self.stats.started[protocol] += 1
        log.info("request_started", protocol=protocol, call_id=call_id, voice=voice)
        return req

    def finished(self, req: ProtocolRequest) -> None:
        if self.open.pop(req.call_id, None) is None:
            return
        self.admission.release()
        a = req.audio
        if a.first_audio_ns is not None:
            self.stats.ttfa.add((a.first_audio_ns - req.t_start_ns) / 1e6)
        if not req.cancelled:
            self.stats.completed[req.protocol] += 1
        log.info(
            "request_finished",
            protocol=req.protocol,
            call_id=req.call_id,
            cancelled=req.cancelled,
            audio_s=round(a.samples / SAMPLE_RATE, 3),
            ttfa_ms=None
            if a.first_audio_ns is None
            else round((a.first_audio_ns - req.t_start_ns) / 1e6, 1),
        )

    def cancel_all(self) -> None:
        for req in list(self.open.values()):
            req.cancel("shutdown")

    def families(self) -> list[Family]:
        p = "ttsdock_engine_protocol_"
        st = self.stats
        return [
            labelled(
                f"{p}requests_total",
                "counter",
                dict(st.started),
                "protocol",
                "protocol requests started (HTTP speech, Wyoming)",
            ),
            labelled(f"{p}requests_completed_total", "counter", dict(st.completed), "protocol"),
            labelled(
                f"{p}requests_cancelled_total",
                "counter",
                dict(st.cancelled),
                "protocol",
                "requests whose client went away mid-stream (a barge-in)",
            ),
            labelled(
                f"{p}requests_refused_total",
                "counter",
                dict(self.admission.refused),
                "reason",
                "requests refused by admission (no_headroom, max_requests, shutting_down)",
            ),
            labelled(
                f"{p}requests_rejected_total",
                "counter",
                dict(st.rejected),
                "field",
                "requests rejected for bad input, by field",
            ),
            gauge(f"{p}requests_active", self.admission.active),
            window_summary(f"{p}ttfa_seconds", st.ttfa),
        ]
