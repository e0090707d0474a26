"""``ttsdock kokoro-convert``: a Kokoro checkpoint -> ``<out>/kokoro-<variant>/``, validated.

Rule 1: every input is checked before anything is written; the output is
built in a hidden directory beside the target and moved into place only when
the whole conversion and its validation passed: no partial output, ever.
Rule 2: bad input (files, keys, shapes, an unwritable ``--out``) is exit 2 with
a message naming the file, the key and the reason; a graph that fails its
validation is exit 1 with the measured numbers.

Written (``engines.kokoro.converted`` documents the manifest)::

    vocab.json                 the config's phoneme table
    <voice>_voice.bin          each --voice, raw float32 rows x 256
    kokoro-f32.onnx            whole graph (--no-split): tokens, style, speed -> audio, durations
    kokoro-f32.prosody/.decoder  the two stages the engine streams from
    kokoro-int8.onnx/.prosody/.decoder  the same, onnxruntime dynamic int8
    converted.json             sha256 of every file, the source, the validation numbers
    coreml/, decoder_variants/ with --coreml (engines.kokoro.coreml's layout)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from engines.kokoro.convert.checkpoint import ConversionError

DEFAULT_VARIANT = "german"
#: Validation probes: (tokens, speed, seed); token ids drawn from the config's vocabulary.
PROBES = ((20, 1.0, 1), (48, 1.15, 2))


class ValidationFailed(Exception):
    """An exported graph is outside its tolerance (exit 1)."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ttsdock kokoro-convert",
        description="Convert a Kokoro-82M torch checkpoint (.pth + config.json + voice .pt files) "
        "into <out>/kokoro-<variant>/ for `ttsdock kokoro --models-dir OUT --variant NAME`: "
        "vocab, voices, the two streaming stages and the whole graph in float32 and int8, each "
        "validated against the official kokoro package; --coreml adds the CoreML layout.",
    )
    p.add_argument("--checkpoint", type=Path, required=True, help="Kokoro torch checkpoint (.pth)")
    p.add_argument("--config", type=Path, required=True, help="the checkpoint's config.json")
    p.add_argument(
        "--voice",
        type=Path,
        action="append",
        default=[],
        help="voice .pt (rows x 1 x 256), written as <name>_voice.bin; repeatable",
    )
    p.add_argument("--out", type=Path, required=True, help="models directory to write into")
    p.add_argument(
        "--variant",
        default=DEFAULT_VARIANT,
        help=f"writes <out>/kokoro-<variant>/ (default: {DEFAULT_VARIANT})",
    )
    p.add_argument(
        "--coreml",
        action="store_true",
        help="also write the CoreML layout (duration model, 3/5/10 s decoder buckets, "
        "split_config.json); needs the [kokoro-export] extra (coremltools)",
    )
    return p


def _probe_style(voices: dict[str, Any], n_tokens: int, seed: int) -> Any:
    if voices:
        pack = next(iter(voices.values()))
        return pack[min(n_tokens, len(pack)) - 1]
    return (np.random.default_rng(seed).standard_normal(256) * 0.15).astype(np.float32)


def convert(args: argparse.Namespace, log: Any = print) -> Path:
    """Run the conversion; returns the written directory."""
    import onnx

    from engines.kokoro import converted as layout
    from engines.kokoro.convert import onnx_export as ox
    from engines.kokoro.convert import validate as va
    from engines.kokoro.convert.checkpoint import (
        build_kmodel,
        load_config,
        load_voice,
        remove_weight_norm,
    )

    variant = str(args.variant)
    if not variant or "/" in variant or variant.startswith("."):
        raise ConversionError(f"--variant {variant!r}: not a plain directory name")
    t0 = time.monotonic()
    config = load_config(args.config)
    kmodel = build_kmodel(config, args.checkpoint, args.config)
    voices: dict[str, Any] = {}
    for path in args.voice:
        name = path.stem.removesuffix("_voice")
        if name in voices:
            raise ConversionError(f"voice {path}: a second voice named {name!r}")
        voices[name] = load_voice(path)
    target = args.out / f"kokoro-{variant}"
    try:
        args.out.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".kokoro-{variant}.", dir=args.out))
    except OSError as exc:
        raise ConversionError(f"output directory {args.out}: not writable ({exc})") from None
    try:
        n_params = sum(p.numel() for p in kmodel.parameters())
        log(f"checkpoint {args.checkpoint}: {n_params} parameters")
        vocab = {k: int(v) for k, v in config["vocab"].items()}
        (staging / "vocab.json").write_text(
            json.dumps({"vocab": vocab}, ensure_ascii=False, indent=1), "utf-8"
        )
        for name, pack in voices.items():
            np.ascontiguousarray(pack, dtype="<f4").tofile(staging / f"{name}_voice.bin")
        ids = sorted(set(vocab.values()))
        references = []
        for n, speed, seed in PROBES:
            tokens = [int(x) for x in np.random.default_rng(seed).choice(ids, size=n)]
            style = _probe_style(voices, n, seed)
            references.append(va.official_forward(kmodel, tokens, style, speed, seed))
        t_ref = time.monotonic()
        remove_weight_norm(kmodel)
        whole32, prosody32, decoder32 = layout.stage_names(layout.GRAPHS["float32"])
        ox.export_stages(kmodel, staging / prosody32, staging / decoder32)
        prosody, decoder = onnx.load(str(staging / prosody32)), onnx.load(str(staging / decoder32))
        onnx.save(ox.merge_whole(prosody, decoder), str(staging / whole32))
        t_export = time.monotonic()
        whole8, prosody8, decoder8 = layout.stage_names(layout.GRAPHS["int8"])
        ox.quantize_int8(staging / prosody32, staging / prosody8)
        ox.quantize_int8(staging / decoder32, staging / decoder8)
        p8, d8 = onnx.load(str(staging / prosody8)), onnx.load(str(staging / decoder8))
        onnx.save(ox.merge_whole(p8, d8), str(staging / whole8))
        t_int8 = time.monotonic()
        validation: dict[str, Any] = {}
        failures = []
        for precision, (whole, pros, dec), tolerance in (
            ("float32", (whole32, prosody32, decoder32), va.FLOAT32_TOLERANCE_DB),
            ("int8", (whole8, prosody8, decoder8), va.INT8_TOLERANCE_DB),
        ):
            sw = va.session(ox.noise_as_input(onnx.load(str(staging / whole))))
            sp = va.session(str(staging / pros))
            sd = va.session(ox.noise_as_input(onnx.load(str(staging / dec))))
            rows = []
            for ref in references:
                for kind, j in (
                    ("whole", va.judge_whole(sw, ref)),
                    ("stages", va.judge_stages(sp, sd, ref)),
                ):
                    rows.append(
                        {
                            "graph": kind,
                            "tokens": int(ref.tokens.shape[1]),
                            "speed": ref.speed,
                            "durations_equal": j.durations_equal,
                            "spectral_distance_db": round(j.distance_db, 4),
                        }
                    )
                    log(
                        f"validate {precision} {kind} ({ref.tokens.shape[1]} tokens, speed "
                        f"{ref.speed}): durations {'identical' if j.durations_equal else 'DIFFER'}"
                        f", spectral distance {j.distance_db:.3f} dB (tolerance {tolerance} dB)"
                    )
                    if not j.passes(tolerance):
                        failures.append(f"{precision} {kind}: {j}")
            validation[precision] = {"tolerance_db": tolerance, "checks": rows}
        if failures:
            raise ValidationFailed("; ".join(failures))
        t_valid = time.monotonic()
        coreml: dict[str, Any] | None = None
        if args.coreml:
            from engines.kokoro.convert.coreml_export import export_coreml

            coreml = export_coreml(kmodel, staging, log=log)
        t_coreml = time.monotonic()
        files = {p.name: _sha256(p) for p in sorted(staging.iterdir()) if p.is_file()}
        graphs = {}
        for precision, stem in layout.GRAPHS.items():
            whole, pros, dec = layout.stage_names(stem)
            graphs[whole] = {"precision": precision, "prosody": pros, "decoder": dec}
        manifest = {
            "format": layout.FORMAT,
            "version": layout.VERSION,
            "files": files,
            "graphs": graphs,
            "source": {
                "checkpoint": args.checkpoint.name,
                "checkpoint_sha256": _sha256(args.checkpoint),
                "config_sha256": _sha256(args.config),
                "voices": {p.name: _sha256(p) for p in args.voice},
            },
            "validation": validation,
            "coreml": coreml,
            "seconds": {
                "reference": round(t_ref - t0, 1),
                "export": round(t_export - t_ref, 1),
                "int8": round(t_int8 - t_export, 1),
                "validation": round(t_valid - t_int8, 1),
                "coreml": round(t_coreml - t_valid, 1),
            },
        }
        (staging / layout.MANIFEST).write_text(json.dumps(manifest, indent=1), "utf-8")
        old = None
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".kokoro-{variant}.old.", dir=args.out))
            os.replace(target, old / target.name)
        os.replace(staging, target)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    log(f"wrote {target} in {time.monotonic() - t0:.1f} s")
    return target


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # KModel only ever reads local files
    args = build_parser().parse_args(argv)
    try:
        convert(args)
    except ConversionError as exc:
        print(f"kokoro-convert: error: {exc}", file=sys.stderr)
        return 2
    except ValidationFailed as exc:
        print(f"kokoro-convert: validation failed, nothing written: {exc}", file=sys.stderr)
        return 1
    except ImportError as exc:
        print(
            f"kokoro-convert: error: {exc}; install the [kokoro-export] extra "
            "(pip install 'ttsdock[kokoro-export]')",
            file=sys.stderr,
        )
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
