"""Engine runtime benchmark: barge-in latency and PONG round trip under synthesis load.

Starts the test tone engine (tests/runtime_helpers.py, a real process on uvloop)
against a fake dock over loopback TCP, keeps ``--calls`` calls synthesising, and
measures at the dock side:

* barge-in: SPEECH_ACTIVE sent -> last audio frame of that call received
  (0 when nothing of that call arrives after the send), p50/p99, plus the
  engine's own STATS (``bargein_mute``: frame read -> call gated;
  ``bargein_stop``: frame read -> synthesis thread finished);
* PONG: PING sent -> PONG received, every 20 ms while all calls synthesise.

Three loads: ``sleep`` (inference waits, e.g. on a GPU: no CPU, no GIL),
``native`` (inference saturates the CPU with the GIL released, like
onnxruntime/torch kernels) and ``python`` (inference burns CPU in pure Python,
holding the GIL: the worst case).
Targets: barge-in p99 <= 20 ms, PONG p99 <= 20 ms.

    python benchmarks/engine_bargein.py [--trials 40] [--calls 4] [--load sleep|native|python|all]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from runtime_helpers import FakeDock, cmd, free_port, spawn_engine  # noqa: E402

from engines.runtime.stats import percentile  # noqa: E402
from protocol import Packet, SpeechActive  # noqa: E402

LONG_TEXT = " ".join(["word"] * 400)


def pct(values: list[float], q: float) -> float:
    return percentile(values, q) * 1000.0


async def run_load(load: str, trials: int, calls: int, pong_seconds: float) -> dict[str, float]:
    dock = FakeDock(ping_every=0)
    await dock.start()
    cmd_port = free_port()
    args = [
        "--dock-port",
        str(dock.port),
        "--cmd-port",
        str(cmd_port),
        "--log-level",
        "WARN",
        "--max-concurrent",
        str(calls + 1),
        "--phrase-ms",
        "200",
        "--delay",
        "0.05",
    ]
    if load != "sleep":
        args += ["--burn", load]
    proc = spawn_engine(*args)
    try:
        s = await dock.session(within=30)
        # background load: `calls` calls speaking long texts, refilled as they finish
        for c in range(1, calls + 1):
            s.send(Packet(c, LONG_TEXT.encode()))
        await s.wait_audio(1, 1, within=30)

        rtts: list[float] = []
        end = time.monotonic() + pong_seconds
        while time.monotonic() < end:
            rtts.append(await s.ping_rtt())
            await asyncio.sleep(0.02)

        bargein: list[float] = []
        late_frames = 0
        for i in range(trials):
            call = 1000 + i
            s.send(Packet(call, LONG_TEXT.encode()))
            await s.wait_audio(call, 1, within=30)
            await asyncio.sleep(random.uniform(0.0, 0.1))
            t0 = time.monotonic()
            s.send(SpeechActive(call))
            await s.ping_rtt()  # the engine has processed SPEECH_ACTIVE by now
            await asyncio.sleep(0.15)
            after = [r.t for r in s.audio(call) if r.t >= t0]
            late_frames += len(after)
            bargein.append(max(after) - t0 if after else 0.0)
        stats = await cmd(cmd_port, "STATS")
    finally:
        await dock.stop()
        proc.kill()
        proc.communicate()
    fields = dict(f.split("=", 1) for f in stats.removeprefix("STATS:").split(":") if "=" in f)
    return {
        "pong_n": len(rtts),
        "pong_p50_ms": pct(rtts, 50),
        "pong_p99_ms": pct(rtts, 99),
        "pong_max_ms": max(rtts) * 1000.0,
        "bargein_n": len(bargein),
        "bargein_p50_ms": pct(bargein, 50),
        "bargein_p99_ms": pct(bargein, 99),
        "bargein_max_ms": max(bargein) * 1000.0,
        "frames_after_speech_active": late_frames,
        "engine_bargein_mute_p50_ms": float(fields.get("bargein_mute_p50_ms", "nan")),
        "engine_bargein_mute_p99_ms": float(fields.get("bargein_mute_p99_ms", "nan")),
        "engine_bargein_stop_p50_ms": float(fields.get("bargein_stop_p50_ms", "nan")),
        "engine_bargein_stop_p99_ms": float(fields.get("bargein_stop_p99_ms", "nan")),
        "engine_packets_suppressed": float(fields.get("packets_suppressed", "nan")),
    }


async def amain(ns: argparse.Namespace) -> int:
    loads = ["sleep", "native", "python"] if ns.load == "all" else [ns.load]
    ok = True
    for load in loads:
        r = await run_load(load, ns.trials, ns.calls, ns.pong_seconds)
        print(f"load={load} calls={ns.calls} (synthesis threads busy the whole time)")
        for k, v in r.items():
            print(f"  {k:32s} {v:10.3f}" if isinstance(v, float) else f"  {k:32s} {v:10d}")
        met = r["bargein_p99_ms"] <= 20 and r["pong_p99_ms"] <= 20
        ok &= met
        print(f"  targets (p99 <= 20 ms): {'met' if met else 'MISSED'}")
    return 0 if ok else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--trials", type=int, default=40, help="barge-ins to measure")
    p.add_argument("--calls", type=int, default=4, help="calls synthesising in the background")
    p.add_argument("--pong-seconds", type=float, default=5.0, help="PONG sampling time")
    p.add_argument("--load", choices=["sleep", "native", "python", "all"], default="all")
    return asyncio.run(amain(p.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
