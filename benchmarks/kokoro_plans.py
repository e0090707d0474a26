"""Kokoro graph variants (``engines/kokoro/graph_variants.py``): numerics and speed, interleaved.

A *plan* is a graph variant plus session options (``PLANS``). For each plan it
builds the split stages from the shipped int8 model, then

* **numerics**: decodes whole sentences from the *int8* prosody output with each
  plan's decoder and compares with the shipped int8 decoder and with the fp32
  (dequantised) decoder: max abs diff, log-magnitude spectrogram distance (mean
  abs difference of log10(|STFT| + 1e-5), n_fft 1024, hop 256, Hann) and SNR;
  and the prosody stage's durations vs int8;
* **speed**: decoder compute per second of kept audio for windows of W frames
  (+ ``--context`` frames each side, as the engine decodes) and for whole
  sentences, and the prosody stage per sentence, for each intra-op thread
  count; plans are interleaved inside every repetition and the median is
  reported (the box is shared: compare ratios within one run).

Slow-box emulation: ``--avx2`` re-runs itself with ``benchmarks/cpuid_avx2.c``
preloaded (CPUID faulting hides AVX-512/AMX/AVX-VNNI, so MLAS picks its AVX2
kernels; ONNX Runtime has no run-time switch for that). ``--cpu-quota 1.0``
puts the process in a cgroup-v1 CPU quota of that many CPUs (needs root).

Measured (2026-12-02, "Intel(R) Xeon(R) Processor", 2 vCPU, AVX-512+VNNI+AMX, load 7-12 on
the shared box; 1 thread; native and AVX2 processes run at the same time (w64/w200 one such
pair, w32/w120 another), median of 3-4, ms per
second of kept audio; ratio to int8 in brackets):

    plan          native w32/w64/w120/w200                 AVX2 shim w32/w64/w120/w200
    int8          7800 / 5144 / 6675 / 5055                7666 / 6781 / 7231 / 5323
    fp32          5851 (.75) / 4575 (.89) / 5769 (.86) / 4534 (.90)
                                      11478 (1.50) / 7836 (1.16) / 7271 (1.01) / 5710 (1.07)
    fp32_conv2d   6067 (.78) / 4446 (.86) / 4848 (.73) / 3677 (.73)
                                       9601 (1.25) / 6692 (0.99) / 7430 (1.03) / 3727 (0.70)

Numerics: fp32 vs int8 log-spectral distance 0.20, SNR 13.5 dB (the model's own
precision); fp32_conv2d vs fp32 SNR 109 dB (exact).

    python benchmarks/kokoro_plans.py [--threads 1,2] [--windows 32,64,120,200]
        [--plans int8,fp32,fp32_conv2d] [--reps 5] [--whole 0,1,2] [--avx2]
        [--cpu-quota 1.0] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from engines.kokoro.frontend import FrontEnd, Vocab  # noqa: E402
from engines.kokoro.graph_split import split_sources  # noqa: E402
from engines.kokoro.graph_variants import build_stage, session_options  # noqa: E402
from engines.kokoro.models import (  # noqa: E402
    assemble_default_model,
    default_models_dir,
    load_default_voices,
    load_vocab,
)
from engines.kokoro.plans import stage_outputs  # noqa: E402

F32 = npt.NDArray[np.float32]
SAMPLES_PER_FRAME = 600
SR = 24000
SENTENCES = (
    "Hello, how can I help you today?",
    "Your appointment is confirmed for Tuesday at half past three.",
    "Thank you for calling the city library; our opening hours today are from nine in the "
    "morning until six in the evening, and on Saturdays from ten until two.",
)


@dataclass(frozen=True)
class Plan:
    """A graph variant and the session options it runs with (``session_options``)."""

    variant: str
    opt_level: str = "all"
    denormal_as_zero: bool = False
    mem_pattern: bool = True


PLANS: dict[str, Plan] = {
    "int8": Plan("int8"),
    "int8_ext": Plan("int8", opt_level="extended"),
    "fp32": Plan("fp32"),
    "fp32_ext": Plan("fp32", opt_level="extended"),
    "fp32_daz": Plan("fp32", denormal_as_zero=True),
    "fp32_conv2d": Plan("fp32_conv2d"),
    "fp32_conv2d_ext": Plan("fp32_conv2d", opt_level="extended"),
    "fp32_conv2d_nopat": Plan("fp32_conv2d", mem_pattern=False),
}


def make_session(data: bytes, plan: Plan, threads: int) -> Any:
    import onnxruntime as ort

    opts = session_options(
        threads,
        opt_level=plan.opt_level,
        denormal_as_zero=plan.denormal_as_zero,
        mem_pattern=plan.mem_pattern,
    )
    return ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])


def tokens_of(fe: FrontEnd, text: str) -> list[int]:
    toks: list[int] = []
    for w in fe.phonemes(text).words:
        if toks:
            toks.append(16)
        toks += list(w.tokens)
    return toks


def log_spec(x: F32, n_fft: int = 1024, hop: int = 256) -> npt.NDArray[np.float64]:
    x = np.pad(x.astype(np.float64), (n_fft // 2, n_fft // 2))
    n = 1 + (len(x) - n_fft) // hop
    frames = np.lib.stride_tricks.as_strided(
        x, (n, n_fft), (x.strides[0] * hop, x.strides[0]), writeable=False
    )
    return np.log10(np.abs(np.fft.rfft(frames * np.hanning(n_fft), axis=1)) + 1e-5)


def compare(a: F32, ref: F32) -> dict[str, float]:
    n = min(len(a), len(ref))
    a, ref = a[:n], ref[:n]
    err = np.sum((a.astype(np.float64) - ref) ** 2)
    snr = 10 * np.log10(np.sum(ref.astype(np.float64) ** 2) / max(err, 1e-30))
    lsd = float(np.mean(np.abs(log_spec(a) - log_spec(ref))))
    return {"max_abs": float(np.max(np.abs(a - ref))), "logspec": lsd, "snr_db": float(snr)}


def machine() -> dict[str, str]:
    model = "?"
    flags: set[str] = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
    cls = "AVX2"
    if "avx512f" in flags:
        cls = "AVX-512" + ("+VNNI" if "avx512_vnni" in flags else "")
        cls += "+AMX" if "amx_int8" in flags else ""
    if os.environ.get("KOKORO_PLANS_AVX2"):
        cls = f"AVX2 emulated (CPUID shim; host {cls})"
    quota = os.environ.get("KOKORO_PLANS_QUOTA")
    if quota:
        cls += f", cgroup quota {quota} CPU"
    return {
        "model": model,
        "class": cls,
        "load": os.getloadavg().__repr__(),
        "cpus": str(os.cpu_count()),
    }


def enter_cgroup(cpus: float) -> None:
    base = Path("/sys/fs/cgroup/cpu/slowbench")
    base.mkdir(exist_ok=True)
    (base / "cpu.cfs_period_us").write_text("100000")
    (base / "cpu.cfs_quota_us").write_text(str(int(cpus * 100000)))
    (base / "cgroup.procs").write_text(str(os.getpid()))
    os.environ["KOKORO_PLANS_QUOTA"] = str(cpus)


def reexec_avx2() -> None:
    src = Path(__file__).with_name("cpuid_avx2.c")
    lib = Path(tempfile.gettempdir()) / "kokoro_cpuid_avx2.so"
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    env = dict(os.environ, LD_PRELOAD=str(lib), KOKORO_PLANS_AVX2="1")
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


def timed(session: Any, feeds: dict[str, Any]) -> float:
    t = time.perf_counter()
    session.run(None, feeds)
    return time.perf_counter() - t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", default="1,2")
    p.add_argument("--windows", default="32,64,120,200")
    p.add_argument("--plans", default="int8,fp32,fp32_conv2d")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--context", type=int, default=10)
    p.add_argument("--no-numerics", action="store_true")
    p.add_argument("--whole", default="0", help="sentences timed whole (indices; '' = none)")
    p.add_argument("--no-prosody", action="store_true", help="skip prosody-stage timing")
    p.add_argument("--avx2", action="store_true", help="emulate an AVX2-only CPU")
    p.add_argument("--cpu-quota", type=float, default=0.0, help="cgroup v1 CPU quota (CPUs)")
    p.add_argument("--models-dir", type=Path, default=None)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    if args.avx2 and not os.environ.get("KOKORO_PLANS_AVX2"):
        reexec_avx2()
    if args.cpu_quota > 0:
        enter_cgroup(args.cpu_quota)
    threads = [int(x) for x in args.threads.split(",")]
    windows = [int(x) for x in args.windows.split(",")]
    plans = {n: PLANS[n] for n in args.plans.split(",")}
    info = machine()
    print(f"# cpu: {info['model']} [{info['class']}], {info['cpus']} vCPU, load {info['load']}")

    model = assemble_default_model(args.models_dir or default_models_dir())
    graphs = split_sources(model)
    assert graphs is not None, "graph cannot be split"
    variants = sorted({pl.variant for pl in plans.values()} | {"int8", "fp32"})
    stages: dict[str, dict[str, bytes]] = {"prosody": {}, "decoder": {}}
    build_s: dict[str, float] = {}
    for v in variants:
        t = time.perf_counter()
        stages["decoder"][v] = build_stage(graphs.decoder, v)
        build_s[v] = time.perf_counter() - t
        if not args.no_prosody or v == "int8" or (v == "fp32" and not args.no_numerics):
            stages["prosody"][v] = build_stage(graphs.prosody, v)
    print("# variant build s (decoder):", {v: round(s, 2) for v, s in build_s.items()})

    fe = FrontEnd(Vocab(load_vocab()))
    voice = load_default_voices()["jf_alpha"]
    feeds_p: list[dict[str, Any]] = []
    for text in SENTENCES:
        toks = tokens_of(fe, text)
        style = np.asarray(voice[len(toks) - 1], np.float32).reshape(1, -1)
        feeds_p.append(
            {
                "tokens": np.array([[0, *toks, 0]], np.int64),
                "style": style,
                "speed": np.array([1.0], np.float32),
            }
        )
    pros = [  # the shipped prosody and frame stages, the whole sentence
        stage_outputs(graphs.prosody, graphs.frame, tokens_of(fe, text), f["style"], threads=2)
        for text, f in zip(SENTENCES, feeds_p, strict=True)
    ]

    def dec_feeds(i: int, a: int, b: int) -> dict[str, Any]:
        pr = pros[i]
        return {
            "features": np.ascontiguousarray(pr["features"][:, :, 2 * a : 2 * b]),
            "f0": np.ascontiguousarray(pr["f0"][:, 2 * a : 2 * b]),
            "phase": np.ascontiguousarray(pr["phase"][:, 2 * a : 2 * b, :]),
            "style": feeds_p[i]["style"],
        }

    frames = [int(pr["features"].shape[2]) // 2 for pr in pros]
    print("# sentences (frames):", frames)
    results: dict[str, Any] = {"machine": info, "frames": frames, "numerics": {}, "speed": {}}

    if not args.no_numerics:
        sess = {n: make_session(stages["decoder"][pl.variant], pl, 2) for n, pl in plans.items()}
        fp32 = make_session(stages["decoder"]["fp32"], PLANS["fp32"], 2)
        int8 = sess.get("int8") or make_session(stages["decoder"]["int8"], PLANS["int8"], 2)
        print("\n## numerics: whole sentences decoded from the int8 prosody (worst of sentences)")
        print(f"{'plan':<20} {'vs':<5} {'max_abs':>8} {'logspec':>8} {'snr_db':>7}")
        rows: dict[str, dict[str, list[dict[str, float]]]] = {}
        for i in range(len(SENTENCES)):
            f = dec_feeds(i, 0, frames[i])
            r8 = int8.run(None, f)[0].reshape(-1)
            r32 = fp32.run(None, f)[0].reshape(-1)
            for n, s in sess.items():
                out = s.run(None, f)[0].reshape(-1)
                rows.setdefault(n, {}).setdefault("int8", []).append(compare(out, r8))
                rows[n].setdefault("fp32", []).append(compare(out, r32))
        for n, by in rows.items():
            for ref, lst in by.items():
                worst = {
                    "max_abs": max(d["max_abs"] for d in lst),
                    "logspec": max(d["logspec"] for d in lst),
                    "snr_db": min(d["snr_db"] for d in lst),
                }
                results["numerics"][f"{n}|{ref}"] = worst
                print(
                    f"{n:<20} {ref:<5} {worst['max_abs']:8.4f} {worst['logspec']:8.4f} "
                    f"{worst['snr_db']:7.1f}"
                )
        pv = [v for v in stages["prosody"] if v != "int8"]
        for v in pv:
            s = make_session(stages["prosody"][v], Plan(v), 2)
            diffs = []
            for i, f in enumerate(feeds_p):
                names = [o.name for o in s.get_outputs()]
                d = dict(zip(names, s.run(None, f), strict=True))["durations"]
                diffs.append(int(np.abs(d - pros[i]["durations"]).sum()))
            results["numerics"][f"prosody_{v}|durations_frames_differing"] = diffs
            print(f"prosody {v}: |durations - int8| summed per sentence (frames): {diffs}")
        del sess, fp32, int8

    long_i = int(np.argmax(frames))
    ctx = args.context
    for th in threads:
        sess = {n: make_session(stages["decoder"][pl.variant], pl, th) for n, pl in plans.items()}
        cases: list[tuple[str, int, dict[str, Any]]] = []
        for w in windows:
            a = max(0, min(ctx, frames[long_i] - w - 2 * ctx))
            b = min(frames[long_i], a + w + 2 * ctx)
            cases.append((f"w{w}", w, dec_feeds(long_i, a, b)))
        for i in [int(x) for x in args.whole.split(",") if x]:
            if True:
                cases.append((f"sent{i}", frames[i], dec_feeds(i, 0, frames[i])))
        psess: dict[str, Any] = {}
        if not args.no_prosody:
            psess = {
                n: make_session(stages["prosody"][pl.variant], pl, th) for n, pl in plans.items()
            }
        for s in sess.values():  # warm-up (first run allocates)
            s.run(None, cases[0][2])
        times: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.reps):
            for label, _w, f in cases:
                for n, s in sess.items():
                    times.setdefault((n, label), []).append(timed(s, f))
            for i, f in enumerate(feeds_p):
                for n, s in psess.items():
                    times.setdefault((n, f"prosody{i}"), []).append(timed(s, f))
        load = os.getloadavg()
        print(f"\n## decoder ms per second of kept audio, {th} thread(s), median of {args.reps}")
        print(f"# load after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
        labels = [c[0] for c in cases]
        print(f"{'plan':<20} " + " ".join(f"{lb:>8}" for lb in labels))
        audio_s = {c[0]: c[1] * SAMPLES_PER_FRAME / SR for c in cases}
        for n in sess:
            cells = []
            for lb in labels:
                ms = statistics.median(times[(n, lb)]) / audio_s[lb] * 1000
                results["speed"][f"{n}|t{th}|{lb}"] = ms
                cells.append(f"{ms:8.0f}")
            print(f"{n:<20} " + " ".join(cells))
        if psess:
            print(f"## prosody stage ms per sentence ({frames} frames), {th} thread(s)")
            for n in psess:
                pms = [
                    statistics.median(times[(n, f"prosody{i}")]) * 1000 for i in range(len(feeds_p))
                ]
                for i, m in enumerate(pms):
                    results["speed"][f"{n}|t{th}|prosody{i}"] = m
                print(f"{n:<20} " + " ".join(f"{m:8.0f}" for m in pms))
        del sess, psess
    print(f"# load at end: {os.getloadavg()}")
    if args.cpu_quota > 0:  # did the quota bind? (on a busy box it may not)
        stat = Path("/sys/fs/cgroup/cpu/slowbench/cpu.stat").read_text().split()
        print("# cgroup cpu.stat:", dict(zip(stat[::2], stat[1::2], strict=False)))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
