"""Fixtures of the engine-runtime tests: a deterministic test synthesizer and a fake dock.

``ToneSynth`` is a test fixture, not a product engine: every word of the text
is one phrase of a sine tone (``phrase_ms`` long, frequency from the word's
length), computed after ``delay`` seconds of simulated inference (sleeping; or
``burn="native"``: CPU busy with the GIL released, like onnxruntime; or
``burn="python"``: CPU busy in pure Python holding the GIL).
Directive words change its behaviour: ``!fail`` raises ``SynthesisError``,
``!crash`` raises ``RuntimeError``, ``!deaf`` ignores the cancel token,
``!quiet`` makes the phrase quiet (amplitude 0.05), ``!hang`` blocks 30 s
without checking cancellation.

``FakeDock`` is the dock side of docs/wire.md#engine-dock over real sockets: it answers the
HELLO (scripted OK / ERR), records every frame with its arrival time, can PING
on a cadence, and can be stopped and restarted on the same port.

Run as a script it is an engine process: ``python tests/runtime_helpers.py
--dock-port N --cmd-port 0 [--delay S] [--phrase-ms MS] [--fail-load]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from engines.runtime.synth import (  # noqa: E402
    CallState,
    CancelToken,
    FloatArray,
    SynthesisError,
)
from protocol import (  # noqa: E402
    NEED_DATA,
    PING,
    EngineEvent,
    EngineFrameDecoder,
    LineReader,
    Packet,
    Ping,
    Pong,
    decode_audio_header,
    encode_engine_frame,
)
from protocol.hello import OK_LINE  # noqa: E402

RATE = 24000


# --------------------------------------------------------------------------------------
# The test synthesizer


@dataclass
class SynthCall:
    text: str
    call_id: int
    voice: str | None
    speed: float
    prosody_before: int


class ToneSynth:
    """Deterministic tone synthesizer implementing ``engines.runtime.synth.Synthesizer``."""

    name = "tone"
    sample_rate = RATE

    def __init__(
        self,
        phrase_ms: int = 100,
        delay: float = 0.0,
        burn: str = "",
        fail_load: bool = False,
        amplitude: float = 0.5,
    ) -> None:
        self.phrase_ms = phrase_ms
        self.delay = delay
        self.burn = burn
        self.fail_load = fail_load
        self.amplitude = amplitude
        self.loaded = False
        self.warmed = False
        self.closed = False
        self.calls: list[SynthCall] = []
        self.phrases = 0
        self._lock = threading.Lock()
        self.active = 0
        self.max_active = 0
        self.finished = 0

    # -- Synthesizer -----------------------------------------------------------------------

    def load(self) -> None:
        if self.fail_load:
            raise FileNotFoundError("model file /nonexistent/tone.onnx is missing")
        self.loaded = True

    def warm_up(self) -> None:
        list(self.synthesize("warm", CallState(0), CancelToken()))
        self.warmed = True

    def voices(self) -> list[str]:
        return ["alpha", "beta"]

    @property
    def default_voice(self) -> str:
        return "alpha"

    def stats(self) -> dict[str, float]:
        return {"phrases": float(self.phrases)}

    def status_suffix(self) -> str:
        return ":TEST:tone"

    def close(self) -> None:
        self.closed = True

    def synthesize(self, text: str, state: CallState, cancel: CancelToken) -> Iterator[FloatArray]:
        words = text.split()
        if "!fail" in words:
            raise SynthesisError(f"cannot speak {text!r}")
        n = state.prosody.get("n", 0)
        with self._lock:
            self.calls.append(SynthCall(text, state.call_id, state.voice, state.speed, n))
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        try:
            deaf = "!deaf" in words
            for word in words:
                if not deaf:
                    cancel.raise_if_cancelled()
                if word == "!crash":
                    raise RuntimeError("tone generator exploded")
                if word == "!hang":
                    time.sleep(30)
                self._work(self.delay)
                amp = 0.05 if word == "!quiet" else self.amplitude
                yield tone(len(word), self.phrase_ms, amp)
                with self._lock:
                    self.phrases += 1
                state.prosody["n"] = state.prosody.get("n", 0) + 1
        finally:
            with self._lock:
                self.active -= 1
                self.finished += 1

    def _work(self, seconds: float) -> None:
        if seconds <= 0:
            return
        end = time.perf_counter() + seconds
        if self.burn == "python":  # pure Python: holds the GIL (the worst case)
            x = 0
            while time.perf_counter() < end:
                for i in range(200):
                    x += i * i
        elif self.burn == "native":  # CPU busy with the GIL released, like onnxruntime
            block = b"\x5a" * (1 << 16)
            while time.perf_counter() < end:
                hashlib.sha256(block).digest()
        else:  # waiting (e.g. on an accelerator): no CPU, no GIL
            time.sleep(seconds)


def tone(word_len: int, ms: int, amp: float = 0.5) -> FloatArray:
    n = RATE * ms // 1000
    freq = 200.0 + 50.0 * word_len
    t = np.arange(n, dtype=np.float64) / RATE
    return (amp * np.sin(2 * math.pi * freq * t)).astype(np.float32)


# --------------------------------------------------------------------------------------
# The fake dock


@dataclass
class Received:
    t: float  # time.monotonic() at arrival
    event: EngineEvent


@dataclass
class DockSession:
    hello: bytes
    t_hello: float
    writer: asyncio.StreamWriter
    frames: list[Received] = field(default_factory=list)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    pongs: asyncio.Queue[float] = field(default_factory=asyncio.Queue)

    def send(self, event: EngineEvent) -> None:
        self.writer.write(encode_engine_frame(event))

    def send_raw(self, data: bytes) -> None:
        self.writer.write(data)

    def text(self, call_id: int, text: str) -> None:
        self.send(Packet(call_id, text.encode()))

    def audio(self, call_id: int | None = None) -> list[Received]:
        return [
            r
            for r in self.frames
            if isinstance(r.event, Packet) and (call_id is None or r.event.call_id == call_id)
        ]

    async def ping_rtt(self, within: float = 5.0) -> float:
        """Send a PING; seconds until the next PONG arrives."""
        while not self.pongs.empty():
            self.pongs.get_nowait()
        t0 = time.perf_counter()
        self.send(PING)
        await asyncio.wait_for(self.pongs.get(), within)
        return time.perf_counter() - t0

    async def wait_audio(self, call_id: int, n: int = 1, within: float = 10.0) -> None:
        async with asyncio.timeout(within):
            while len(self.audio(call_id)) < n:  # noqa: ASYNC110
                await asyncio.sleep(0.005)


class FakeDock:
    """Dock side of the engine socket, on 127.0.0.1."""

    def __init__(self, port: int = 0, replies: list[bytes] | None = None, ping_every: float = 0.2):
        self.port = port
        self.replies = list(replies or [])  # scripted HELLO answers, then OK forever
        self.ping_every = ping_every  # 0: never PING
        self.sessions: list[DockSession] = []
        self.hellos: list[tuple[float, bytes]] = []
        self.connections = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self.new_session: asyncio.Queue[DockSession] = asyncio.Queue()
        self.refuse = False  # accept and close at once without reading (a broken dock)

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._on_conn, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop listening and drop every connection (the dock process dies)."""
        if self._server is not None:
            self._server.close()
        for s in self.sessions:
            with contextlib.suppress(Exception):
                s.writer.transport.abort()
        for t in list(self._tasks):
            t.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=1)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1)
        self._server = None

    async def session(self, within: float = 10.0) -> DockSession:
        return await asyncio.wait_for(self.new_session.get(), within)

    @property
    def last(self) -> DockSession:
        return self.sessions[-1]

    async def _on_conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        try:
            if self.refuse:
                writer.transport.abort()
                return
            await self._serve(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError, asyncio.CancelledError):
            pass
        finally:
            self._tasks.discard(task)
            with contextlib.suppress(Exception):
                writer.transport.abort()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        lr = LineReader()
        line = None
        rest = b""
        async with asyncio.timeout(2.0):
            while line is None:
                data = await reader.read(1024)
                if not data:
                    return
                line = lr.feed(data)
                rest = lr.rest
        t = time.monotonic()
        self.hellos.append((t, line))
        reply = self.replies.pop(0) if self.replies else OK_LINE
        writer.write(reply)
        if reply != OK_LINE:
            await writer.drain()
            return
        sess = DockSession(line, t, writer)
        self.sessions.append(sess)
        self.new_session.put_nowait(sess)
        pinger = asyncio.create_task(self._ping(sess)) if self.ping_every > 0 else None
        dec = EngineFrameDecoder()
        try:
            if rest:
                dec.feed(rest)
            while True:
                while True:
                    ev = dec.next_event()
                    if ev is NEED_DATA:
                        break
                    assert not isinstance(ev, type(NEED_DATA))
                    now = time.monotonic()
                    if isinstance(ev, Pong):
                        sess.pongs.put_nowait(time.perf_counter())
                    elif isinstance(ev, Ping):
                        sess.send(Pong())
                    sess.frames.append(Received(now, ev))
                data = await reader.read(65536)
                if not data:
                    return
                dec.feed(data)
        finally:
            sess.closed.set()
            if pinger is not None:
                pinger.cancel()

    async def _ping(self, sess: DockSession) -> None:
        while True:
            await asyncio.sleep(self.ping_every)
            sess.send(PING)


def audio_samples(r: Received) -> np.ndarray:
    assert isinstance(r.event, Packet)
    payload = r.event.payload
    hdr = decode_audio_header(payload)
    assert hdr.sample_rate == RATE
    return np.frombuffer(payload[12:], dtype="<f4")


# --------------------------------------------------------------------------------------
# Engines under test


@contextlib.asynccontextmanager
async def running_engine(synth: ToneSynth, dock_port: int, **config: Any) -> AsyncIterator[Any]:
    """An in-process ``Engine`` (no model load) docking to ``dock_port``; cmd port 0."""
    from engines.runtime.app import Engine, EngineConfig

    synth.load()
    cfg = EngineConfig(name=synth.name, dock_port=dock_port, cmd_port=0, **config)
    engine = Engine(synth, cfg)
    await engine.start()
    try:
        async with asyncio.timeout(5):
            while engine.cmd_port is None:  # noqa: ASYNC110
                await asyncio.sleep(0.005)
        yield engine
    finally:
        engine.request_stop("test")
        await engine.shutdown()


async def cmd(port: int, line: str | bytes, within: float = 30.0) -> str:
    """Send one command to a cmd port and return the reply line (without newline)."""
    data = line.encode() if isinstance(line, str) else line
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data + (b"" if data.endswith(b"\n") else b"\n"))
        await writer.drain()
        reply = await asyncio.wait_for(reader.read(65536), within)
    finally:
        writer.close()
    return reply.decode().rstrip("\n")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawn_engine(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start this file as an engine process (real interpreter, uvloop, signals)."""
    full_env = dict(os.environ, PYTHONUNBUFFERED="1")
    full_env.update(env or {})
    return subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), *args],
        cwd=str(ROOT),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=full_env,
    )


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def events_of(sess: DockSession, kind: type) -> list[Received]:
    return [r for r in sess.frames if isinstance(r.event, kind)]


def main(argv: list[str] | None = None) -> int:
    from engines.runtime.cli import common_parser, run_engine

    p = common_parser("tone", description="test tone engine (fixture)")
    p.add_argument("--phrase-ms", type=int, default=100)
    p.add_argument("--delay", type=float, default=0.0)
    p.add_argument("--burn", choices=["", "python", "native"], default="")
    p.add_argument("--fail-load", action="store_true")
    args = p.parse_args(argv)
    synth = ToneSynth(args.phrase_ms, args.delay, args.burn, args.fail_load)
    return run_engine(synth, args)


if __name__ == "__main__":
    sys.exit(main())
