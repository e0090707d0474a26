"""The main job, end to end: dock + Kokoro engine, speech through the real dock path.

Starts ``ttsdock serve`` and ``ttsdock kokoro`` as real processes on free loopback
ports, plays the LLaMA stage (sends an English and a German sentence as text
Packets on the data channel, CALL_END on mgmt) and the OAP stage (listens on the
mgmt/data ports the dock connects to, collects the audio Packets), writes
``out/demo.wav`` and prints time-to-first-audio and real-time factor per sentence.
Everything is stopped cleanly at the end (SIGTERM), also on errors.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import time
import wave
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from protocol import (
    FLUSH_TTS,
    NEED_DATA,
    PONG,
    CallEnd,
    Custom,
    FrameDecoder,
    Packet,
    Ping,
    check_audio_payload,
    decode_mgmt,
    decode_packet,
    encode_frame,
    encode_mgmt,
    encode_packet,
)

SENTENCES = [
    ("en", "Hello! Thank you for calling. How can I help you today?"),
    ("de", "Guten Tag, wie kann ich Ihnen heute helfen?"),
]
SAMPLE_RATE = 24000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class CallAudio:
    sent_at: float = 0.0
    first_at: float | None = None
    last_at: float | None = None
    chunks: list[bytes] = field(default_factory=list)
    samples: int = 0
    arrivals: list[tuple[float, int]] = field(default_factory=list)  # (time, samples)


class FakeOap:
    """Plays the OAP stage: two listeners, answers PING and CUSTOM, collects audio."""

    def __init__(self) -> None:
        self.calls: dict[int, CallAudio] = {}
        self.flushes = 0
        self.packets = 0  # audio packets received, all calls
        self.data_connected = asyncio.Event()

    async def on_mgmt(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        dec = FrameDecoder()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            while data := await reader.read(65536):
                dec.feed(data)
                while not isinstance(body := dec.next_body(), type(NEED_DATA)):
                    msg = decode_mgmt(body)
                    if isinstance(msg, Ping):
                        writer.write(encode_frame(encode_mgmt(PONG)))
                    elif isinstance(msg, Custom):
                        self.flushes += msg == FLUSH_TTS
                        writer.write(encode_frame(encode_mgmt(Custom(b"OK"))))
        writer.close()

    async def on_data(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.data_connected.set()
        dec = FrameDecoder()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            while data := await reader.read(1 << 20):
                dec.feed(data)
                while not isinstance(body := dec.next_body(), type(NEED_DATA)):
                    pkt = decode_packet(body)
                    check_audio_payload(pkt.payload)
                    call = self.calls.setdefault(pkt.call_id, CallAudio())
                    now = time.monotonic()
                    if call.first_at is None:
                        call.first_at = now
                    call.last_at = now
                    call.chunks.append(pkt.payload[12:])
                    call.samples += (len(pkt.payload) - 12) // 4
                    call.arrivals.append((now, (len(pkt.payload) - 12) // 4))
                    self.packets += 1
        writer.close()


async def ctl(port: int, command: str) -> str:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(command.encode() + b"\n")
    await writer.drain()
    reply = await reader.read(65536)
    writer.close()
    return reply.decode().strip()


def parse_stats(line: str) -> dict[str, int]:
    """The integer fields of an engine cmd port's ``STATS`` line (``key=value:...``)."""
    out: dict[str, int] = {}
    for item in re.split(r"[:\s]+", line):
        key, sep, value = item.partition("=")
        if sep and value.lstrip("-").isdigit():
            out[key] = int(value)
    return out


async def wait_for(predicate: Callable[[], Awaitable[bool]], limit: float, what: str) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if await predicate():
                return
        await asyncio.sleep(0.1)
    raise TimeoutError(f"timed out waiting for {what}")


Procs = list[subprocess.Popen[bytes]]


PORT_NAMES = ("llama_mgmt", "llama_data", "cmd", "dock", "oap_mgmt", "oap_data", "engine_cmd")


def start_processes(log_dir: Path, ports: dict[str, int], engine_args: list[str]) -> Procs:
    """``ttsdock serve`` and ``ttsdock kokoro <engine_args>`` on ``ports``, logs in
    ``log_dir``; shared with benchmarks/kokoro_ttfa.py."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    log_dir.mkdir(parents=True, exist_ok=True)
    exe = [sys.executable, "-m", "ttsdock"]
    dock_cmd = [
        *exe, "serve",
        "--llama-mgmt-port", str(ports["llama_mgmt"]),
        "--llama-data-port", str(ports["llama_data"]),
        "--cmd-port", str(ports["cmd"]),
        "--dock-port", str(ports["dock"]),
        "--oap-mgmt-port", str(ports["oap_mgmt"]),
        "--oap-data-port", str(ports["oap_data"]),
    ]  # fmt: skip
    engine_cmd = [
        *exe, "kokoro",
        "--dock-port", str(ports["dock"]),
        "--cmd-port", str(ports["engine_cmd"]),
        *engine_args,
    ]  # fmt: skip
    procs = []
    for name, cmd in (("dock", dock_cmd), ("kokoro", engine_cmd)):
        with open(log_dir / f"{name}.log", "wb") as log_file:
            procs.append(subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env))
    return procs


def stop_processes(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in reversed(procs):  # the engine first, then the dock
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


async def run(
    args: argparse.Namespace,
    ports: dict[str, int],
    procs: list[subprocess.Popen[bytes]],
    oap: FakeOap,
) -> int:
    t_start = time.monotonic()
    print(f"dock and kokoro engine starting (logs in {Path(args.out).parent}/dock.log, kokoro.log)")

    async def docked() -> bool:
        for p, name in zip(procs, ("dock", "kokoro"), strict=True):
            if p.poll() is not None:
                raise RuntimeError(f"{name} exited with status {p.returncode}; see its log")
        return (await ctl(ports["cmd"], "STATUS")).startswith("ACTIVE")

    await wait_for(docked, args.timeout, "the Kokoro engine to dock")
    print(f"engine docked after {time.monotonic() - t_start:.1f} s (model load and warm-up)")
    await asyncio.wait_for(oap.data_connected.wait(), 10)

    _, mgmt_w = await asyncio.open_connection("127.0.0.1", ports["llama_mgmt"])
    _, data_w = await asyncio.open_connection("127.0.0.1", ports["llama_data"])
    results = []
    for i, (lang, text) in enumerate(SENTENCES, start=1):
        call = oap.calls.setdefault(i, CallAudio())
        call.sent_at = time.monotonic()
        data_w.write(encode_frame(encode_packet(Packet(i, text.encode()))))
        await data_w.drain()

        # The utterance is complete when the engine says it has ended (its STATS count
        # it) and every audio packet it sent has arrived here through the dock. A gap
        # in the audio is no such signal: on a slow CPU an underrun lasts longer than
        # any gap we would wait for, and the sentence would be cut short.
        async def finished(n: int = i) -> bool:
            stats = parse_stats(await ctl(ports["engine_cmd"], "STATS"))
            if stats.get("utterances_failed", 0) or stats.get("utterances_cancelled", 0):
                raise RuntimeError(f"the engine did not complete sentence {n}: {stats}")
            ended = stats.get("utterances_completed", 0) >= n
            return ended and oap.packets == stats.get("packets_sent", -1)

        await wait_for(finished, args.timeout, f"audio for sentence {i}")
        mgmt_w.write(encode_frame(encode_mgmt(CallEnd(i))))
        await mgmt_w.drain()
        assert call.first_at is not None and call.last_at is not None
        results.append(
            (
                lang,
                text,
                call.first_at - call.sent_at,
                call.samples / SAMPLE_RATE,
                call.last_at - call.sent_at,
            )
        )
    for w in (mgmt_w, data_w):
        w.close()

    pcm = bytearray()
    gap = b"\0\0" * (SAMPLE_RATE // 2)
    for i in range(1, len(SENTENCES) + 1):
        for chunk in oap.calls[i].chunks:
            floats = struct.unpack(f"<{len(chunk) // 4}f", chunk)
            pcm += struct.pack(
                f"<{len(floats)}h", *(max(-32768, min(32767, int(x * 32767))) for x in floats)
            )
        pcm += gap
    out = Path(args.out)
    with wave.open(str(out), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(SAMPLE_RATE)
        wav.writeframes(bytes(pcm))
    print()
    print(f"{'lang':<5}{'TTFA':>9}{'audio':>9}{'wall':>9}{'RTF':>7}  text")
    for lang, text, ttfa, dur, wall in results:
        line = f"{lang:<5}{ttfa * 1000:>7.0f}ms{dur:>8.2f}s{wall:>8.2f}s{wall / dur:>7.2f}"
        print(f"{line}  {text}")
    print(f"\nwrote {out} ({len(pcm) // 2 / SAMPLE_RATE:.2f} s, 24 kHz mono 16-bit)")
    print(
        "TTFA = text packet sent by LLaMA -> first audio packet at OAP; "
        "RTF = wall time to the last audio packet / audio duration"
    )
    return 0


async def amain(args: argparse.Namespace, ports: dict[str, int]) -> int:
    oap = FakeOap()
    servers = [
        await asyncio.start_server(oap.on_mgmt, "127.0.0.1", ports["oap_mgmt"]),
        await asyncio.start_server(oap.on_data, "127.0.0.1", ports["oap_data"]),
    ]
    engine_args = ["--models-dir", args.models_dir]
    if args.voice:
        engine_args += ["--voice", args.voice]
    procs = await asyncio.to_thread(start_processes, Path(args.out).parent, ports, engine_args)
    try:
        return await run(args, ports, procs, oap)
    finally:
        await asyncio.to_thread(stop_processes, procs)
        for s in servers:
            s.close()
        names = ("dock", "engine")
        codes = ", ".join(f"{n} exit {p.returncode}" for n, p in zip(names, procs, strict=True))
        print(f"stopped: {codes}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--out", default="out/demo.wav")
    p.add_argument("--models-dir", default=os.environ.get("WHISPERTALK_MODELS_DIR", "models"))
    p.add_argument("--voice", default=None)
    p.add_argument("--timeout", type=float, default=180.0)
    args = p.parse_args()
    ports = {name: free_port() for name in PORT_NAMES}
    try:
        return asyncio.run(amain(args, ports))
    except (TimeoutError, RuntimeError) as exc:
        print(f"demo failed: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
