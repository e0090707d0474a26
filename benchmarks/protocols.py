"""Protocol listeners under the real Kokoro engine: first audio over HTTP vs over the dock,
and keepalive PONG / cmd-port PING latency while N HTTP streams run.

Starts ``ttsdock kokoro`` as a process docked into a fake dock (tests/runtime_helpers.py,
which sends PINGs and times the PONGs) with ``--http-port``, then:

1. first audio for the same sentence, alternating: the dock path (text Packet sent ->
   first audio frame read at the dock) and HTTP (``openai`` streaming request sent ->
   first audio bytes read by the client), ``--repeats`` times each;
2. ``--streams`` concurrent streaming HTTP requests (the official ``openai`` client)
   while the dock PINGs the engine every 20 ms and netcat-style PINGs go to the cmd port:
   PONG round trips p50/p99/max, cmd PING p50/p99, stream TTFA and real-time factor.

    python benchmarks/protocols.py [--repeats 3] [--streams 8] [--models-dir models]

Nothing is asserted; it prints numbers (and ``uptime``'s load average).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from runtime_helpers import FakeDock, cmd, free_port  # noqa: E402

from svc.stats import percentile  # noqa: E402

SENTENCE = "Thank you for calling {}, how can I help you today?"
NAMES = ["Anna", "Ben", "Clara", "David", "Emma", "Felix", "Greta", "Hugo", "Ida", "Jonas"]
LONG = "Your appointment with doctor {} is confirmed for Tuesday at ten in the morning."


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def ms(values: list[float], q: float) -> float:
    return round(percentile(values, q) * 1000, 1)


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--models-dir", default=str(ROOT / "models"))
    ap.add_argument("--threads", default="1")
    args = ap.parse_args()
    import openai

    dock = FakeDock(ping_every=0)
    await dock.start()
    http_port, cmd_port = free_port(), free_port()
    n = args.streams
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ttsdock", "kokoro",
        "--dock-port", str(dock.port), "--cmd-port", str(cmd_port),
        "--models-dir", args.models_dir, "--threads", args.threads,
        "--http-port", str(http_port), "--log-level", "WARN",
        "--max-concurrent", str(n + 2), "--protocol-max-requests", str(n),
        "--protocol-min-headroom", "0",  # all N streams run, whatever the load meter says
        env={**os.environ, "PYTHONPATH": str(ROOT), "TTSDOCK_SYNTH_NICE": "0"},
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        sess = await dock.session(within=180)
        pongs: list[float] = []
        measuring = asyncio.Event()
        stop = asyncio.Event()

        async def pinger() -> None:  # the dock's keepalive, timed (recorded while measuring)
            while not stop.is_set():
                rtt = await sess.ping_rtt()
                if measuring.is_set():
                    pongs.append(rtt)
                await asyncio.sleep(0.02)

        keepalive = asyncio.ensure_future(pinger())
        client = openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{http_port}/v1", api_key="x", max_retries=0
        )

        async def http_first(text: str) -> tuple[float, float, int]:
            t0 = time.perf_counter()
            first = None
            total = 0
            async with client.audio.speech.with_streaming_response.create(
                model="kokoro", input=text, voice="jf_alpha", response_format="pcm",
                extra_body={"stream": True},
            ) as resp:  # fmt: skip
                async for chunk in resp.iter_bytes():
                    if first is None:
                        first = time.perf_counter() - t0
                    total += len(chunk)
            return first or 0.0, time.perf_counter() - t0, total

        async def idle() -> None:
            while True:
                f = dict(
                    kv.split("=", 1)
                    for kv in (await cmd(cmd_port, "STATS")).split(":")
                    if "=" in kv
                )
                if f["syntheses_running"] == "0" and f["sched_open"] == "0":
                    return
                await asyncio.sleep(0.1)

        async def dock_first(call_id: int, text: str) -> float:
            t0 = time.perf_counter()
            sess.text(call_id, text)
            await sess.wait_audio(call_id, 1, within=60)
            return time.perf_counter() - t0

        await http_first("Warm up.")
        # every text differs (names), so no cache of the engine's can serve a repeat; each
        # pair speaks the same sentence, once over the dock and once over HTTP, the order
        # alternating
        print(f"load before: {load()}")
        d_ttfa, h_ttfa = [], []
        for i in range(args.repeats):
            for path in ("dock", "http") if i % 2 == 0 else ("http", "dock"):
                text = SENTENCE.format(NAMES[i % len(NAMES)] + " " + path)
                if path == "dock":
                    d_ttfa.append(await dock_first(100 + i, text))
                else:
                    h_ttfa.append((await http_first(text))[0])
                await idle()  # the utterance is complete: the next run starts on an idle engine
        print(
            f"first audio, same sentence ({len(SENTENCE)} chars), {args.repeats} each: "
            f"dock p50 {statistics.median(d_ttfa) * 1000:.0f} ms "
            f"({', '.join(f'{x * 1000:.0f}' for x in d_ttfa)}), "
            f"HTTP p50 {statistics.median(h_ttfa) * 1000:.0f} ms "
            f"({', '.join(f'{x * 1000:.0f}' for x in h_ttfa)})"
        )

        pings: list[float] = []

        async def cmd_pinger() -> None:
            while measuring.is_set() and not stop.is_set():
                t0 = time.perf_counter()
                assert await cmd(cmd_port, "PING") == "PONG"
                pings.append(time.perf_counter() - t0)
                await asyncio.sleep(0.1)

        measuring.set()
        tasks = [keepalive, asyncio.ensure_future(cmd_pinger())]
        t0 = time.perf_counter()
        results = await asyncio.gather(*(http_first(LONG.format(NAMES[i])) for i in range(n)))
        wall = time.perf_counter() - t0
        stop.set()
        await asyncio.gather(*tasks)
        audio_s = sum(r[2] for r in results) / 2 / 24000
        print(
            f"{n} concurrent HTTP streams ({len(LONG)} chars each): wall {wall:.1f} s, "
            f"audio {audio_s:.1f} s in all ({audio_s / wall:.2f} s of audio per s), "
            f"stream TTFA p50 {ms([r[0] for r in results], 50)} ms "
            f"max {ms([r[0] for r in results], 100)} ms; "
            f"dock PING->PONG n={len(pongs)} p50 {ms(pongs, 50)} ms p99 {ms(pongs, 99)} ms "
            f"max {ms(pongs, 100)} ms; cmd-port PING n={len(pings)} p50 {ms(pings, 50)} ms "
            f"p99 {ms(pings, 99)} ms"
        )
        print(f"load after: {load()}")
    finally:
        proc.terminate()
        await proc.wait()
        await dock.stop()


if __name__ == "__main__":
    asyncio.run(main())
