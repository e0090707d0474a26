"""Emulate a slower CPU for a benchmark run (``--slow``), on Linux.

Two ways, both measured against the same box unslowed in the same session:

* ``burn`` (default): ``factor - 1`` CPU-burning processes per core, each pinned to
  its core, at the engine's priority. Every thread on that core, the engine's
  inference threads included, then gets about ``1 / factor`` of it: a core about
  ``factor`` times slower, whatever the number of threads. It slows the dock and
  this benchmark process too, as a slower machine would.
* ``quota``: a cgroup-v1 CPU quota (root; the ``cpu`` controller mounted at
  ``/sys/fs/cgroup/cpu``): ``cores / factor`` CPUs in all, enforced every 10 ms,
  on the benchmark process and so on the dock and engine it starts afterwards,
  as in a container with a CPU limit. It is like a box with fewer cores, not
  slower ones: a single thread still runs at full speed while the quota allows
  (the engine reads the quota and sizes its workers and threads by it).

Neither way changes the instruction set. ``--avx2`` (``reexec_avx2``) does: the
benchmark re-runs itself, and so every process it starts, with ``cpuid_avx2.c``
preloaded, which hides AVX-512, AMX and AVX-VNNI from CPUID (CPUID faulting), so
ONNX Runtime picks its AVX2 kernels as on an AVX2-only server. Combined with
``--slow`` it approximates a small AVX2-only cloud instance; it emulates the
instruction set, not that CPU's microarchitecture.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

CGROUP_CPU = Path("/sys/fs/cgroup/cpu")
QUOTA_PERIOD_US = 10_000


def _burn(core: int) -> None:
    with contextlib.suppress(AttributeError, OSError):
        os.sched_setaffinity(0, {core})
    x = 0
    while True:  # runs until terminated
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF


@contextlib.contextmanager
def slowed(mode: str, factor: float) -> Iterator[str]:
    """Slow the CPU ``factor`` times for the block; yields a one-line description.
    Quota: this process moves into the limited cgroup, so the processes it starts
    afterwards (dock, engine) start inside it, as in a container with a CPU limit,
    and its own reference runs share the limit."""
    if factor <= 1:
        yield "not slowed"
        return
    cores = sorted(os.sched_getaffinity(0))
    if mode == "burn":
        per_core = max(1, round(factor - 1))
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=_burn, args=(c,), daemon=True) for c in cores
                 for _ in range(per_core)]  # fmt: skip
        for p in procs:
            p.start()
        try:
            yield (
                f"slowed x{1 + per_core:g}: {per_core} CPU burner(s) pinned to each of "
                f"{len(cores)} cores"
            )
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.join(5)
        return
    if mode != "quota":
        raise ValueError(f"unknown slow mode {mode!r} (burn or quota)")
    group = CGROUP_CPU / f"ttsdock-slow-{os.getpid()}"
    if not CGROUP_CPU.is_dir():
        raise RuntimeError(f"{CGROUP_CPU} is not a cgroup-v1 cpu controller; use --slow-mode burn")
    group.mkdir(exist_ok=True)
    try:
        quota = int(len(cores) * QUOTA_PERIOD_US / factor)
        (group / "cpu.cfs_period_us").write_text(str(QUOTA_PERIOD_US))
        (group / "cpu.cfs_quota_us").write_text(str(quota))
        (group / "cgroup.procs").write_text(str(os.getpid()))
        yield (
            f"slowed x{factor:g}: cgroup-v1 quota {quota} us per {QUOTA_PERIOD_US} us "
            f"({quota / QUOTA_PERIOD_US:.2f} CPUs) on this benchmark and everything it starts"
        )
    finally:
        parent = CGROUP_CPU / "cgroup.procs"
        with contextlib.suppress(OSError):
            for line in (group / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    parent.write_text(line)
        with contextlib.suppress(OSError):
            group.rmdir()


AVX2_MARK = "TTSDOCK_BENCH_AVX2"


def reexec_avx2() -> None:
    """Re-run this process with the CPUID shim preloaded (once; needs gcc and a CPU with
    CPUID faulting, the ``cpuid_fault`` flag)."""
    if os.environ.get(AVX2_MARK):
        return
    src = Path(__file__).with_name("cpuid_avx2.c")
    lib = Path(tempfile.gettempdir()) / "ttsdock_cpuid_avx2.so"
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    env = dict(os.environ, LD_PRELOAD=str(lib), **{AVX2_MARK: "1"})
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


def engine_plan_arguments(args: argparse.Namespace) -> list[str]:
    """The engine flags ``add_machine_arguments`` passes on."""
    out: list[str] = []
    if args.plan:
        out += ["--plan", args.plan]
    if args.parallel_windows:
        out += ["--parallel-windows", args.parallel_windows]
    return out


def avx2_emulated() -> bool:
    return bool(os.environ.get(AVX2_MARK))


def add_machine_arguments(p: argparse.ArgumentParser) -> None:
    """``--plan``, ``--parallel-windows``, ``--slow [FACTOR]``, ``--slow-mode`` and
    ``--avx2`` of the Kokoro benchmarks."""
    p.add_argument("--plan", default=None, help="engine --plan (default: the engine's choice)")
    p.add_argument(
        "--parallel-windows",
        default=None,
        metavar="auto|N",
        help="engine --parallel-windows (default: the engine's, auto)",
    )
    p.add_argument(
        "--slow",
        type=float,
        nargs="?",
        const=2.0,
        default=1.0,
        metavar="FACTOR",
        help="emulate a CPU FACTOR times slower (slowdown.py; default when given: 2)",
    )
    p.add_argument("--slow-mode", choices=("burn", "quota"), default="burn")
    p.add_argument(
        "--avx2",
        action="store_true",
        help="emulate an AVX2-only CPU (re-runs with benchmarks/cpuid_avx2.c preloaded)",
    )
