"""Execution plans: which decoder graph this CPU runs fastest, measured once and cached.

Rule 1: a *plan* is a decoder-stage variant (``graph_variants.VARIANTS``: the shipped
int8 graph, a float32 graph dequantised from it, the same with 1-D convolutions as
1xk 2-D ones) run with the engine's thread counts. The prosody and frame stages stay
the shipped ones in every plan, so durations never change with the plan (and the
frame stage, a few per cent of the compute, keeps 34 MB of int8 weights a session).
Rule 2: a variant is only a candidate while its audio matches the shipped graph's
within the model's own precision (``MAX_LOG_SPECTRAL_DISTANCE``, on a probe window
decoded by both); a variant that fails to build, load or match is skipped with a
WARN giving the reason, and the shipped graph is always there to fall back on.

Calibration (``choose``) runs in ``KokoroSynthesizer.load``, so before docking and
off the event loop. It decodes one probe window (``PROBE_FRAMES`` plus context) with
each candidate at one thread, keeps the one with the most audio per core-second,
and measures that one at every core too, and once more with every core decoding the
probe at the same time, one thread each (``crowded``): on a CPU whose cores share
their execution units (SMT siblings, as on many 2-vCPU cloud instances) each of
those runs is far slower than one alone, so neither more threads nor more
workers add throughput; the capacity estimate and the window pacing under
several calls use this figure, not the lone core's. The result is cached beside the model in
``<model>.plans/plans.json`` with the variant graphs it built, keyed by the model's
sha256, the CPU (model name and flags), the number of cores the process may use
(``cpus.available_cpus``: a container's CPU limit changes it), the onnxruntime
version and ``PLANS_VERSION``; a cache that does not match, cannot be parsed or whose graph
files changed is measured again, never trusted. ``--plan NAME`` skips the
measurement and runs NAME (its speed is then what the warm-up measures).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import structlog

from engines.kokoro.graph_split import SplitGraphs
from engines.kokoro.models import sha256_file as file_digest
from engines.kokoro.windows import FRAMES_PER_S
from engines.runtime.cpus import available_cpus

log = structlog.get_logger(__name__)

PLANS_VERSION = 2  # 2: the crowded measurement
SHIPPED = "int8"
AUTO = "auto"
PROBE_FRAMES = 80  # kept frames of the probe window (2 s), decoded with context: a typical window
PROBE_CONTEXT = 10
PROBE_RUNS = 2  # timed runs per candidate and thread count (the fastest counts)
#: Mean absolute difference of log10 magnitude spectra (n_fft 1024, hop 256) allowed
#: between a variant's probe audio and the shipped graph's: the model's own precision.
#: The shipped int8 graph differs from the same weights run in float32 by 0.20 on
#: whole sentences (benchmarks/kokoro_plans.py; its activation quantisation), so a
#: variant within this is as close to the shipped audio as the shipped audio is to the
#: model it quantises; half gain is 0.30, and a wrong graph is far above.
MAX_LOG_SPECTRAL_DISTANCE = 0.25

Decode = Callable[[Any, int], npt.NDArray[np.float32]]  # (session, threads) -> probe audio


@dataclass
class Measured:
    """One candidate's calibration: compute s per decoded audio s by thread count."""

    variant: str
    rtf: dict[int, float] = field(default_factory=dict)
    distance: float = 0.0
    error: str = ""
    #: compute s per decoded audio s of one single-thread decode while every core runs
    #: one (None: not measured, or one core)
    crowded: float | None = None

    def per_core(self) -> float:
        """Audio seconds per core-second at its best thread count (0: unusable)."""
        if self.error or not self.rtf:
            return 0.0
        return max(1.0 / (r * n) for n, r in self.rtf.items() if r > 0)


@dataclass
class PlanChoice:
    """The plan in use: its decoder graph, its measured speed and where it came from."""

    variant: str
    decoder: str | bytes
    source: str  # measured | cached | forced | default
    rtf: dict[int, float] = field(default_factory=dict)
    candidates: list[Measured] = field(default_factory=list)
    crowded: float | None = None  # ``Measured.crowded`` of the chosen variant
    crowded_cores: int = 1  # decodes at once when ``crowded`` was measured


def cpu_fingerprint() -> str:
    """The CPU model name and flags (Linux: /proc/cpuinfo; elsewhere ``platform``), and any
    preloaded library (a CPUID shim changes the features ONNX Runtime sees)."""
    preload = os.environ.get("LD_PRELOAD", "")
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return f"{platform.machine()}|{platform.processor()}|{preload}"
    model = flags = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("model name", "Model", "CPU part") and not model:
            model = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = " ".join(sorted(value.split()))
    return f"{platform.machine()}|{model}|{flags}|{preload}"


def fingerprint(model_sha256: str) -> dict[str, str]:
    import onnxruntime as ort

    cpu = cpu_fingerprint()
    return {
        "plans_version": str(PLANS_VERSION),
        "model_sha256": model_sha256,
        "cpu": cpu.split("|")[1] if cpu.count("|") >= 1 else cpu,
        "cpu_sha256": hashlib.sha256(cpu.encode()).hexdigest(),
        "onnxruntime": str(ort.__version__),
        "cpus": str(available_cpus()),
    }


def log_spectral_distance(a: npt.NDArray[np.float32], b: npt.NDArray[np.float32]) -> float:
    """Mean absolute difference of log10 magnitude spectra (n_fft 1024, hop 256)."""
    n = min(len(a), len(b))
    if n < 1024:
        return float(np.mean(np.abs(a[:n] - b[:n]))) if n else 0.0
    win = np.hanning(1024).astype(np.float32)
    frames = 1 + (n - 1024) // 256
    idx = np.arange(1024)[None, :] + 256 * np.arange(frames)[:, None]
    sa = np.abs(np.fft.rfft(a[:n][idx] * win, axis=1))
    sb = np.abs(np.fft.rfft(b[:n][idx] * win, axis=1))
    return float(np.mean(np.abs(np.log10(sa + 1e-5) - np.log10(sb + 1e-5))))


class PlanCache:
    """``<model>.plans/``: ``plans.json`` and the variant decoder graphs it names."""

    def __init__(self, model_path: Path) -> None:
        self.dir = model_path.with_name(f"{model_path.name}.plans")
        self.index = self.dir / "plans.json"

    def graph_path(self, variant: str) -> Path:
        return self.dir / f"{variant}.decoder"

    def read(self, want: dict[str, str]) -> dict[str, Any] | None:
        """The cached calibration for ``want``, or None (logged) when it does not hold."""
        try:
            data = json.loads(self.index.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("plan_cache_unreadable", path=str(self.index), reason=str(exc))
            return None
        if not isinstance(data, dict) or data.get("fingerprint") != want:
            log.info("plan_cache_stale", path=str(self.index))
            return None
        choice = data.get("choice")
        graphs = data.get("graphs", {})
        if not isinstance(choice, str) or not isinstance(graphs, dict):
            log.warning("plan_cache_unreadable", path=str(self.index), reason="bad fields")
            return None
        if choice != SHIPPED:
            path = self.graph_path(choice)
            try:
                ok = path.is_file() and file_digest(path) == graphs.get(choice)
            except OSError:
                ok = False
            if not ok:
                log.warning("plan_cache_corrupt", path=str(path), reason="graph missing or changed")
                return None
        return data

    def graph(self, variant: str, build: Callable[[], bytes]) -> str | bytes:
        """The variant's decoder graph: the cached file, else built and written (bytes
        when the directory is read-only)."""
        path = self.graph_path(variant)
        data = build()
        try:
            self.dir.mkdir(exist_ok=True)
            part = path.with_name(f"{path.name}.{os.getpid()}.part")
            part.write_bytes(data)
            os.replace(part, path)
        except OSError as exc:
            log.info("plan_graph_not_cached", path=str(path), error=str(exc))
            return data
        return str(path)

    def write(self, want: dict[str, str], choice: PlanChoice) -> None:
        graphs: dict[str, str] = {}
        for m in choice.candidates:
            path = self.graph_path(m.variant)
            if m.variant != SHIPPED and path.is_file():
                graphs[m.variant] = file_digest(path)
        data = {
            "fingerprint": want,
            "choice": choice.variant,
            "graphs": graphs,
            "rtf": {str(k): v for k, v in choice.rtf.items()},
            "crowded": choice.crowded,
            "crowded_cores": choice.crowded_cores,
            "candidates": [asdict(m) for m in choice.candidates],
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        try:
            self.dir.mkdir(exist_ok=True)
            part = self.index.with_name(f"plans.json.{os.getpid()}.part")
            part.write_text(json.dumps(data, indent=1))
            os.replace(part, self.index)
        except OSError as exc:
            log.info("plan_cache_not_written", path=str(self.index), error=str(exc))


def _time_decode(load: Callable[[str | bytes, int], Any], decode: Decode, source: str | bytes,
                 threads: int) -> tuple[float, npt.NDArray[np.float32]]:  # fmt: skip
    """(compute s per decoded audio s, audio) of the probe at ``threads``."""
    session = load(source, threads)
    audio = decode(session, threads)  # warm run (first-run allocations)
    best = float("inf")
    for _ in range(PROBE_RUNS):
        t0 = time.perf_counter()
        decode(session, threads)
        best = min(best, time.perf_counter() - t0)
    return (best / (len(audio) / 24000) if len(audio) else float("inf")), audio


def _time_crowded(load: Callable[[str | bytes, int], Any], decode: Decode, source: str | bytes,
                  cores: int) -> float:  # fmt: skip
    """Compute s per decoded audio s of one single-thread probe decode while ``cores``
    of them run at once (the mean over the runs of the fastest round)."""
    sessions = [load(source, 1) for _ in range(cores)]
    audio_s = len(decode(sessions[0], 1)) / 24000  # warm run
    if audio_s <= 0:
        return float("inf")
    for session in sessions[1:]:
        decode(session, 1)
    barrier = threading.Barrier(cores)
    took = [0.0] * cores
    errors: list[BaseException] = []

    def run(i: int) -> None:
        barrier.wait()
        t0 = time.perf_counter()
        try:
            decode(sessions[i], 1)
        except BaseException as exc:  # re-raised below, in the calibrating thread
            errors.append(exc)
        took[i] = time.perf_counter() - t0

    best = float("inf")
    for _ in range(PROBE_RUNS):
        workers = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(cores)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        if errors:
            raise errors[0]
        best = min(best, sum(took) / cores)
    return best / audio_s


def calibrate(
    candidates: Sequence[str],
    graphs: Callable[[str], str | bytes],
    load: Callable[[str | bytes, int], Any],
    decode: Decode,
    thread_counts: Sequence[int],
    cores: int | None = None,
) -> list[Measured]:
    """Measure each candidate at the fewest threads: build it (``graphs``), load a session
    (``load``), decode the probe (``decode``) and compare the audio with the shipped
    graph's; then the fastest usable one at the other thread counts too."""
    reference: npt.NDArray[np.float32] | None = None
    narrow, *wider = sorted(set(thread_counts))
    out: list[Measured] = []
    for variant in [SHIPPED, *(c for c in candidates if c != SHIPPED)]:
        m = Measured(variant)
        try:
            m.rtf[narrow], audio = _time_decode(load, decode, graphs(variant), narrow)
            if reference is None:
                reference = audio
            m.distance = log_spectral_distance(audio, reference)
            if m.distance > MAX_LOG_SPECTRAL_DISTANCE:
                m.error = (
                    f"audio differs from the shipped graph: log-spectral distance "
                    f"{m.distance:.3f} > {MAX_LOG_SPECTRAL_DISTANCE}"
                )
        except Exception as exc:  # a variant that cannot be built or run: skipped
            m.error = f"{type(exc).__name__}: {exc}"
        if m.error:
            log.warning("plan_candidate_rejected", plan=variant, reason=m.error)
            if variant == SHIPPED:
                raise RuntimeError(f"the shipped decoder graph does not run: {m.error}")
        out.append(m)
    best = max((m for m in out if not m.error), key=lambda m: m.per_core())
    for n in wider:
        try:
            best.rtf[n], _ = _time_decode(load, decode, graphs(best.variant), n)
        except Exception as exc:  # measured at one thread count only: still usable
            log.warning("plan_threads_unmeasured", plan=best.variant, threads=n, reason=repr(exc))
    cores = max(thread_counts) if cores is None else cores  # never more decodes than cores
    if cores > 1:
        try:
            best.crowded = _time_crowded(load, decode, graphs(best.variant), cores)
        except Exception as exc:  # the lone core's figure stands in
            log.warning("plan_crowded_unmeasured", plan=best.variant, reason=repr(exc))
    return out


def probe_frames() -> int:
    """Frames decoded per probe run (kept plus context on both sides)."""
    return PROBE_FRAMES + 2 * PROBE_CONTEXT


def probe_audio_s() -> float:
    return probe_frames() / FRAMES_PER_S


def choose(
    model_path: Path,
    model_sha256: str,
    stages: SplitGraphs,
    *,
    plan: str,
    candidates: Sequence[str],
    build: Callable[[str | bytes, str], bytes],
    load: Callable[[str | bytes, int], Any],
    decode: Decode,
    thread_counts: Sequence[int],
    cores: int | None = None,
) -> PlanChoice:
    """The decoder graph to run: ``plan`` forced, else cached, else measured now."""
    cache = PlanCache(model_path)
    built: dict[str, str | bytes] = {SHIPPED: stages.decoder}

    def graph_of(variant: str) -> str | bytes:
        if variant not in built:
            cached = read_graph_if_stamped(cache, variant)
            built[variant] = (
                cached
                if cached is not None
                else cache.graph(variant, lambda: build(stages.decoder, variant))
            )
        return built[variant]

    if plan != AUTO:
        return PlanChoice(plan, graph_of(plan), "forced")
    want = fingerprint(model_sha256)
    data = cache.read(want)
    if data is not None:
        name = str(data["choice"])
        rtf = {int(k): float(v) for k, v in data.get("rtf", {}).items()}
        crowded = data.get("crowded")
        if data.get("crowded_cores") != (max(thread_counts) if cores is None else cores):
            crowded = None  # measured with another number of cores: the live figure decides
        crowded = float(crowded) if isinstance(crowded, int | float) and crowded > 0 else None
        return PlanChoice(name, graph_of(name), "cached", rtf, crowded=crowded)
    log.info("plan_calibrating", candidates=list(candidates), threads=list(thread_counts))
    t0 = time.monotonic()
    measured = calibrate(candidates, graph_of, load, decode, thread_counts, cores)
    usable = [m for m in measured if not m.error]
    best = max(usable, key=lambda m: m.per_core())
    choice = PlanChoice(
        best.variant,
        graph_of(best.variant),
        "measured",
        best.rtf,
        measured,
        best.crowded,
        max(thread_counts) if cores is None else cores,
    )
    cache.write(want, choice)
    log.info(
        "plan_chosen",
        plan=best.variant,
        calibration_s=round(time.monotonic() - t0, 1),
        crowded_rtf=None if best.crowded is None else round(best.crowded, 3),
        candidates={
            m.variant: m.error or {"rtf": m.rtf, "distance": round(m.distance, 3)} for m in measured
        },
    )
    return choice


def read_graph_if_stamped(cache: PlanCache, variant: str) -> str | None:
    """A cached variant graph whose digest the index records, else None (rebuilt)."""
    try:
        data = json.loads(cache.index.read_text())
        want = data["graphs"][variant]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    path = cache.graph_path(variant)
    try:
        return str(path) if file_digest(path) == want else None
    except OSError:
        return None


def plan_names() -> list[str]:
    """The plans ``--plan`` accepts besides ``auto``."""
    from engines.kokoro.graph_variants import VARIANTS

    return list(VARIANTS)


def _session(source: str | bytes, threads: int, spinning: bool) -> Any:
    import onnxruntime as ort

    from engines.kokoro.graph_variants import session_options

    return ort.InferenceSession(
        source,
        session_options(threads, spinning=spinning, mem_pattern=False),
        providers=["CPUExecutionProvider"],
    )


@dataclass(frozen=True)
class ProbeInput:
    """The decoder inputs of the probe window: a real sentence's prosody."""

    feeds: dict[str, npt.NDArray[Any]]

    @classmethod
    def from_stage(
        cls,
        prosody: str | bytes,
        tokens: Sequence[int],
        style: npt.NDArray[np.float32],
        frame: str | bytes | None = None,
    ) -> ProbeInput:
        """Run the shipped prosody stage (and the ``frame`` stage, when the prosody stage
        gives no ``features`` itself) on ``tokens`` and cut the probe window from the
        middle of the sentence (``PROBE_FRAMES`` plus ``PROBE_CONTEXT`` on each side)."""
        outs = stage_outputs(prosody, frame, tokens, style)
        frames = int(outs["features"].shape[2]) // 2
        want = probe_frames()
        a = max(0, (frames - want) // 2)
        b = min(frames, a + want)
        return cls(
            {
                "features": np.ascontiguousarray(outs["features"][:, :, 2 * a : 2 * b]),
                "f0": np.ascontiguousarray(outs["f0"][:, 2 * a : 2 * b]),
                "phase": np.ascontiguousarray(outs["phase"][:, 2 * a : 2 * b, :]),
                "style": style.reshape(1, -1).astype(np.float32),
            }
        )


def stage_outputs(
    prosody: str | bytes,
    frame: str | bytes | None,
    tokens: Sequence[int],
    style: npt.NDArray[np.float32],
    threads: int = 1,
) -> dict[str, npt.NDArray[Any]]:
    """The prosody stage's outputs for ``tokens`` at speed 1, with the whole sentence's
    ``features`` (the ``frame`` stage run on all frames when the prosody stage gives
    none): what the decoder stage's probes and numeric checks take."""
    sess = _session(prosody, threads, False)
    names = {i.name for i in sess.get_inputs()}
    style = style.reshape(1, -1).astype(np.float32)
    feeds: dict[str, Any] = {
        ("input_ids" if "input_ids" in names else "tokens"): np.array(
            [[0, *tokens, 0]], dtype=np.int64
        ),
        "style": style,
        "speed": np.array([1.0], dtype=np.float32),
    }
    outs = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds), strict=True))
    if "features" not in outs:
        if frame is None:
            raise ValueError("the prosody stage gives no features and no frame stage is given")
        fs = _session(frame, threads, False)  # as split: its norms take their own
        wanted = {i.name for i in fs.get_inputs()}
        ffeeds = {n: v for n, v in {**outs, "style": style}.items() if n in wanted}
        outs["features"] = fs.run(["features"], ffeeds)[0]
    return outs


def choose_plan(
    model_path: Path,
    model_sha256: str,
    stages: SplitGraphs,
    *,
    plan: str,
    probe: ProbeInput,
    threads: Sequence[int],
    cores: int | None = None,
    spinning: bool = False,
) -> PlanChoice:
    """``choose`` with ONNX Runtime sessions and ``graph_variants``' transforms; ``cores``:
    the cores this process may use (the crowded measurement runs one decode on each)."""
    from engines.kokoro.graph_variants import build_stage

    def decode(session: Any, _threads: int) -> npt.NDArray[np.float32]:
        out = session.run(None, probe.feeds)[0]
        return np.asarray(out, dtype=np.float32).reshape(-1)

    return choose(
        model_path,
        model_sha256,
        stages,
        plan=plan,
        candidates=plan_names(),
        build=build_stage,
        load=lambda source, n: _session(source, n, spinning),
        decode=decode,
        thread_counts=sorted(set(threads)),
        cores=cores,
    )
