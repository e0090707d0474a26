"""One call on every core: wider sessions, or several windows of a sentence at once?

Two ways for one utterance to use all cores, measured on the same windows of the same
sentences, interleaved, in one run (the engine's plan, its sessions):

* wide: each window decoded in turn by one session with one intra-op thread per core
  (what the engine does: ``UnitGrant.cores``);
* parallel: the windows decoded ``cores`` at a time, each on its own one-thread
  session run, in that many threads (still delivered in order).

Printed: time to the first window's audio (what the caller hears first), wall time for
all windows, and compute per audio second, each the median over ``--repeats``.

    python benchmarks/kokoro_cores.py [--window 80] [--repeats 3] [--models-dir DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from voice_stats import wait_in_process  # noqa: E402

from engines.kokoro.models import default_models_dir  # noqa: E402
from engines.kokoro.phrasing import sentence_units  # noqa: E402
from engines.kokoro.synth import KokoroConfig, KokoroSynthesizer  # noqa: E402
from engines.runtime.synth import CancelToken, UnitGrant, set_unit_grant  # noqa: E402

TEXTS = (
    "Thank you for calling, your order will arrive on Thursday between nine and twelve.",
    "I have booked your appointment for Monday at ten in the morning, and I will send "
    "you a reminder the day before.",
)
CTX = 10


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models-dir", type=Path, default=None)
    p.add_argument("--window", type=int, default=80, help="kept frames per window")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    cores = len(os.sched_getaffinity(0))
    synth = KokoroSynthesizer(KokoroConfig(models_dir=args.models_dir or default_models_dir()))
    synth.load()
    # the voices' statistics of a new models directory are measured in a background
    # thread, which these direct decodes never make yield
    print(wait_in_process(synth.wait_for_voice_norms, 900.0), flush=True)
    backend = synth._backend
    assert backend is not None and hasattr(backend, "prosody")
    print(f"plan {synth.plan().name}, {cores} cores, load average {os.getloadavg()[0]:.2f}")
    for text in TEXTS:
        phon = synth.phonemize(text)
        unit = sentence_units(phon.words, synth.frontend.vocab.space, 400)[0]
        style = synth._voices["jf_alpha"][phon.n_tokens - 1].astype(np.float32)
        pros = backend.prosody(unit.tokens, style, 1.0, CancelToken())
        n = pros.n_frames
        spans = [(a, min(n, a + args.window)) for a in range(0, n, args.window)]
        ctx = [(max(0, a - CTX), min(n, b + CTX)) for a, b in spans]
        audio_s = n / 40

        def dec(span: tuple[int, int], grant: int, pros=pros, style=style) -> float:  # type: ignore[no-untyped-def]
            set_unit_grant(UnitGrant(grant, cores, 0))
            try:
                t0 = time.perf_counter()
                backend.decode(pros, span[0], span[1], style, CancelToken())
                return time.perf_counter() - t0
            finally:
                set_unit_grant(None)

        wide: list[tuple[float, float]] = []
        par: list[tuple[float, float]] = []
        with ThreadPoolExecutor(cores) as ex:
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                first = dec(ctx[0], cores)
                for s in ctx[1:]:
                    dec(s, cores)
                wide.append((first, time.perf_counter() - t0))
                t0 = time.perf_counter()
                futs = [ex.submit(dec, s, 1) for s in ctx]
                t_first = futs[0].result()
                for f in futs:
                    f.result()
                par.append((t_first, time.perf_counter() - t0))
        for name, rows in (("wide", wide), ("parallel", par)):
            f = statistics.median(r[0] for r in rows)
            w = statistics.median(r[1] for r in rows)
            print(
                f"{name:8} {n:4d} frames in {len(spans)} windows: first window "
                f"{f * 1000:6.0f} ms, all {w * 1000:6.0f} ms, wall per audio s {w / audio_s:.3f}"
            )
    print(f"load average at the end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
