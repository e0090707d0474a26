"""Engine -> OAP hop through the dock vs a direct socket (the physical baseline).

The dock runs as a subprocess (``python -m ttsdock serve`` on ephemeral ports); the fake
engine and the fake OAP run in this process. Measured:

* real-time pacing: ``--calls`` call ids (default 20), each sending one 4800-sample chunk
  every 200 ms (staggered), for ``--seconds`` (default 20) through the dock and as long
  over a direct socket pair, alternating in 5 s segments so that noise from other work on
  the machine hits both alike; latency = OAP receive time - ``t_engine_out_us``
  (CLOCK_MONOTONIC, microseconds, both processes);
* unpaced burst: ``--burst-frames`` chunks (default 2000: ``--burst-calls`` 20 calls x 100
  chunks of 4800 samples, 38 MB) written by the engine as fast as it can, no window, no
  pacing; sent / delivered / dropped and frames/s at OAP, through the dock and over the
  direct socket pair in the same run. The dock must push back on the engine (TCP
  back-pressure), not drop;
* unpaced windowed throughput: ``--frames`` chunks with at most 64 in flight, frames/s.

Targets: 0 of the burst's frames dropped; burst frames/s through the dock at
least the reference's 31,000; at real-time pacing the dock's median within 0.1 ms of the
direct path's and its p99 <= 1 ms.

    python benchmarks/dock_hop.py [--seconds 20] [--calls 20] [--frames 20000]
    python benchmarks/dock_hop.py --seconds 5 --frames 5000     # a short run (~30 s)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from protocol.audio import encode_audio_header  # noqa: E402
from protocol.engine_frames import EngineFrameDecoder  # noqa: E402
from protocol.framing import FrameDecoder, NeedData  # noqa: E402
from protocol.hello import Hello, encode_hello  # noqa: E402
from protocol.mgmt import Custom, Ping, decode_mgmt, encode_mgmt  # noqa: E402

SAMPLES = 4800
PCM = b"\x00\x00\x80\x3e" * SAMPLES  # 0.25f, never decoded by anyone
PERIOD = 0.2
SEGMENT = 5.0
WINDOW = 64  # unpaced: chunks in flight at most (64 x 19 KB = 1.2 MiB)
TARGET_MEDIAN_MS = 0.1  # dock median - direct median, real-time pacing
TARGET_P99_MS = 1.0  # dock p99, real-time pacing
TARGET_FPS = 31_000  # burst frames/s through the dock (the reference: 31,000-47,000)
_TAG_HDR = struct.Struct(">BII")
_LEN_HDR = struct.Struct(">III")
_T = struct.Struct(">Q")
WARMUP = 999_999  # call id of warm-up chunks (not measured)
STALL_S = 3.0  # burst: no frame for this long means the rest is lost
_WARMUP = struct.pack(">I", WARMUP)


def now_us() -> int:
    return time.monotonic_ns() // 1000


class Receiver(asyncio.Protocol):
    """Fake OAP data: records one latency sample per received audio frame."""

    def __init__(self) -> None:
        self.dec = FrameDecoder()
        self.lat_us: list[int] = []
        self.frames = 0
        self.record = True
        self.first = 0.0
        self.last = 0.0
        self.more: asyncio.Future[None] | None = None
        self.connected = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.connected = True

    async def wait_more(self) -> None:
        self.more = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait_for(self.more, 1.0)
        except TimeoutError:
            pass

    def data_received(self, data: bytes) -> None:
        t = now_us()
        self.dec.feed(data)
        while not isinstance(body := self.dec.next_body(), NeedData):
            if self.record and body[:4] != _WARMUP:
                self.lat_us.append(t - _T.unpack_from(body, 12)[0])
            if not self.frames:
                self.first = time.perf_counter()
            self.frames += 1
            self.last = time.perf_counter()
        if self.more is not None and not self.more.done():
            self.more.set_result(None)


class OapMgmt(asyncio.Protocol):
    """Fake OAP mgmt: answers PING and CUSTOM requests."""

    connected = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        OapMgmt.connected = True
        self.t: Any = transport
        self.dec = FrameDecoder()

    def data_received(self, data: bytes) -> None:
        self.dec.feed(data)
        while not isinstance(body := self.dec.next_body(), NeedData):
            msg = decode_mgmt(body)
            reply = encode_mgmt(Custom(b"OK")) if isinstance(msg, Custom) else None
            if isinstance(msg, Ping):
                reply = b"\x05"
            if reply is not None:
                self.t.write(struct.pack(">I", len(reply)) + reply)


class Engine(asyncio.Protocol):
    """Fake engine on the dock (``tagged``) or writing OAP frames directly (baseline)."""

    def __init__(self, tagged: bool) -> None:
        self.tagged = tagged
        self.dec = EngineFrameDecoder()
        self.ok = asyncio.get_running_loop().create_future()
        self.buf = b""
        self.paused = False
        self.resumed: asyncio.Future[None] | None = None
        self.t: Any = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t = transport
        if self.tagged:
            transport.write(encode_hello(Hello("bench")))  # type: ignore[attr-defined]
        else:
            self.ok.set_result(True)

    def data_received(self, data: bytes) -> None:
        if not self.ok.done():
            self.buf += data
            if b"\n" in self.buf:
                line, _, rest = self.buf.partition(b"\n")
                self.ok.set_result(line == b"OK")
                data = rest
            else:
                return
        self.dec.feed(data)
        while not isinstance(ev := self.dec.next_event(), NeedData):
            if isinstance(ev, Ping):
                self.t.write(b"\x02\x05")

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self.resumed is not None and not self.resumed.done():
            self.resumed.set_result(None)

    def send(self, call_id: int) -> None:
        payload_len = 12 + len(PCM)
        if self.tagged:
            hdr = _TAG_HDR.pack(1, call_id, payload_len)
        else:
            hdr = _LEN_HDR.pack(payload_len + 8, call_id, payload_len)
        self.t.write(b"".join((hdr, encode_audio_header(now_us()), PCM)))

    async def drain(self) -> None:
        if self.paused:
            self.resumed = asyncio.get_running_loop().create_future()
            await self.resumed


async def unpaced(engine: Engine, rx: Receiver, frames: int) -> tuple[float, int]:
    """Closed loop: at most ``WINDOW`` chunks in flight (well inside the dock's 4 MiB OAP
    bound), so the number is the forwarding rate, not the rate of dropping."""
    rx.record = False
    rx.frames = 0
    rx.last = 0.0
    t0 = time.perf_counter()
    sent = 0
    deadline = time.monotonic() + 120
    while rx.frames < frames and time.monotonic() < deadline:
        while sent < frames and sent - rx.frames < WINDOW:
            engine.send(sent % 20 + 1)
            sent += 1
        await engine.drain()
        await rx.wait_more()
    elapsed = (rx.last or time.perf_counter()) - t0
    rx.record = True
    return (rx.frames / elapsed if elapsed > 0 else 0.0), rx.frames


async def burst(engine: Engine, rx: Receiver, frames: int, calls: int) -> dict[str, float]:
    """Open loop: every chunk written at once, as fast as the engine can; wait until all
    arrived or nothing arrived for ``STALL_S``."""
    rx.record = False
    rx.frames = 0
    rx.last = 0.0
    t0 = time.perf_counter()
    for i in range(frames):
        engine.send(i % calls + 1)
    seen, changed = 0, time.monotonic()
    while rx.frames < frames:
        await rx.wait_more()
        if rx.frames != seen:
            seen, changed = rx.frames, time.monotonic()
        elif time.monotonic() - changed > STALL_S:
            break
    elapsed = (rx.last or time.perf_counter()) - t0
    rx.record = True
    got = rx.frames
    return {
        "sent": frames,
        "delivered": got,
        "lost": frames - got,
        "fps": got / elapsed if elapsed > 0 else 0.0,
        "seconds": elapsed,
    }


def _nodelay(engine: Engine) -> None:
    import socket

    engine.t.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


async def engine_child(dock_port: int, direct_port: int, calls: int, seconds: float) -> None:
    """The paced engine: alternates 5 s segments through the dock and direct."""
    loop = asyncio.get_running_loop()
    _, via_dock = await loop.create_connection(lambda: Engine(True), "127.0.0.1", dock_port)
    if not await via_dock.ok:
        raise SystemExit("dock refused the HELLO")
    _, direct = await loop.create_connection(lambda: Engine(False), "127.0.0.1", direct_port)
    for e in (via_dock, direct):
        _nodelay(e)
    for _ in range(5):  # warm-up, not measured
        via_dock.send(WARMUP)
        direct.send(WARMUP)
        await asyncio.sleep(0.05)
    remaining = seconds
    while remaining > 0:
        seg = min(SEGMENT, remaining)
        await paced_send(via_dock, calls, seg)
        await paced_send(direct, calls, seg)
        remaining -= seg
    await asyncio.sleep(0.2)


async def paced_send(engine: Engine, calls: int, seconds: float) -> None:
    """One chunk per call every 200 ms, calls staggered evenly over the period."""
    loop = asyncio.get_running_loop()
    start = loop.time() + 0.05
    step = PERIOD / calls
    for tick in range(int(seconds / PERIOD)):
        for c in range(calls):
            delay = start + tick * PERIOD + c * step - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            engine.send(c + 1)


def summary(lat: list[int]) -> dict[str, float]:
    s = sorted(lat)
    if not s:
        return {"n": 0, "median_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0}
    p99 = s[min(len(s) - 1, int(len(s) * 0.99))]
    return {
        "n": len(s),
        "median_ms": statistics.median(s) / 1000,
        "p99_ms": p99 / 1000,
        "max_ms": s[-1] / 1000,
    }


def cmd(port: int, command: str) -> str:
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(command.encode() + b"\n")
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out.decode()


async def run(args: argparse.Namespace) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    # fake OAP (dock path) and the direct receiver (baseline), both in this process
    rx_dock, rx_direct = Receiver(), Receiver()
    oap_mgmt = await loop.create_server(OapMgmt, "127.0.0.1", 0)
    oap_data = await loop.create_server(lambda: rx_dock, "127.0.0.1", 0)
    direct = await loop.create_server(lambda: rx_direct, "127.0.0.1", 0)
    tmp = Path(tempfile.mkdtemp(prefix="dock_hop_"))
    ready = tmp / "ready.json"
    proc = subprocess.Popen(  # noqa: ASYNC220 (once, before any measurement)
        [
            sys.executable, "-m", "ttsdock", "serve",
            "--llama-mgmt-port", "0", "--llama-data-port", "0", "--cmd-port", "0",
            "--dock-port", "0", "--ready-file", str(ready), "--log-level", "WARN",
            "--oap-mgmt-port", str(oap_mgmt.sockets[0].getsockname()[1]),
            "--oap-data-port", str(oap_data.sockets[0].getsockname()[1]),
        ],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        preexec_fn=lambda: _dock_priority(args),
    )  # fmt: skip
    try:
        while not ready.exists():
            if proc.poll() is not None:
                raise SystemExit(f"dock exited with {proc.returncode}")
            await asyncio.sleep(0.02)
        ports = json.loads(ready.read_text())
        while not (rx_dock.connected and OapMgmt.connected):  # noqa: ASYNC110
            await asyncio.sleep(0.02)
        # paced: the engine runs in its own process, as a real engine would; the receivers
        # (OAP) stay here, so both paths pay the same receiver wake-up and the dock path
        # pays for the dock on top: the difference is what the dock adds
        child = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--engine-child",
            str(ports["dock"]), str(direct.sockets[0].getsockname()[1]),
            "--seconds", str(args.seconds), "--calls", str(args.calls),
        )  # fmt: skip
        if await child.wait() != 0:
            raise SystemExit("engine child failed")
        await asyncio.sleep(0.3)
        lat_dock, lat_direct = list(rx_dock.lat_us), list(rx_direct.lat_us)
        paced_stats = cmd(ports["cmd"], "STATS").strip()
        # unpaced: engine in this process, closed loop on the received count
        _, eng_dock = await loop.create_connection(lambda: Engine(True), "127.0.0.1", ports["dock"])
        assert await eng_dock.ok, "dock refused the HELLO"
        _, eng_direct = await loop.create_connection(
            lambda: Engine(False), "127.0.0.1", direct.sockets[0].getsockname()[1]
        )
        before = dict(kv.split("=", 1) for kv in cmd(ports["cmd"], "STATS").split())
        burst_direct = await burst(eng_direct, rx_direct, args.burst_frames, args.burst_calls)
        burst_dock = await burst(eng_dock, rx_dock, args.burst_frames, args.burst_calls)
        mid = dict(kv.split("=", 1) for kv in cmd(ports["cmd"], "STATS").split())
        burst_dock["dropped"] = int(mid["drops_total"]) - int(before["drops_total"])
        burst_dock["pauses"] = int(mid["engine_read_pauses"]) - int(before["engine_read_pauses"])
        fps_dock, got_dock = await unpaced(eng_dock, rx_dock, args.frames)
        fps_direct, got_direct = await unpaced(eng_direct, rx_direct, args.frames)
        dock_stats = cmd(ports["cmd"], "STATS").strip()
    finally:
        proc.terminate()
        proc.wait(10)
    stats = dict(kv.split("=", 1) for kv in paced_stats.split())
    after = dict(kv.split("=", 1) for kv in dock_stats.split())
    return {
        "burst_dock": burst_dock,
        "burst_direct": burst_direct,
        "dock": summary(lat_dock),
        "direct": summary(lat_direct),
        "fps_dock": fps_dock,
        "fps_direct": fps_direct,
        "frames_dock": got_dock,
        "frames_direct": got_direct,
        "frames_sent": args.frames,
        "dock_hop_p50_us": int(stats.get("hop_p50_us", 0)),
        "dock_hop_p99_us": int(stats.get("hop_p99_us", 0)),
        "dock_drops": int(after.get("drops_total", 0)),
    }


def _dock_priority(args: argparse.Namespace) -> None:
    """In the dock child before exec: what systemd's Nice= / CPUSchedulingPolicy= would do."""
    if args.dock_nice:
        os.nice(args.dock_nice)
    if args.dock_fifo:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(args.dock_fifo))


def _run(coro: Any) -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seconds", type=float, default=20.0, help="paced seconds per path")
    p.add_argument("--calls", type=int, default=20, help="concurrent call ids")
    p.add_argument("--frames", type=int, default=20000, help="frames in the unpaced windowed run")
    p.add_argument("--burst-frames", type=int, default=2000, help="frames in the unpaced burst")
    p.add_argument("--burst-calls", type=int, default=20, help="call ids in the burst")
    p.add_argument(
        "--dock-nice",
        type=int,
        default=0,
        help="run the dock at this nice value (e.g. -10 as systemd Nice=-10 would; "
        "negative values need root)",
    )
    p.add_argument(
        "--dock-fifo",
        type=int,
        default=0,
        help="run the dock SCHED_FIFO at this priority (as systemd CPUSchedulingPolicy=fifo "
        "would; needs root): shows how much of the tail is waiting for a CPU",
    )
    p.add_argument("--json", action="store_true", help="print the raw numbers as JSON too")
    p.add_argument("--engine-child", nargs=2, type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.engine_child:
        _run(engine_child(*args.engine_child, args.calls, args.seconds))
        return 0
    r = _run(run(args))
    d, b = r["dock"], r["direct"]
    add_med = d["median_ms"] - b["median_ms"]
    add_p99 = d["p99_ms"] - b["p99_ms"]
    print(
        f"real-time pacing: {args.calls} calls x 1 chunk/200 ms, {args.seconds:g} s per path"
        f" (dock nice {args.dock_nice:+d}, fifo {args.dock_fifo}, "
        f"load average {os.getloadavg()[0]:.2f})"
    )
    print(f"  {'path':<8}{'n':>7}{'median ms':>11}{'p99 ms':>9}{'max ms':>9}")
    for name, s in (("direct", b), ("dock", d)):
        n, med, p99, mx = s["n"], s["median_ms"], s["p99_ms"], s["max_ms"]
        print(f"  {name:<8}{n:>7}{med:>11.3f}{p99:>9.3f}{mx:>9.3f}")
    ok_med = add_med <= TARGET_MEDIAN_MS
    ok_p99 = d["p99_ms"] <= TARGET_P99_MS
    print(
        f"  dock adds: median {add_med:+.3f} ms (target <= {TARGET_MEDIAN_MS}) "
        f"{'OK' if ok_med else 'MISSED'}, p99 {add_p99:+.3f} ms; dock p99 {d['p99_ms']:.3f} ms "
        f"(target <= {TARGET_P99_MS}) {'OK' if ok_p99 else 'MISSED'}"
    )
    print(
        f"  dock's own hop (STATS, engine stamp -> forward): p50 {r['dock_hop_p50_us']} us, "
        f"p99 {r['dock_hop_p99_us']} us; drops {r['dock_drops']}"
    )
    bd, bx = r["burst_dock"], r["burst_direct"]
    print(
        f"unpaced burst: {args.burst_frames} chunks of {SAMPLES} samples over "
        f"{args.burst_calls} calls, written at once"
    )
    print(f"  {'path':<8}{'sent':>7}{'delivered':>11}{'lost':>6}{'frames/s':>10}{'s':>7}")
    for name, b_ in (("direct", bx), ("dock", bd)):
        print(
            f"  {name:<8}{b_['sent']:>7}{b_['delivered']:>11}{b_['lost']:>6}"
            f"{b_['fps']:>10.0f}{b_['seconds']:>7.3f}"
        )
    ok_drop = bd["lost"] == 0 and bd["dropped"] == 0
    ok_fps = bd["fps"] >= TARGET_FPS
    print(
        f"  dock dropped {bd['dropped']} (target 0) {'OK' if ok_drop else 'MISSED'}; "
        f"engine reading paused {bd['pauses']} times; frames/s target >= {TARGET_FPS}: "
        f"{'OK' if ok_fps else 'MISSED'} ({bd['fps'] - TARGET_FPS:+.0f})"
    )
    print(f"unpaced, at most {WINDOW} in flight: {r['frames_sent']} chunks")
    print(f"  direct {r['fps_direct']:>9.0f} frames/s ({r['frames_direct']} received)")
    print(f"  dock   {r['fps_dock']:>9.0f} frames/s ({r['frames_dock']} received)")
    if args.json:
        print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
