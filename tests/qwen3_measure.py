"""Speed measurement of one request through the frame generator (tests/test_qwen3_model.py)."""

from __future__ import annotations

import time

import numpy as np

from engines.qwen3.serving.frame_generator import FrameGenerator
from engines.qwen3.serving.request import ModeSynthesizeRequest


def measure_frames_per_second(
    engine: FrameGenerator,
    req: ModeSynthesizeRequest,
    *,
    runs: int = 3,
    warmup: int = 1,
) -> dict[str, float]:
    """Generate ``req`` ``warmup + runs`` times; report frames/s (best and median) and stages.

    Frames/s counts the whole request (prefill included); ``decode_fps``
    excludes the prefill.
    """
    for _ in range(max(0, warmup)):
        engine.generate_codes(req)
    fps: list[float] = []
    dec: list[float] = []
    last: dict[str, float] = {}
    frames = 0
    for _ in range(max(1, runs)):
        t0 = time.perf_counter()
        codes, timings = engine.generate_codes(req)
        wall = time.perf_counter() - t0
        frames = int(codes.shape[0])
        fps.append(frames / wall if wall > 0 else 0.0)
        decode_s = (timings.get("talker", 0.0) + timings.get("code_predictor", 0.0)) / 1e3
        dec.append(frames / decode_s if decode_s > 0 else 0.0)
        last = timings
    return {
        "frames": float(frames),
        "fps_best": max(fps),
        "fps_median": float(np.median(fps)),
        "decode_fps_best": max(dec),
        "prefill_ms": last.get("prefill", 0.0),
        "talker_ms": last.get("talker", 0.0),
        "code_predictor_ms": last.get("code_predictor", 0.0),
        "ms_per_frame": 1e3 / max(fps) if max(fps) > 0 else 0.0,
    }
