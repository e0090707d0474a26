"""``kokoro-convert --coreml``: the CoreML layout that ``engines.kokoro.coreml`` loads.

Rule 1: tracing and ``coremltools.convert`` only; the modules are
``coreml_modules``'s, the names, shapes and buckets ``engines.kokoro.coreml``'s.
Rule 2: conversion runs anywhere coremltools installs (Linux included);
running a prediction needs macOS (tests marked ``macos``).

Written under the variant directory (F: the bucket's frames)::

    coreml/kokoro_duration.mlpackage
        input_ids, attention_mask [1, 512] int32, ref_s [1, 256], speed [1]
        -> pred_dur [1, 512], d [1, 640, 512], t_en [1, 512, 512]
    decoder_variants/kokoro_f0n_<b>.mlpackage
        en [1, 640, F], s [1, 128] -> F0_pred, N_pred [1, 2F]
    decoder_variants/kokoro_decoder_split_<b>.mlpackage
        asr [1, 512, F], F0_pred, N_pred [1, 2F], ref_s [1, 128], har [1, 22, 120 F + 1]
        -> waveform [1, 600 F]
    decoder_variants/split_config.json   buckets, HAR merge weights (l_linear)

Float32 compute precision (``ct.precision.FLOAT32``): the packages keep the
checkpoint's numbers; CoreML still picks the compute units.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from engines.kokoro.convert.coreml_modules import (
    DURATION_TOKENS,
    DecoderModel,
    DurationModel,
    F0NModel,
)
from engines.kokoro.coreml import REFERENCE_BUCKETS, Bucket

DEPLOYMENT_TARGET = "macOS13"


def _convert(module: Any, example: dict[str, Any], outputs: Sequence[str], path: Path) -> None:
    import coremltools as ct
    import numpy as np
    import torch

    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(module.eval(), tuple(example.values()), check_trace=False)
        inputs = [
            ct.TensorType(
                name=name,
                shape=tuple(t.shape),
                dtype=np.int32 if t.dtype in (torch.int32, torch.int64) else np.float32,
            )
            for name, t in example.items()
        ]
        model = ct.convert(
            traced,
            inputs=inputs,
            outputs=[ct.TensorType(name=n) for n in outputs],
            convert_to="mlprogram",
            compute_precision=ct.precision.FLOAT32,
            minimum_deployment_target=getattr(ct.target, DEPLOYMENT_TARGET),
        )
    model.save(str(path))


def duration_example() -> dict[str, Any]:
    import torch

    mask = torch.zeros((1, DURATION_TOKENS), dtype=torch.int32)
    mask[:, :16] = 1
    return {
        "input_ids": torch.zeros((1, DURATION_TOKENS), dtype=torch.int32),
        "attention_mask": mask,
        "ref_s": torch.zeros((1, 256)),
        "speed": torch.ones(1),
    }


def f0n_example(bucket: Bucket) -> dict[str, Any]:
    import torch

    return {"en": torch.zeros((1, 640, bucket.frames)), "s": torch.zeros((1, 128))}


def decoder_example(bucket: Bucket, n_fft: int = 20) -> dict[str, Any]:
    import torch

    return {
        "asr": torch.zeros((1, 512, bucket.frames)),
        "F0_pred": torch.zeros((1, bucket.f0_frames)),
        "N_pred": torch.zeros((1, bucket.f0_frames)),
        "ref_s": torch.zeros((1, 128)),
        "har": torch.zeros((1, n_fft + 2, bucket.har_frames)),
    }


def export_coreml(
    kmodel: Any,
    out_dir: Path,
    *,
    buckets: Sequence[Bucket] = REFERENCE_BUCKETS,
    log: Callable[[str], object] = print,
) -> dict[str, Any]:
    """Write the CoreML layout of ``kmodel`` (weight norm folded) under ``out_dir``; a summary."""
    n_fft = int(kmodel.decoder.generator.post_n_fft)
    (out_dir / "coreml").mkdir(parents=True, exist_ok=True)
    dv = out_dir / "decoder_variants"
    dv.mkdir(parents=True, exist_ok=True)
    seconds: dict[str, float] = {}
    t = time.monotonic()
    _convert(
        DurationModel(kmodel),
        duration_example(),
        ("pred_dur", "d", "t_en"),
        out_dir / "coreml" / "kokoro_duration.mlpackage",
    )
    seconds["duration"] = round(time.monotonic() - t, 1)
    log(f"coreml duration model: {seconds['duration']} s")
    for b in buckets:
        t = time.monotonic()
        _convert(
            F0NModel(kmodel),
            f0n_example(b),
            ("F0_pred", "N_pred"),
            dv / f"kokoro_f0n_{b.name}.mlpackage",
        )
        _convert(
            DecoderModel(kmodel),
            decoder_example(b, n_fft),
            ("waveform",),
            dv / f"kokoro_decoder_split_{b.name}.mlpackage",
        )
        seconds[b.name] = round(time.monotonic() - t, 1)
        log(f"coreml bucket {b.name} ({b.frames} frames): {seconds[b.name]} s")
    lin = kmodel.decoder.generator.m_source.l_linear
    config = {
        "buckets": [{"name": b.name, "frames": b.frames} for b in buckets],
        "har": {
            "weight": [float(x) for x in lin.weight.detach().reshape(-1)],
            "bias": float(lin.bias.detach().reshape(-1)[0]),
        },
        "deployment_target": DEPLOYMENT_TARGET,
        "precision": "float32",
    }
    (dv / "split_config.json").write_text(json.dumps(config, indent=1), "utf-8")
    return {"buckets": config["buckets"], "seconds": seconds}
