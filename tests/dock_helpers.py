"""Fake peers for the dock's integration tests: a real ``ttsdock serve`` subprocess, a fake
LLaMA (connects to 13140/13141), a fake OAP (listens as 13150/13151) and a fake engine
(connects to 13143), all speaking the wire contract through ``protocol``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from protocol.audio import encode_audio_header
from protocol.engine_frames import EngineFrameDecoder, encode_engine_frame
from protocol.framing import FrameCipher, FrameDecoder, NeedData, encode_frame
from protocol.hello import Hello, encode_hello
from protocol.mgmt import PONG, Custom, MgmtMessage, Ping, decode_mgmt, encode_mgmt
from protocol.packet import Packet, decode_packet, encode_packet

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 10.0  # generous: the CI machine is shared and noisy


def now_us() -> int:
    return time.monotonic_ns() // 1000


def audio_payload(samples: int = 480, t_us: int | None = None, fill: bytes = b"\0\0\0\0") -> bytes:
    return encode_audio_header(now_us() if t_us is None else t_us) + fill * samples


async def eventually(pred: Callable[[], Any], within: float = TIMEOUT, what: str = "") -> Any:
    """Poll ``pred`` (sync or async) until it returns something truthy."""
    deadline = time.monotonic() + within
    while True:
        value = pred()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or pred}")
        await asyncio.sleep(0.02)


async def recv(queue: asyncio.Queue[Any], within: float = TIMEOUT) -> Any:
    return await asyncio.wait_for(queue.get(), within)


async def recv_until(
    queue: asyncio.Queue[Any], pred: Callable[[Any], bool], within: float = TIMEOUT
) -> Any:
    """Next item matching ``pred`` (others are skipped)."""
    async with asyncio.timeout(within):
        while True:
            item = await queue.get()
            if pred(item):
                return item


async def nothing_more(queue: asyncio.Queue[Any], pred: Callable[[Any], bool], wait: float) -> None:
    """Assert that no item matching ``pred`` arrives within ``wait`` seconds."""
    with contextlib.suppress(TimeoutError):
        item = await recv_until(queue, pred, wait)
        raise AssertionError(f"unexpected {item!r}")


# --------------------------------------------------------------------- the dock process
class DockProcess:
    """``python -m ttsdock serve`` on ephemeral ports, talking to a given fake OAP."""

    def __init__(self, tmp: Path, oap_ports: tuple[int, int], *extra: str) -> None:
        self.tmp = tmp
        self.ready = tmp / "ready.json"
        self.log_path = tmp / "dock.log"
        self.args = [
            sys.executable, "-m", "ttsdock", "serve",
            "--llama-mgmt-port", "0", "--llama-data-port", "0",
            "--cmd-port", "0", "--dock-port", "0",
            "--oap-mgmt-port", str(oap_ports[0]), "--oap-data-port", str(oap_ports[1]),
            "--ready-file", str(self.ready), "--log-level", "DEBUG", *extra,
        ]  # fmt: skip
        self.proc: asyncio.subprocess.Process | None = None
        self.ports: dict[str, int] = {}

    async def start(self, env: dict[str, str] | None = None) -> DockProcess:
        self.ready.unlink(missing_ok=True)
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("TTSDOCK_")}
        full_env.pop("NOTIFY_SOCKET", None)
        full_env.update({"PYTHONPATH": str(ROOT), **(env or {})})
        self._log = open(self.log_path, "ab")  # noqa: ASYNC230
        self.proc = await asyncio.create_subprocess_exec(
            *self.args, stdout=self._log, stderr=self._log, env=full_env, cwd=str(self.tmp)
        )
        proc = self.proc

        def ready() -> bool:
            if proc.returncode is not None:
                raise AssertionError(f"dock exited with {proc.returncode}:\n{self.logs()}")
            return self.ready.exists()

        await eventually(ready, what="dock ready file")
        self.ports = json.loads(self.ready.read_text())
        return self

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")

    def events(self, name: str) -> list[dict[str, Any]]:
        out = []
        for line in self.logs().splitlines():
            with contextlib.suppress(ValueError):
                obj = json.loads(line)
                if isinstance(obj, dict) and obj.get("event") == name:
                    out.append(obj)
        return out

    async def cmd(self, command: str | bytes) -> str:
        data = command if isinstance(command, bytes) else command.encode() + b"\n"
        r, w = await asyncio.open_connection("127.0.0.1", self.ports["cmd"])
        w.write(data)
        if not data:
            w.write_eof()  # an empty command: the dock answers once it sees EOF
        reply = await asyncio.wait_for(r.read(), TIMEOUT)
        w.close()
        return reply.decode()

    async def stats(self) -> dict[str, str]:
        line = (await self.cmd("STATS")).strip()
        return dict(kv.split("=", 1) for kv in line.split())

    async def stat(self, key: str) -> int:
        return int((await self.stats()).get(key, 0))

    async def stop(self, sig: int = signal.SIGTERM) -> int:
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(sig)
            try:
                await asyncio.wait_for(self.proc.wait(), TIMEOUT)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        self._log.close()
        assert self.proc.returncode is not None
        return self.proc.returncode


# --------------------------------------------------------------------- pipeline framing
class FramedPeer:
    """One length-framed pipeline connection (optional AES-GCM), both directions."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, cipher: FrameCipher | None
    ) -> None:
        self.reader, self.writer, self.cipher = reader, writer, cipher
        self.bodies: asyncio.Queue[bytes] = asyncio.Queue()
        self.closed = asyncio.Event()
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        dec = FrameDecoder()
        try:
            while data := await self.reader.read(65536):
                dec.feed(data)
                while not isinstance(body := dec.next_body(), NeedData):
                    if self.cipher is not None:
                        body = self.cipher.open(body)
                    await self.on_body(body)
        except (ConnectionError, OSError):
            pass
        finally:
            self.closed.set()

    async def on_body(self, body: bytes) -> None:
        await self.bodies.put(body)

    def send_body(self, body: bytes) -> None:
        if self.cipher is not None:
            body = self.cipher.seal(body)
        self.writer.write(encode_frame(body))

    def send_raw(self, data: bytes) -> None:
        self.writer.write(data)

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(Exception):
            await self.writer.wait_closed()
        self.task.cancel()
        with contextlib.suppress(BaseException):
            await self.task


class MgmtPeer(FramedPeer):
    """Decodes mgmt frames into ``messages``; answers PING; CUSTOM handled by ``on_custom``."""

    def __init__(self, *a: Any, on_custom: Callable[[Custom], Custom | None] | None = None) -> None:
        self.messages: asyncio.Queue[MgmtMessage] = asyncio.Queue()
        self.on_custom = on_custom
        super().__init__(*a)

    async def on_body(self, body: bytes) -> None:
        msg = decode_mgmt(body)
        if isinstance(msg, Ping):
            self.send_body(encode_mgmt(PONG))
        if isinstance(msg, Custom) and self.on_custom is not None:
            reply = self.on_custom(msg)
            if reply is not None:
                self.send_body(encode_mgmt(reply))
        await self.messages.put(msg)

    def send(self, msg: MgmtMessage) -> None:
        self.send_body(encode_mgmt(msg))


# --------------------------------------------------------------------- fake OAP
class FakeOap:
    """Listens as OAP mgmt + data. Answers FLUSH_TTS with CUSTOM "OK" (``answer_flush``)."""

    def __init__(self, cipher: FrameCipher | None = None) -> None:
        self.cipher = cipher
        self.mgmt: MgmtPeer | None = None
        self.data: FramedPeer | None = None
        self.messages: asyncio.Queue[MgmtMessage] = asyncio.Queue()
        self.packets: asyncio.Queue[Packet] = asyncio.Queue()
        self.answer_flush = True
        self.mgmt_connects = 0
        self.data_connects = 0
        self.ports: tuple[int, int] = (0, 0)
        self._servers: list[asyncio.Server] = []
        self._pumps: list[asyncio.Task[None]] = []

    async def start(self, ports: tuple[int, int] = (0, 0)) -> FakeOap:
        m = await asyncio.start_server(self._on_mgmt, "127.0.0.1", ports[0], reuse_address=True)
        d = await asyncio.start_server(self._on_data, "127.0.0.1", ports[1], reuse_address=True)
        self._servers = [m, d]
        self.ports = (m.sockets[0].getsockname()[1], d.sockets[0].getsockname()[1])
        return self

    def _custom(self, msg: Custom) -> Custom | None:
        return Custom(b"OK") if self.answer_flush else None

    async def _on_mgmt(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.mgmt_connects += 1
        self.mgmt = MgmtPeer(r, w, self.cipher, on_custom=self._custom)
        self._pumps.append(asyncio.create_task(self._pump(self.mgmt.messages, self.messages)))

    async def _on_data(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.data_connects += 1
        self.data = FramedPeer(r, w, self.cipher)
        self._pumps.append(asyncio.create_task(self._pump_packets(self.data)))

    async def _pump(self, src: asyncio.Queue[Any], dst: asyncio.Queue[Any]) -> None:
        while True:
            await dst.put(await src.get())

    async def _pump_packets(self, peer: FramedPeer) -> None:
        while True:
            await self.packets.put(decode_packet(await peer.bodies.get()))

    async def flushes(self, within: float = TIMEOUT) -> Custom:
        msg = await recv_until(self.messages, lambda m: m == Custom(b"FLUSH_TTS"), within)
        assert isinstance(msg, Custom)
        return msg

    async def stop(self) -> None:
        for s in self._servers:
            s.close()
        for peer in (self.mgmt, self.data):
            if peer is not None:
                await peer.close()
        for s in self._servers:
            with contextlib.suppress(Exception):
                await s.wait_closed()
        for t in self._pumps:
            t.cancel()
        self.mgmt = self.data = None


# --------------------------------------------------------------------- fake LLaMA
class FakeLlama:
    def __init__(self, ports: dict[str, int], cipher: FrameCipher | None = None) -> None:
        self.ports = ports
        self.cipher = cipher
        self.mgmt: MgmtPeer | None = None
        self.data: FramedPeer | None = None

    async def connect(self) -> FakeLlama:
        r, w = await asyncio.open_connection("127.0.0.1", self.ports["llama_mgmt"])
        self.mgmt = MgmtPeer(r, w, self.cipher)
        r, w = await asyncio.open_connection("127.0.0.1", self.ports["llama_data"])
        self.data = FramedPeer(r, w, self.cipher)
        return self

    def text(self, call_id: int, text: str) -> None:
        assert self.data is not None
        self.data.send_body(encode_packet(Packet(call_id, text.encode())))

    def send(self, msg: MgmtMessage) -> None:
        assert self.mgmt is not None
        self.mgmt.send(msg)

    async def close(self) -> None:
        for peer in (self.mgmt, self.data):
            if peer is not None:
                await peer.close()


# --------------------------------------------------------------------- fake engine
class FakeEngine:
    """Docks with HELLO, answers PING (unless ``answer_ping`` is False), records events."""

    def __init__(self, port: int, name: str = "fake", hello: bytes | None = None) -> None:
        self.port = port
        self.name = name
        self.hello = hello if hello is not None else encode_hello(Hello(name))
        self.answer_ping = True
        self.events: asyncio.Queue[Packet | MgmtMessage] = asyncio.Queue()
        self.reply = b""
        self.pings = 0
        self.closed = asyncio.Event()
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.task: asyncio.Task[None] | None = None

    async def dock(self) -> bytes:
        """Connect and send the HELLO; returns the reply line (b"OK" or b"ERR ...")."""
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        if self.hello:
            self.writer.write(self.hello)
        line = await asyncio.wait_for(self.reader.readline(), TIMEOUT)
        self.reply = line.rstrip(b"\n")
        if self.reply == b"OK":
            self.task = asyncio.create_task(self._read())
        return self.reply

    async def _read(self) -> None:
        assert self.reader is not None
        dec = EngineFrameDecoder()
        try:
            while data := await self.reader.read(65536):
                dec.feed(data)
                while not isinstance(ev := dec.next_event(), NeedData):
                    if isinstance(ev, Ping):
                        self.pings += 1
                        if self.answer_ping:
                            self.send(PONG)
                        continue
                    await self.events.put(ev)
        except (ConnectionError, OSError):
            pass
        finally:
            self.closed.set()

    def send(self, ev: Packet | MgmtMessage) -> None:
        assert self.writer is not None
        self.writer.write(encode_engine_frame(ev))

    def send_raw(self, data: bytes) -> None:
        assert self.writer is not None
        self.writer.write(data)

    def audio(self, call_id: int, samples: int = 480, t_us: int | None = None) -> None:
        self.send(Packet(call_id, audio_payload(samples, t_us)))

    async def next_of(self, kind: type, within: float = TIMEOUT) -> Any:
        return await recv_until(self.events, lambda e: isinstance(e, kind), within)

    def abort(self) -> None:
        if self.writer is not None:
            self.writer.transport.abort()

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(Exception):
                await self.writer.wait_closed()
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(BaseException):
                await self.task


# --------------------------------------------------------------------- the rig
class Rig:
    def __init__(self, oap: FakeOap, dock: DockProcess, llama: FakeLlama) -> None:
        self.oap, self.dock, self.llama = oap, dock, llama
        self.engines: list[FakeEngine] = []

    async def engine(self, name: str = "fake", dock: bool = True) -> FakeEngine:
        eng = FakeEngine(self.dock.ports["dock"], name)
        self.engines.append(eng)
        if dock:
            assert await eng.dock() == b"OK"
            await eventually(lambda: self._active(name), what=f"{name} active")
        return eng

    async def _active(self, name: str) -> bool:
        return await self.status_is(f"ACTIVE {name}")

    async def status_is(self, want: str) -> bool:
        return (await self.dock.cmd("STATUS")).strip() == want

    async def stat_eq(self, key: str, value: int) -> bool:
        return await self.dock.stat(key) == value


@contextlib.asynccontextmanager
async def make_rig(
    tmp_path: Path, *extra: str, cipher: FrameCipher | None = None
) -> AsyncIterator[Rig]:
    """Fake OAP up, dock subprocess up and connected to it, fake LLaMA connected."""
    oap = await FakeOap(cipher).start()
    dock = await DockProcess(tmp_path, oap.ports, *extra).start()
    await eventually(lambda: oap.mgmt is not None and oap.data is not None, what="OAP connect")
    llama = await FakeLlama(dock.ports, cipher).connect()
    r = Rig(oap, dock, llama)
    yield r
    for e in r.engines:
        await e.close()
    await llama.close()
    rc = await dock.stop()
    await r.oap.stop()
    assert rc == 0, dock.logs()
    assert "Traceback" not in dock.logs()
