"""How many concurrent conversations one Kokoro engine serves in real time, through the dock.

``ttsdock serve`` and ``ttsdock kokoro`` run as real processes on free loopback ports
(scripts/demo.py's helpers). This process plays LLaMA and OAP. For each N (default
1, 2, 3, 4, 6) it runs N concurrent calls for ``--seconds`` (default 20; every turn
begun by then is finished), each a conversation:

* a turn is two distinct telephony sentences sent 0.4 s apart;
* the caller answers 1.5-3 s (uniform) after the turn's audio has played out;
* the calls start at random times over the first second (``--stagger S``: over S s;
  the default is a burst, every call's first turn at once);
* texts are never repeated (templates x names x dates x products, shuffled), so the
  prompt cache cannot answer (its hit count is printed to prove it);
* one zero-buffer player per call (``engines.runtime.playback.PlaybackMeter``, the
  runtime's own playback arithmetic): playback starts at a turn's first packet; a
  packet that arrives after everything before it has played out is a gap; a turn
  "has a gap" when one of its gaps is over 50 ms.

Printed per N: TTFA p50/p95 over the turns (first sentence sent -> its first audio
packet at OAP; the second sentence of a turn plays after the first, so its lateness
is a gap, not a TTFA; sentence boundaries in the audio stream come from the
engine's ``utterance_completed`` log lines), the share of turns with a gap, the
engine's own underrun count (STATS); for N > 1 also the TTFA of the turns that
started while another call's turn was in progress (its text sent, its audio not yet
played out) apart from the others, since that is where a start shares the cores.
Then the capacity (largest N, with all smaller ones, with TTFA p95 <= 500 ms and
<= 5 % of turns with a gap) and the physical
limit: the audio seconds the engine makes per wall second (measured in the same
run: 6 calls with long texts at once, so that the engine never waits for a call)
divided by the audio seconds per second the pattern asks of one call (measured in
the N = 1 run: audio / turn cycle).

The limit is printed twice: from the engine's plan (its calibrated throughput on all
cores, ``capacity_audio_s_per_s`` in STATS right after docking) and from the
saturation run; capacity is printed as a share of each. ``--slow [FACTOR]`` runs
everything on an emulated CPU FACTOR (default 2) times slower (``slowdown.py``:
CPU burners pinned to each core, or ``--slow-mode quota``, a cgroup-v1 quota on this
benchmark and the dock and engine it starts, as in a container with a CPU limit).

    python benchmarks/kokoro_capacity.py [--calls 1,2,3,4,6] [--seconds 20]
        [--threads 1] [--synth-workers N] [--models-dir DIR] [--plan NAME]
        [--slow [FACTOR]] [--slow-mode burn|quota] [--rss-every S] [--stagger S]
        [--max-concurrent N]

The engine's RSS is sampled all along and printed by minute with its growth after
minute 5: a soak is one long N, e.g. ``--calls 4 --seconds 1800``.

Before timing, it waits (``--norms-timeout``) until the engine has measured every
voice's statistics, which a new models directory does once in the background
(``voice_stats.py``), and says how long it waited.

Quote numbers from a run under ``flock -x /tmp/ttsdock-cpu.lock`` with the load
average it prints.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for extra in (ROOT, ROOT / "scripts"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

from demo import (  # noqa: E402
    PORT_NAMES,
    CallAudio,
    FakeOap,
    ctl,
    free_port,
    start_processes,
    stop_processes,
    wait_for,
)
from kokoro_ttfa import parse_stats  # noqa: E402
from slowdown import (  # noqa: E402
    add_machine_arguments,
    avx2_emulated,
    engine_plan_arguments,
    reexec_avx2,
    slowed,
)
from voice_stats import add_norms_argument, wait_for_voice_statistics  # noqa: E402

from engines.kokoro.models import default_models_dir  # noqa: E402
from engines.runtime.playback import PlaybackMeter  # noqa: E402
from engines.runtime.schedule import SYNTH_WORKERS  # noqa: E402
from protocol import CallEnd, Packet, encode_frame, encode_mgmt, encode_packet  # noqa: E402
from svc.cli import int_in  # noqa: E402

SAMPLE_RATE = 24000
VOICE = "jf_alpha"
SENTENCE_GAP_S = 0.4  # the second sentence of a turn follows the first this much later
ANSWER_S = (1.5, 3.0)  # the caller answers this long after the audio has played out
GAP_S = 0.05  # a turn "has a gap" when one is longer than this
TTFA_TARGET_MS = 500.0
GAP_SHARE_TARGET = 0.05
LIMIT_SHARE_TARGET = 0.70  # capacity as a share of the physical limit (issue target)
TURN_LIMIT_S = 90.0  # a turn that takes longer than this is a failure
SATURATE_CALLS = 6
SATURATE_S = 20.0
SATURATE_TEXTS = 8  # per call: more audio than the engine makes in SATURATE_S

# -- distinct telephony sentences ------------------------------------------------------

NAMES = [
    "Anna", "Peter", "Maria", "Thomas", "Julia", "Michael", "Laura", "David", "Sophie",
    "Daniel", "Emma", "Lukas", "Hannah", "Jonas", "Clara", "Felix", "Lena", "Paul",
    "Sarah", "Martin", "Nina", "Oliver", "Eva", "Simon",
]  # fmt: skip
SURNAMES = [
    "Miller", "Schmidt", "Fischer", "Weber", "Becker", "Wagner", "Hoffmann", "Koch",
    "Richter", "Klein", "Wolf", "Neumann", "Brown", "Taylor", "Walker", "Wright",
]  # fmt: skip
DAYS = [
    "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday",
    "the third of May", "the twelfth of June", "the first of July", "next Monday",
    "the twentieth of August", "next Thursday",
]  # fmt: skip
HOURS = ["nine", "ten", "eleven", "twelve", "two", "three", "four", "five"]
PRODUCTS = [
    "washing machine", "new router", "office chair", "winter tyres", "coffee maker",
    "phone contract", "garden table", "printer cartridges", "replacement battery",
    "kitchen scale", "reading lamp", "bicycle helmet", "travel insurance", "smart meter",
]  # fmt: skip
DEPARTMENTS = ["billing", "technical support", "returns", "sales", "delivery", "accounts"]
NUMBERS = ["four two seven", "one one nine", "eight three five", "six zero two", "nine one four"]
TEMPLATES = [
    "{name}, your {product} will arrive on {day} between {hour} and {hour2}.",
    "I have moved your appointment with Doctor {surname} to {day} at {hour}.",
    "Thank you, {name}, I have noted your new address on {surname} Street.",
    "Your order ending in {number} for the {product} was shipped on {day}.",
    "The {product} you asked about is back in stock from {day} onwards.",
    "I am sorry, {name}, the {department} team is busy until {hour} today.",
    "Would {day} at {hour} suit you for the engineer to visit, {name}?",
    "Your refund for the {product} was approved on {day}, {name}.",
    "Please hold a moment while I check the {department} schedule for {day}.",
    "{name}, I can offer you a discount on your next {product} order.",
    "The driver will call you about thirty minutes before arriving on {day}.",
    "Mister {surname}, the {department} team will call you back at {hour}.",
    "I can see two open invoices for the {product} on your account, {name}.",
    "Could you spell your last name for me, please, {name}?",
]


def sentence_bank(seed: int) -> list[str]:
    """Many distinct sentences (8-14 words), shuffled; each is used at most once."""
    rng = random.Random(seed)
    out: set[str] = set()
    for t, name, surname, day, hour, product, dept, number in itertools.product(
        TEMPLATES, NAMES[:8], SURNAMES[:4], DAYS[:6], HOURS[:3], PRODUCTS[:6], DEPARTMENTS[:3],
        NUMBERS[:2],
    ):  # fmt: skip
        if len(out) > 60000:
            break
        out.add(
            t.format(
                name=name, surname=surname, day=day, hour=hour, hour2=HOURS[-1],
                product=product, department=dept, number=number,
            )
        )  # fmt: skip
    bank = sorted(out)
    rng.shuffle(bank)
    # spread the templates (the product above varies the last fields fastest)
    return bank


def more_sentences(seed: int, used: set[str], per_template: int = 4000) -> list[str]:
    """Further distinct sentences, none of them in ``used``: each template's fields drawn
    at random from the whole lists (at most ``per_template`` a template; one with few
    fields has fewer), shuffled together. A long soak with many calls outlasts
    ``sentence_bank`` (16 calls used its 1744 sentences in 19 minutes)."""
    rng = random.Random(seed + 1)
    out: list[str] = []
    seen = set(used)
    for t in TEMPLATES:
        found = 0
        for _ in range(4 * per_template):
            if found >= per_template:
                break
            text = t.format(
                name=rng.choice(NAMES), surname=rng.choice(SURNAMES), day=rng.choice(DAYS),
                hour=rng.choice(HOURS), hour2=HOURS[-1], product=rng.choice(PRODUCTS),
                department=rng.choice(DEPARTMENTS), number=rng.choice(NUMBERS),
            )  # fmt: skip
            if text not in seen:
                seen.add(text)
                out.append(text)
                found += 1
    rng.shuffle(out)
    return out


class Sentences:
    """Sentences never repeated in a run: ``sentence_bank``, then ``more_sentences``."""

    def __init__(self, seed: int) -> None:
        bank = sentence_bank(seed)
        # built now: not on the event loop in the middle of a run
        self._it = itertools.chain(bank, more_sentences(seed, set(bank)))
        self.used = 0

    def next(self) -> str:
        text = next(self._it, None)
        if text is None:
            raise RuntimeError(f"ran out of distinct sentences after {self.used}")
        self.used += 1
        return text


# -- one conversation ------------------------------------------------------------------


@dataclass
class Turn:
    sent: list[float]  # send time of each sentence
    first_packet: int  # index into the call's arrivals where the turn's audio starts
    played_out: float = 0.0
    gaps: list[float] = field(default_factory=list)
    next_at: float = 0.0  # when the caller's answer (the next turn) starts


@dataclass
class Conversation:
    call_id: int
    turns: list[Turn] = field(default_factory=list)
    failed: str = ""


class Engine:
    """The engine's STATS, polled by one task and shared by the conversations."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.stats: dict[str, float] = {}
        self.calls: dict[int, tuple[str, int, int]] = {}  # id -> (phase, queued, utterances)
        self.plan = "?"

    async def poll(self) -> None:
        line = await ctl(self.port, "STATS")
        self.stats = parse_stats(line)
        for fld in line.split(":")[1:]:
            if fld.startswith("plan="):
                self.plan = fld[5:]
        calls: dict[int, tuple[str, int, int]] = {}
        for fld in line.split(":")[1:]:
            key, _, value = fld.partition("=")
            if key.startswith("call."):
                parts = value.split(",")
                kv = dict(p.partition("=")[::2] for p in parts[1:])
                calls[int(key[5:])] = (parts[0], int(kv["queued"]), int(kv["utterances"]))
        self.calls = calls

    async def poll_forever(self) -> None:
        while True:
            with contextlib.suppress(OSError):
                await self.poll()
            await asyncio.sleep(0.1)

    def drained(self, call_id: int, utterances: int) -> bool:
        phase, queued, started = self.calls.get(call_id, ("", 1, 0))
        return phase in ("idle", "") and queued == 0 and started >= utterances


async def converse(
    conv: Conversation,
    oap: FakeOap,
    engine: Engine,
    data_w: asyncio.StreamWriter,
    texts: Sentences,
    until: float,
    rng: random.Random,
) -> None:
    audio = oap.calls.setdefault(conv.call_id, CallAudio())
    sent_total = 0
    now = time.monotonic()
    while now < until:
        turn = Turn([], len(audio.arrivals))
        conv.turns.append(turn)
        for i in range(2):
            if i:
                await asyncio.sleep(SENTENCE_GAP_S)
            turn.sent.append(time.monotonic())
            data_w.write(encode_frame(encode_packet(Packet(conv.call_id, texts.next().encode()))))
            await data_w.drain()
            sent_total += 1
        deadline = time.monotonic() + TURN_LIMIT_S

        async def done(n: int = sent_total, first: int = turn.first_packet) -> bool:
            return engine.drained(conv.call_id, n) and len(audio.arrivals) > first

        try:
            await wait_for(done, deadline - time.monotonic(), f"turn of call {conv.call_id}")
        except TimeoutError as exc:
            conv.failed = str(exc)
            return
        await asyncio.sleep(0.15)  # the last packets are through the dock by now
        player = PlaybackMeter()
        for t, samples in audio.arrivals[turn.first_packet :]:
            gap = player.sent(samples, t)
            if gap > 0:
                turn.gaps.append(gap)
        turn.played_out = player.sent_until()
        turn.next_at = turn.played_out + rng.uniform(*ANSWER_S)
        await asyncio.sleep(max(0.0, turn.next_at - time.monotonic()))
        now = time.monotonic()


def utterance_samples(log_path: Path, call_ids: set[int]) -> dict[int, list[int]]:
    """Per call, the sample count of each completed utterance, in order (engine log)."""
    out: dict[int, list[int]] = {c: [] for c in call_ids}
    with open(log_path, errors="replace") as f:
        for line in f:
            if '"utterance_completed"' not in line:
                continue
            with contextlib.suppress(ValueError):
                rec = json.loads(line)
                cid = int(rec.get("call_id", -1))
                if cid in out:
                    out[cid].append(int(rec["samples"]))
    return out


def another_speaks(convs: list[Conversation], call_id: int, at: float) -> bool:
    """Whether another call's turn was in progress at ``at``: its text sent and its audio
    not yet played out (a turn that never played out counts as in progress)."""
    return any(
        t.sent and t.sent[0] <= at < (t.played_out or math.inf)
        for c in convs
        if c.call_id != call_id
        for t in c.turns
    )


@dataclass
class Result:
    n: int
    ttfa_ms: list[float]
    turns: int
    turns_gap: int
    max_gap_ms: float
    underruns: float
    failed: int
    audio_s: float
    cycle_s: float
    #: TTFA of the turns that started while another call's turn was in progress
    ttfa_overlap_ms: list[float] = field(default_factory=list)


def pctl(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, round(q / 100 * (len(s) - 1)))]


async def run_n(
    n: int,
    args: argparse.Namespace,
    base_id: int,
    oap: FakeOap,
    engine: Engine,
    ports: dict[str, int],
    texts: Sentences,
    log_path: Path,
) -> Result:
    _, mgmt_w = await asyncio.open_connection("127.0.0.1", ports["llama_mgmt"])
    _, data_w = await asyncio.open_connection("127.0.0.1", ports["llama_data"])
    await engine.poll()
    under0 = engine.stats.get("underruns", 0.0)
    rng = random.Random(args.seed + n)
    convs = [Conversation(base_id + i) for i in range(n)]
    until = time.monotonic() + args.seconds
    starts = []
    for c in convs:  # calls start at random over the first ``--stagger`` seconds
        starts.append(asyncio.create_task(_later(rng.uniform(0, args.stagger), c, oap, engine,
                                                 data_w, texts, until, rng)))  # fmt: skip
    await asyncio.gather(*starts)
    await engine.poll()
    underruns = engine.stats.get("underruns", 0.0) - under0
    for c in convs:
        mgmt_w.write(encode_frame(encode_mgmt(CallEnd(c.call_id))))
    await mgmt_w.drain()
    for w in (mgmt_w, data_w):
        w.close()
    samples = utterance_samples(log_path, {c.call_id for c in convs})
    ttfa: list[float] = []
    overlap: list[float] = []
    turns = turns_gap = failed = 0
    max_gap = 0.0
    audio_s = cycle_s = 0.0
    for c in convs:
        failed += bool(c.failed)
        arrivals = oap.calls.get(c.call_id, CallAudio()).arrivals
        starts_at: dict[int, float] = {}  # sample offset -> arrival of the packet there
        off = 0
        for t, s in arrivals:
            starts_at.setdefault(off, t)
            off += s
        sends = [t for turn in c.turns for t in turn.sent]
        off = 0
        for k, s in enumerate(samples[c.call_id]):
            # the caller waits for a turn's first sentence; the second one follows the
            # first's audio, and when it is late that is a gap (counted below)
            if k % 2 == 0 and k < len(sends) and off in starts_at:
                ttfa.append((starts_at[off] - sends[k]) * 1000)
                if another_speaks(convs, c.call_id, sends[k]):
                    overlap.append(ttfa[-1])
            off += s
        for turn in c.turns:
            if not turn.played_out:
                continue
            turns += 1
            turns_gap += any(g > GAP_S for g in turn.gaps)
            max_gap = max([max_gap, *turn.gaps])
            cycle_s += turn.next_at - turn.sent[0]
        audio_s += sum(samples[c.call_id]) / SAMPLE_RATE
    return Result(
        n, ttfa, turns, turns_gap, max_gap * 1000, underruns, failed, audio_s, cycle_s, overlap
    )


async def _later(delay: float, *a: object) -> None:
    await asyncio.sleep(delay)
    await converse(*a)  # type: ignore[arg-type]


async def saturate(
    base_id: int, oap: FakeOap, engine: Engine, ports: dict[str, int], texts: Sentences
) -> float:
    """Audio seconds per wall second with more work queued than the engine can do."""
    _, mgmt_w = await asyncio.open_connection("127.0.0.1", ports["llama_mgmt"])
    _, data_w = await asyncio.open_connection("127.0.0.1", ports["llama_data"])
    ids = [base_id + i for i in range(SATURATE_CALLS)]
    for cid in ids:
        for _ in range(SATURATE_TEXTS):
            data_w.write(encode_frame(encode_packet(Packet(cid, texts.next().encode()))))
    await data_w.drain()
    await asyncio.sleep(2.0)  # past the first units
    await engine.poll()
    a0, t0 = engine.stats.get("audio_s_sent", 0.0), time.monotonic()
    await asyncio.sleep(SATURATE_S)
    await engine.poll()
    a1, t1 = engine.stats.get("audio_s_sent", 0.0), time.monotonic()
    for cid in ids:
        mgmt_w.write(encode_frame(encode_mgmt(CallEnd(cid))))
    await mgmt_w.drain()
    for w in (mgmt_w, data_w):
        w.close()
    await asyncio.sleep(1.0)
    return (a1 - a0) / (t1 - t0)


async def main_async(args: argparse.Namespace) -> int:
    ports = {name: free_port() for name in PORT_NAMES}
    oap = FakeOap()
    servers = [
        await asyncio.start_server(oap.on_mgmt, "127.0.0.1", ports["oap_mgmt"]),
        await asyncio.start_server(oap.on_data, "127.0.0.1", ports["oap_data"]),
    ]
    log_dir = Path(args.log_dir)
    mdir = args.models_dir or default_models_dir()
    engine_args = [
        "--models-dir", str(mdir),
        "--voice", VOICE,
        "--threads", str(args.threads),
        "--max-concurrent", str(args.max_concurrent),
    ]  # fmt: skip
    if args.synth_workers is not None:
        engine_args += ["--synth-workers", str(args.synth_workers)]
    engine_args += engine_plan_arguments(args)
    with contextlib.ExitStack() as stack:
        print(stack.enter_context(slowed(args.slow_mode, args.slow)), flush=True)
        procs = await asyncio.to_thread(start_processes, log_dir, ports, engine_args)
        return await _measure(args, ports, oap, servers, procs, log_dir)


def rss_mb(pid: int) -> float:
    """Resident set of a process now (``VmRSS``), in MB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


async def sample_rss(pid: int, every: float, out: list[tuple[float, float]]) -> None:
    t0 = time.monotonic()
    while True:
        with contextlib.suppress(OSError):
            out.append((time.monotonic() - t0, rss_mb(pid)))
        await asyncio.sleep(every)


async def _measure(
    args: argparse.Namespace,
    ports: dict[str, int],
    oap: FakeOap,
    servers: list[asyncio.Server],
    procs: list[subprocess.Popen[bytes]],
    log_dir: Path,
) -> int:
    poller: asyncio.Task[None] | None = None
    rss: list[tuple[float, float]] = []
    sampler: asyncio.Task[None] | None = None
    try:

        async def docked() -> bool:
            for p, name in zip(procs, ("dock", "kokoro"), strict=True):
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited with status {p.returncode}; see its log")
            return (await ctl(ports["cmd"], "STATUS")).startswith("ACTIVE")

        t_start = time.monotonic()
        await wait_for(docked, 180, "the Kokoro engine to dock")
        await asyncio.wait_for(oap.data_connected.wait(), 10)
        print(f"engine docked after {time.monotonic() - t_start:.1f} s (load + warm-up)")
        engine = Engine(ports["engine_cmd"])

        async def engine_stats() -> dict[str, float]:
            await engine.poll()
            return engine.stats

        print(await wait_for_voice_statistics(engine_stats, args.norms_timeout), flush=True)
        plan_rate = engine.stats.get("capacity_audio_s_per_s", float("nan"))
        plan = engine.plan
        print(f"engine plan {plan}: {plan_rate:.2f} audio s per wall s on all cores", flush=True)
        poller = asyncio.create_task(engine.poll_forever())
        sampler = asyncio.create_task(sample_rss(procs[1].pid, args.rss_every, rss))
        texts = Sentences(args.seed)
        results: list[Result] = []
        for k, n in enumerate(args.calls):
            r = await run_n(n, args, 1000 * (k + 1), oap, engine, ports, texts,
                            log_dir / "kokoro.log")  # fmt: skip
            results.append(r)
            print(
                f"N={n}: {len(r.ttfa_ms)} turns timed, TTFA p50 {pctl(r.ttfa_ms, 50):.0f} ms "
                f"p95 {pctl(r.ttfa_ms, 95):.0f} ms; turns {r.turns}, with a gap > 50 ms "
                f"{r.turns_gap} ({r.turns_gap / max(r.turns, 1):.0%}), max gap "
                f"{r.max_gap_ms:.0f} ms; engine underruns {r.underruns:.0f}"
                + (f"; {r.failed} calls FAILED" if r.failed else ""),
                flush=True,
            )
            if n > 1:
                print(f"  {overlap_line(r)}", flush=True)
            await asyncio.sleep(1.0)
        rate = await saturate(1000 * (len(args.calls) + 1), oap, engine, ports, texts)
        await engine.poll()
        hits = engine.stats.get("synth.prompt_cache_hits", float("nan"))
        report(args, results, rate, hits, plan_rate, plan)
        print_rss(rss)
        print_caches(engine.stats)
        return 0
    finally:
        for task in (poller, sampler):
            if task is not None:
                task.cancel()
        await asyncio.to_thread(stop_processes, procs)
        for s in servers:
            s.close()


def overlap_line(r: Result) -> str:
    """TTFA of the turns that started while another call spoke, and of the others."""
    alone = list(r.ttfa_ms)
    for x in r.ttfa_overlap_ms:
        alone.remove(x)
    return (
        f"turns started while another call spoke: {len(r.ttfa_overlap_ms)}, TTFA p50 "
        f"{pctl(r.ttfa_overlap_ms, 50):.0f} ms p95 {pctl(r.ttfa_overlap_ms, 95):.0f} ms; "
        f"the others: {len(alone)}, p50 {pctl(alone, 50):.0f} ms p95 {pctl(alone, 95):.0f} ms"
    )


def report(
    args: argparse.Namespace,
    results: list[Result],
    rate: float,
    hits: float,
    plan_rate: float,
    plan: str,
) -> None:
    print()
    print(
        f"threads {args.threads}, synth-workers {args.synth_workers or 'engine default'}, "
        f"plan {plan}, "
        f"{args.seconds:.0f} s per N, calls started over {args.stagger:g} s, "
        f"max-concurrent {args.max_concurrent}; "
        f"prompt cache hits {hits:.0f}; "
        + (f"slowed x{args.slow:g} ({args.slow_mode})" if args.slow > 1 else "not slowed")
    )
    print(f"{'N':>3} {'timed':>5} {'ttfa_p50':>9} {'ttfa_p95':>9} {'turns':>6} {'gap%':>6} "
          f"{'maxgap':>7} {'underruns':>9}  ok")  # fmt: skip
    capacity = 0
    chain = True
    for r in results:
        share = r.turns_gap / max(r.turns, 1)
        ok = (
            not r.failed
            and r.turns > 0
            and pctl(r.ttfa_ms, 95) <= TTFA_TARGET_MS
            and share <= GAP_SHARE_TARGET
        )
        chain = chain and ok
        if chain:
            capacity = r.n
        print(
            f"{r.n:3d} {len(r.ttfa_ms):5d} {pctl(r.ttfa_ms, 50):9.0f} {pctl(r.ttfa_ms, 95):9.0f} "
            f"{r.turns:6d} {share:6.0%} {r.max_gap_ms:7.0f} {r.underruns:9.0f}  "
            f"{'yes' if ok else 'no'}"
        )
    few = few_turns_line(results)
    if few:
        print(few)
    one = next((r for r in results if r.n == 1 and r.cycle_s > 0), None)
    demand = one.audio_s / one.cycle_s if one is not None else float("nan")
    print()
    print(
        f"capacity: {capacity} concurrent calls (TTFA p95 <= {TTFA_TARGET_MS:.0f} ms and <= "
        f"{GAP_SHARE_TARGET:.0%} of turns with a gap > {GAP_S * 1000:.0f} ms, for N and every "
        "smaller N)"
    )
    limit = plan_rate / demand
    print(
        f"physical limit (plan): {plan_rate:.2f} audio s per wall s on all cores / {demand:.2f} "
        f"audio s per s asked by one call (N=1 run) = {limit:.2f} calls; capacity "
        f"{capacity} = {capacity / limit:.0%} of it"
    )
    print(
        f"physical limit (measured): {rate:.2f} audio s per wall s (engine saturated) / "
        f"{demand:.2f} = {rate / demand:.2f} calls; capacity {capacity} = "
        f"{capacity / (rate / demand):.0%} of it"
    )
    if math.isfinite(limit) and plan_rate > 0:
        print(share_needs(limit, demand, plan_rate))
    print("load average (1/5/15 min) at the end: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))


def few_turns_line(results: list[Result]) -> str:
    """A warning for the N whose turns are too few for the gap rule to allow one gapped
    turn (under ``1 / GAP_SHARE_TARGET``): there one gap fails the N, so the capacity of
    a short run says less than it seems; empty when every N had enough."""
    least = math.ceil(1 / GAP_SHARE_TARGET)
    few = [r for r in results if 0 < r.turns < least]
    if not few:
        return ""
    ns = ", ".join(f"N={r.n} ({r.turns})" for r in few)
    return (
        f"too few turns for the gap rule: {ns}; one gapped turn is over "
        f"{GAP_SHARE_TARGET:.0%} below {least} turns (--seconds longer tells N from N+1)"
    )


def share_needs(limit: float, demand: float, rate: float) -> str:
    """What ``LIMIT_SHARE_TARGET`` of the limit asks of the engine: capacity is a whole
    number of calls, so the target needs ``ceil(share * limit)`` of them, and those ask
    ``calls * demand`` audio s per s on average (as a share of ``rate``, the engine's
    utilisation) and ``calls`` while all of them speak at once."""
    calls = max(1, math.ceil(LIMIT_SHARE_TARGET * limit))
    return (
        f"{LIMIT_SHARE_TARGET:.0%} of the limit (plan) needs a capacity of {calls}: "
        f"{calls} call(s) ask {calls * demand:.2f} audio s per s on average "
        f"({calls * demand / rate:.0%} of the plan's {rate:.2f}) and {calls} "
        f"({calls / rate:.0%}) while all of them speak"
    )


def print_rss(rss: list[tuple[float, float]]) -> None:
    """The engine's RSS over the run, and its growth after minute 5 (soak runs).

    The RSS follows the runs in progress (the engine returns an inference's memory when
    it ends), so one sample says little: growth is read on the median and the floor
    (lowest sample) of each 5-minute block, from the block starting at minute 5 to the
    last full one."""
    if not rss:
        return
    print("engine RSS (MB) by minute: " + ", ".join(
        f"{t / 60:.0f}:{mb:.0f}" for t, mb in rss if t % 60 < rss_step(rss)))  # fmt: skip
    blocks: dict[int, list[float]] = {}
    for t, mb in rss:
        if t >= 300:
            blocks.setdefault(int(t // 300), []).append(mb)
    end = rss[-1][0]
    full = {b: v for b, v in blocks.items() if (b + 1) * 300 <= end + rss_step(rss)}
    if len(full) >= 2:
        first, last = full[min(full)], full[max(full)]
        rows = ", ".join(
            f"{b * 5}-{b * 5 + 5} min {statistics.median(v):.0f}/{min(v):.0f}"
            for b, v in sorted(full.items())
        )
        med0, med1 = statistics.median(first), statistics.median(last)
        lo0, lo1 = min(first), min(last)
        print(f"RSS median/floor by 5-minute block: {rows}")
        print(
            f"RSS growth after minute 5 (median of the first block -> the last): "
            f"{med0:.0f} -> {med1:.0f} MB ({(med1 - med0) / med0:+.1%}); floor "
            f"{lo0:.0f} -> {lo1:.0f} MB ({(lo1 - lo0) / lo0:+.1%}); "
            f"max {max(mb for t, mb in rss if t >= 300):.0f} MB"
        )


def print_caches(stats: dict[str, float]) -> None:
    """What the engine holds besides the runs in progress: its prompt cache (bounded in
    MB), how often it gave glibc's freed pages back (backend Rule 3), and the units it
    gave back to another call's start (runtime pool Rule 4) with the compute they lost."""
    nan = float("nan")
    trims = stats.get("synth.heap_trims", nan)
    each = stats.get("synth.heap_trim_ms_total", nan) / trims if trims else 0.0
    recalled = stats.get("synth.units_recalled", nan)
    lost = stats.get("synth.recalled_ms_total", nan) / 1000
    print(
        f"engine at the end: prompt cache {stats.get('synth.prompt_cache_mb', nan):.1f} MB in "
        f"{stats.get('synth.prompt_cache_entries', nan):.0f} entries; heap trims {trims:.0f} "
        f"({each:.1f} ms each); units recalled for a start {recalled:.0f} ({lost:.1f} s "
        "of compute lost)"
    )


def rss_step(rss: list[tuple[float, float]]) -> float:
    return rss[1][0] - rss[0][0] if len(rss) > 1 else 60.0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--calls", default="1,2,3,4,6", help="comma-separated N to run")
    p.add_argument("--seconds", type=float, default=20.0, help="conversation time per N")
    p.add_argument(
        "--threads", type=int, default=1, help="Kokoro --threads (intra-op; engine default 1)"
    )
    p.add_argument(
        "--synth-workers",
        type=int,
        default=None,
        help=f"engine --synth-workers (default: the engine's own, one per core it may use; "
        f"{SYNTH_WORKERS} here unslowed)",
    )
    p.add_argument("--models-dir", type=Path, default=None)
    add_machine_arguments(p)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument(
        "--max-concurrent",
        type=int_in(1, None, "--max-concurrent"),
        default=None,
        help="engine --max-concurrent (default: the largest N, at least 8)",
    )
    p.add_argument(
        "--stagger",
        type=float,
        default=1.0,
        help="calls start at random times over the first S s (default 1: a burst, every "
        "call's first turn at once; about one turn cycle, e.g. 10, starts independent "
        "calls at random phases)",
    )
    p.add_argument(
        "--rss-every", type=float, default=10.0, help="sample the engine's RSS every S s"
    )
    p.add_argument("--log-dir", default="out/kokoro_capacity", help="dock.log, kokoro.log")
    add_norms_argument(p)
    args = p.parse_args(argv)
    if args.avx2:
        reexec_avx2()
    print(f"instruction set: {'AVX2 only (emulated)' if avx2_emulated() else 'native'}")
    try:
        args.calls = [int(x) for x in args.calls.split(",") if x.strip()]
    except ValueError:
        p.error("--calls takes comma-separated integers")
    if not args.calls or min(args.calls) < 1:
        p.error("--calls needs N >= 1")
    if args.max_concurrent is None:
        args.max_concurrent = max(8, max(args.calls))
    print(f"load average at start {os.getloadavg()[0]:.2f}")
    try:
        return asyncio.run(main_async(args))
    except (TimeoutError, RuntimeError) as exc:
        print(f"capacity run failed: {exc} (logs in {args.log_dir})", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
