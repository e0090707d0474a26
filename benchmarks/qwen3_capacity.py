"""Qwen3-TTS capacity: N concurrent phone-call streams through one engine's batch scheduler.

Random-weight GGUF model sets as in ``qwen3_speed.py`` (``tiny``, ``0.6b``,
``1.7b`` shapes; EOS never wins, so every utterance runs its full length).
Each stream is fed like a phone call: ``--sentences`` sentences, the first
at a small random offset, each next one arriving when half of the previous
one's frames are out (the LLM keeps talking while the caller listens). Audio
plays out with zero buffer: playback starts at the first frame and frame
``k`` is due 80 ms after frame ``k-1``; a frame that is later than due is an
underrun (playback then resumes from that frame). The stream's playback
estimate is the scheduler's ``urgency`` (deadline-aware admission).

Printed per N: TTFA (submit of a call's first sentence -> its first frame)
p50/p95, frames/s per stream (min and median), aggregate frames/s, underruns.
``--sequential`` also runs the same utterances one at a time in the same
process (batched vs sequential frames/s). TTFA here is the codec frame's; the
vocoder is not run (its first chunk is one frame with the default ramp).

Usage:
  python benchmarks/qwen3_capacity.py --config tiny --streams 1,2,4,8 --sequential
  python benchmarks/qwen3_capacity.py --config 0.6b,1.7b --device cuda --dtype bfloat16 \\
      --streams 1,2,4,8,16,32,64
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import qwen3_speed  # noqa: E402  (the random model sets)

FRAME_S = 0.08
SENTENCES = [
    "Hello, thanks for calling, how can I help you today?",
    "Sure, let me look that up for you right away.",
    "Your appointment is on Tuesday at three in the afternoon.",
    "Is there anything else I can do for you?",
]


@dataclass
class StreamResult:
    ttfa_ms: float = -1.0
    frames: int = 0
    busy_s: float = 0.0
    underruns: int = 0
    late_ms_max: float = 0.0
    errors: list[str] = field(default_factory=list)


class _Playout:
    """Zero-buffer real-time listener of one call: frames are due every 80 ms."""

    def __init__(self) -> None:
        self.due: float | None = None
        self.underruns = 0
        self.late_max = 0.0

    def frame(self, now: float) -> None:
        if self.due is None:
            self.due = now + FRAME_S
            return
        if now > self.due:
            self.underruns += 1
            self.late_max = max(self.late_max, now - self.due)
            self.due = now  # playback resumes with this frame
        self.due += FRAME_S

    def ahead_s(self) -> float:
        if self.due is None:
            return 0.0
        return self.due - time.perf_counter()


def _request(i: int, k: int, frames: int) -> Any:
    from engines.qwen3.modes import PresetSpeaker
    from engines.qwen3.serving.request import ModeSynthesizeRequest

    return ModeSynthesizeRequest(
        text=SENTENCES[(i + k) % len(SENTENCES)],
        speaker=PresetSpeaker.Ryan,
        language="english",
        seed=1000 * i + k,
        max_frames=frames,
    )


def run_streams(engine: Any, n: int, sentences: int, frames: int) -> dict[str, Any]:
    results = [StreamResult() for _ in range(n)]
    before = engine.batch_stats()
    rng = np.random.default_rng(n)
    offsets = rng.uniform(0.0, 0.2, size=n)
    t_start = time.perf_counter()

    def call(i: int) -> None:
        res = results[i]
        play = _Playout()
        time.sleep(float(offsets[i]))
        t_sub = time.perf_counter()
        pending: list[tuple[Any, float]] = [
            (engine.submit(_request(i, 0, frames), name=f"c{i}s0", urgency=play.ahead_s), t_sub)
        ]
        k = 0
        while pending:
            stream, t_submit = pending.pop(0)
            got = 0
            t0 = time.perf_counter()
            try:
                for _ in stream:
                    now = time.perf_counter()
                    if res.ttfa_ms < 0:
                        res.ttfa_ms = (now - t_submit) * 1e3
                    play.frame(now)
                    got += 1
                    if got == frames // 2 and k + 1 < sentences:
                        k += 1
                        nxt = engine.submit(
                            _request(i, k, frames), name=f"c{i}s{k}", urgency=play.ahead_s
                        )
                        pending.append((nxt, time.perf_counter()))
            except Exception as exc:
                res.errors.append(repr(exc))
            res.frames += got
            res.busy_s += time.perf_counter() - t0
        res.underruns = play.underruns
        res.late_ms_max = play.late_max * 1e3

    threads = [threading.Thread(target=call, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t_start
    ttfa = [r.ttfa_ms for r in results if r.ttfa_ms >= 0]
    fps = [r.frames / r.busy_s for r in results if r.busy_s > 0]
    total = sum(r.frames for r in results)
    after = engine.batch_stats()
    steps = after.get("steps", 0.0) - before.get("steps", 0.0)
    rows = after.get("rows_stepped", 0.0) - before.get("rows_stepped", 0.0)
    return {
        "streams": n,
        "ttfa_ms_p50": float(np.percentile(ttfa, 50)) if ttfa else -1.0,
        "ttfa_ms_p95": float(np.percentile(ttfa, 95)) if ttfa else -1.0,
        "fps_per_stream_min": min(fps) if fps else 0.0,
        "fps_per_stream_median": statistics.median(fps) if fps else 0.0,
        "fps_total": total / wall if wall > 0 else 0.0,
        "underruns": sum(r.underruns for r in results),
        "late_ms_max": max(r.late_ms_max for r in results),
        "batch_size_mean": rows / steps if steps else 0.0,  # this run's steps only
        "errors": sum(len(r.errors) for r in results),
        "frames": total,
        "wall_s": wall,
    }


def run_sequential(engine: Any, n: int, sentences: int, frames: int) -> float:
    """The same n * sentences utterances one at a time: frames per second."""
    t0 = time.perf_counter()
    total = 0
    for i in range(n):
        for k in range(sentences):
            codes, _ = engine.generate_codes(_request(i, k, frames))
            total += int(codes.shape[0])
    return total / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--config", default="tiny", help="comma list of tiny, 0.6b, 1.7b")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default="float32")
    ap.add_argument("--streams", default="1,2,4,8,16,32,64", help="comma list of N")
    ap.add_argument("--sentences", type=int, default=2, help="sentences per call")
    ap.add_argument("--frames", type=int, default=24, help="frames per sentence (12.5 = 1 s)")
    ap.add_argument("--sequential", action="store_true", help="also run one utterance at a time")
    ap.add_argument("--threads", type=int, help="torch CPU threads")
    ap.add_argument("--no-graphs", action="store_true", help="CUDA: eager steps only")
    ap.add_argument("--work-dir", type=Path, help="where the random GGUFs go (kept; reused)")
    ap.add_argument("--json", type=Path, help="also write the results as JSON")
    a = ap.parse_args(argv)
    import torch

    from engines.qwen3.modes import QtsMode
    from engines.qwen3.serving.frame_generator import BatchOptions, FrameGenerator
    from engines.qwen3.weights.paths import ModeModelPaths

    if a.threads:
        torch.set_num_threads(a.threads)
    torch.set_flush_denormal(True)
    counts = [int(x) for x in a.streams.split(",") if x.strip()]
    tmp = None
    work = a.work_dir
    if work is None:
        tmp = tempfile.TemporaryDirectory(prefix="qwen3cap-")
        work = Path(tmp.name)
    out: list[dict[str, Any]] = []
    try:
        for name in [c.strip() for c in a.config.split(",")]:
            shape = qwen3_speed.SHAPES[name]
            gguf_path = qwen3_speed.write_random_model(work / shape.name, shape, "customvoice")
            paths = ModeModelPaths.from_files(gguf_path, vocoder_onnx=work / "none.onnx")
            batching = BatchOptions(
                max_batch=max(counts),
                max_context=a.frames + 96,
                cuda_graphs=a.device == "cuda" and not a.no_graphs,
            )
            eng = FrameGenerator.load_mode(
                paths, QtsMode.CustomVoice, device=a.device, dtype=a.dtype, batching=batching
            )
            eng.generate_codes(_request(0, 0, 4))  # warm-up (and graph capture of bucket 1)
            print(
                f"== {name}, {a.device}, {a.dtype}, {a.sentences} sentences x {a.frames} frames "
                f"per call, max_batch {batching.max_batch}, threads {torch.get_num_threads()}",
                flush=True,
            )
            print(
                f"{'N':>4} {'ttfa p50':>9} {'ttfa p95':>9} {'fps/stream':>11} {'min':>7} "
                f"{'x rt':>6} {'fps total':>10} {'underruns':>9} {'batch':>6}"
                + (f" {'seq fps':>8} {'ratio':>6}" if a.sequential else ""),
                flush=True,
            )
            for n in counts:
                r = run_streams(eng, n, a.sentences, a.frames)
                r.update(config=name, device=a.device, dtype=a.dtype)
                line = (
                    f"{n:>4} {r['ttfa_ms_p50']:>9.1f} {r['ttfa_ms_p95']:>9.1f} "
                    f"{r['fps_per_stream_median']:>11.1f} {r['fps_per_stream_min']:>7.1f} "
                    f"{r['fps_per_stream_min'] / 12.5:>6.2f} {r['fps_total']:>10.1f} "
                    f"{r['underruns']:>9d} {r['batch_size_mean']:>6.2f}"
                )
                if a.sequential:
                    seq = run_sequential(eng, n, a.sentences, a.frames)
                    r["sequential_fps"] = seq
                    line += f" {seq:>8.1f} {r['fps_total'] / seq if seq else 0.0:>6.2f}"
                if r["errors"]:
                    line += f"  errors={r['errors']}"
                print(line, flush=True)
                out.append(r)
            eng.close()
    finally:
        if tmp is not None:
            tmp.cleanup()
    if a.json is not None:
        a.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
