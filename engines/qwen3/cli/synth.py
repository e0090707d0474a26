"""``ttsdock qwen3-synth``: offline Qwen3-TTS synthesis without the dock.

Generates the codec frames for one text (streaming text feeding by default,
``--non-streaming`` to feed it all first), optionally writes them as an int64
``[frames, 16]`` ``.npy`` (no EOS frame) and/or vocodes them to a 16-bit mono
24 kHz WAV, then prints per-stage timings. The vocoder is loaded only for
``--wav-out``. Errors print one line on stderr and exit with status 2.

``--batch REQUESTS.jsonl --codes-dir DIR`` decodes every request of the file
(``batch_file``: one JSON object a line) together, as one batch through the
engine's scheduler, and writes ``DIR/<name>.npy`` per request. A bad line or
a request the checkpoint or the cache cannot take prints one error line
naming it; the others still complete (exit status 2 if any failed).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import wave
from pathlib import Path

import numpy as np

from engines.qwen3.cli.batch_file import BatchLine, BatchLineError, parse_batch
from engines.qwen3.cli.dock import add_model_arguments, add_vocoder_threads, options_from_args
from engines.qwen3.errors import Qwen3TtsError
from engines.qwen3.serving.request import ModeSynthesizeRequest
from engines.qwen3.serving.synthesizer import Qwen3Synthesizer
from engines.qwen3.serving.vocoder import SAMPLES_PER_FRAME
from engines.runtime.synth import SAMPLE_RATE, SynthesisError
from svc.cli import DefaultsFormatter


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ttsdock qwen3-synth",
        description="Synthesise one text offline with Qwen3-TTS (codes and/or WAV).",
        formatter_class=DefaultsFormatter,
    )
    add_model_arguments(p)
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--text", help="text to speak")
    what.add_argument(
        "--batch",
        type=Path,
        help="JSONL file of requests decoded together (needs --codes-dir): one object a line, "
        '{"name", "text", "language"?, "speaker"?, "instruct"?, "non_streaming"?, '
        '"max_frames"?}',
    )
    p.add_argument("--codes-dir", type=Path, help="--batch: write DIR/<name>.npy per request")
    p.add_argument("--codes-out", type=Path, help="write int64 codes [frames,16] (.npy)")
    p.add_argument("--wav-out", type=Path, help="write 16-bit mono 24 kHz WAV")
    add_vocoder_threads(p)
    return p


def write_wav(path: Path, audio: np.ndarray, rate: int = SAMPLE_RATE) -> None:
    """Write float audio in [-1, 1] as 16-bit mono PCM."""
    pcm = (np.clip(audio, -1.0, 1.0) * 32767.0).round().astype("<i2")
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    try:
        args = p.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (argparse exits 2)
        return int(exc.code) if isinstance(exc.code, int) else 2
    try:
        return _run(args)
    except (SynthesisError, ValueError, OSError) as exc:
        print(f"ttsdock qwen3-synth: error: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    if args.batch is not None:
        return _run_batch(args)
    if args.codes_dir is not None:
        raise ValueError("--codes-dir is for --batch (use --codes-out with --text)")
    if not args.text.strip():
        raise ValueError("--text is empty")
    if args.codes_out is None and args.wav_out is None:
        print("note: neither --codes-out nor --wav-out given; timing only")
    for out in (args.codes_out, args.wav_out):
        if out is not None and out.is_dir():
            raise ValueError(f"output {str(out)!r} is a directory")
    opts = options_from_args(args)
    synth = Qwen3Synthesizer(opts)
    t0 = time.perf_counter()
    synth.load(need_vocoder=args.wav_out is not None)
    load_ms = (time.perf_counter() - t0) * 1e3
    req = synth.make_request(args.text, args.speaker)
    assert synth.generator is not None
    t1 = time.perf_counter()
    try:
        codes, timings = synth.generator.generate_codes(req)
    except (TypeError, ValueError) as exc:
        raise SynthesisError(f"qwen3: bad request: {exc}") from exc
    gen_ms = (time.perf_counter() - t1) * 1e3
    codes = np.asarray(codes, dtype=np.int64).reshape(-1, 16)
    frames = codes.shape[0]
    audio_s = frames / 12.5
    print(f"frames: {frames} ({audio_s:.2f} s of audio)")
    print(f"load: {load_ms:.0f} ms")
    for k in ("prefill", "talker", "code_predictor"):
        if k in timings:
            print(f"{k}: {timings[k]:.1f} ms")
    fps = frames / (gen_ms / 1e3) if gen_ms > 0 else 0.0
    print(f"generate: {gen_ms:.1f} ms ({fps:.2f} frames/s)")
    if args.codes_out is not None:
        args.codes_out.parent.mkdir(parents=True, exist_ok=True)
        np.save(args.codes_out, codes)
        print(f"codes: {args.codes_out}")
    if args.wav_out is not None:
        assert synth.vocoder is not None
        t2 = time.perf_counter()
        ref = synth.ref_codes
        if ref is not None:  # ICL: decode with the reference frames as context, drop them
            full = synth.vocoder.decode(np.concatenate([ref, codes]))
            audio = full[ref.shape[0] * SAMPLES_PER_FRAME :]
        else:
            audio = synth.vocoder.decode(codes)
        voc_ms = (time.perf_counter() - t2) * 1e3
        write_wav(args.wav_out, audio)
        print(f"vocoder: {voc_ms:.1f} ms")
        total_s = (gen_ms + voc_ms) / 1e3
        if audio_s > 0:
            print(f"rtf: {total_s / audio_s:.3f} (wall/audio)")
        print(f"wav: {args.wav_out} ({audio.shape[0]} samples @ {SAMPLE_RATE} Hz)")
    synth.close()
    return 0


def _run_batch(args: argparse.Namespace) -> int:
    if args.codes_dir is None:
        raise ValueError("--batch needs --codes-dir")
    if args.codes_out is not None or args.wav_out is not None:
        raise ValueError("--batch writes codes to --codes-dir only (no --codes-out/--wav-out)")
    if args.codes_dir.exists() and not args.codes_dir.is_dir():
        raise ValueError(f"--codes-dir {str(args.codes_dir)!r} is not a directory")
    try:
        text = args.batch.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"--batch {str(args.batch)!r}: cannot be read: {exc}") from exc
    lines = parse_batch(text)
    good = [x for x in lines if isinstance(x, BatchLine)]
    failed = 0
    for bad in lines:
        if isinstance(bad, BatchLineError):
            print(f"ttsdock qwen3-synth: error: {bad.message}", file=sys.stderr)
            failed += 1
    if not good:
        print("ttsdock qwen3-synth: error: no valid request in the batch", file=sys.stderr)
        return 2
    opts = options_from_args(args)
    if opts.max_batch is None:  # one batch: room for every request unless told otherwise
        opts = dataclasses.replace(opts, max_batch=len(good))
    synth = Qwen3Synthesizer(opts)
    t0 = time.perf_counter()
    synth.load(need_vocoder=False)
    print(f"load: {(time.perf_counter() - t0) * 1e3:.0f} ms")
    batching = synth.batching_generator
    if batching is None:
        raise SynthesisError("qwen3: this engine cannot decode batches")
    reqs: list[tuple[str, ModeSynthesizeRequest]] = []
    for line in good:
        try:
            req = synth.make_request(
                line.text,
                line.speaker if line.speaker is not None else args.speaker,
                max_frames=line.max_frames,
                language=line.language,
                instruct=line.instruct,
                non_streaming=line.non_streaming,
            )
        except (SynthesisError, Qwen3TtsError, ValueError) as exc:
            print(
                f"ttsdock qwen3-synth: error: line {line.lineno} (request {line.name!r}): {exc}",
                file=sys.stderr,
            )
            failed += 1
            continue
        reqs.append((line.name, req))
    t1 = time.perf_counter()
    results = batching.generate_batch(reqs)
    wall = time.perf_counter() - t1
    args.codes_dir.mkdir(parents=True, exist_ok=True)
    total = 0
    for res in results:
        if res.error is not None or res.codes is None:
            print(f"ttsdock qwen3-synth: error: {res.error}", file=sys.stderr)
            failed += 1
            continue
        out = args.codes_dir / f"{res.name}.npy"
        np.save(out, np.asarray(res.codes, dtype=np.int64).reshape(-1, 16))
        total += int(res.codes.shape[0])
        print(f"{res.name}: {res.codes.shape[0]} frames -> {out}")
    fps = total / wall if wall > 0 else 0.0
    stats = batching.batch_stats()
    print(
        f"batch: {len(results) - sum(r.error is not None for r in results)} requests, "
        f"{total} frames in {wall * 1e3:.0f} ms ({fps:.1f} frames/s), "
        f"mean batch size {stats.get('batch_size_mean', 0.0):.2f}"
    )
    synth.close()
    return 2 if failed else 0
