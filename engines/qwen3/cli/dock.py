"""``ttsdock qwen3``: run the Qwen3-TTS engine and dock it into ttsdock.

The model is loaded (and every file checked) before the engine docks: a model
it cannot run makes the command fail with one clear line instead of docking.

Concurrent calls are batched by the engine itself (``--max-batch`` rows share
every frame step; more utterances wait in the scheduler's deadline-ordered
queue), so the runtime's ``--max-concurrent`` defaults to
``QWEN3_MAX_CONCURRENT`` here instead of serialising calls.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from engines.qwen3.modes import MODE_CHOICES, SIZES
from engines.qwen3.serving.synthesizer import (
    DEFAULT_LEFT_CONTEXT,
    MAX_FRAMES_CAP,
    Qwen3Options,
    Qwen3Synthesizer,
)
from engines.runtime.cli import text_options
from svc.cli import int_in

#: ``--max-concurrent`` default for Qwen3: the runtime lets this many utterances run
#: their synthesize() threads at once; the batch scheduler admits ``--max-batch`` of
#: them into the batch and queues the rest by deadline.
QWEN3_MAX_CONCURRENT = 256


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """Model/voice flags shared by ``ttsdock qwen3`` and ``ttsdock qwen3-synth``.

    Every help line states its default once, itself or through ``svc.cli.DefaultsFormatter``.
    """
    g = p.add_argument_group("model")
    g.add_argument("--model-dir", type=Path, help="directory with the qwen3-tts-* files")
    g.add_argument(
        "--mode",
        default="customvoice",
        type=str.lower,
        choices=list(MODE_CHOICES),
        help="checkpoint kind",
    )
    g.add_argument(
        "--size", choices=list(SIZES), help="model size (default: the one in --model-dir)"
    )
    g.add_argument(
        "--talker-gguf", type=Path, help="explicit talker GGUF (default: found in --model-dir)"
    )
    g.add_argument(
        "--code-predictor-gguf",
        type=Path,
        help="explicit code predictor GGUF (default: found in --model-dir)",
    )
    g.add_argument(
        "--tokenizer-gguf",
        type=Path,
        help="explicit tokenizer GGUF (default: found in --model-dir)",
    )
    g.add_argument(
        "--vocoder-onnx", type=Path, help="explicit vocoder ONNX (default: found in --model-dir)"
    )
    g.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where the model runs")
    g.add_argument(
        "--dtype",
        choices=["float32", "float16", "bfloat16"],
        default="float32",
        help="weight and activation precision of the talker and code predictor",
    )
    v = p.add_argument_group("voice")
    v.add_argument(
        "--speaker", help="CustomVoice preset speaker, e.g. vivian (default: the first preset)"
    )
    v.add_argument("--language", default="auto", help="language name or auto")
    v.add_argument("--instruct", help="style instruction (CustomVoice/VoiceDesign)")
    v.add_argument("--speaker-embedding", type=Path, help="Base: x-vector .npy file")
    v.add_argument("--ref-codes", type=Path, help="Base voice clone (ICL): reference codes .npy")
    v.add_argument("--ref-text", help="Base voice clone (ICL): transcript of the reference")
    v.add_argument(
        "--clone-prompt",
        type=Path,
        help="Base: voice-clone prompt from ttsdock qwen3-clone-prompt (.npz); its name "
        "(file stem) is the default voice",
    )
    v.add_argument(
        "--clone-prompt-dir",
        type=Path,
        help="Base: directory of prompt .npz files, each a voice (SET_VOICE:<stem>)",
    )
    v.add_argument("--non-streaming", action="store_true", help="feed all text before audio")
    v.add_argument("--greedy", action="store_true", help="argmax instead of sampling")
    v.add_argument("--seed", type=int, help="sampling seed (default: a random one)")
    b = p.add_argument_group("batching")
    b.add_argument(
        "--max-batch",
        type=int_in(1, 1024, "--max-batch"),
        default=None,
        help="utterances decoded together (static KV cache rows; default: 32 on cuda, 4 on cpu)",
    )
    b.add_argument(
        "--max-context",
        type=int_in(16, 1 << 20, "--max-context"),
        default=None,
        help="KV cache positions per row: prompt rows + frames (default: 4096 cuda, 2560 cpu)",
    )
    v.add_argument(
        "--max-frames",
        type=int,  # range checked by options_from_args: one line, like the other errors
        default=MAX_FRAMES_CAP,
        help=f"frames per utterance, 12.5 per second, 1..{MAX_FRAMES_CAP}",
    )


def add_vocoder_threads(p: argparse._ActionsContainer) -> None:
    p.add_argument(
        "--vocoder-threads",
        type=int_in(1, None, "--vocoder-threads"),
        default=None,
        help="ONNX Runtime threads of the vocoder (default: ONNX Runtime's choice)",
    )


def options_from_args(args: argparse.Namespace) -> Qwen3Options:
    """Build ``Qwen3Options`` from parsed flags; ValueError names a bad combination."""
    if args.model_dir is None and args.talker_gguf is None:
        raise ValueError("give --model-dir (or explicit --talker-gguf ...)")
    if not 1 <= args.max_frames <= MAX_FRAMES_CAP:
        raise ValueError(f"--max-frames must be in 1..{MAX_FRAMES_CAP}, got {args.max_frames}")
    return Qwen3Options(
        model_dir=args.model_dir,
        mode=args.mode,
        size=args.size,
        talker_gguf=args.talker_gguf,
        code_predictor_gguf=args.code_predictor_gguf,
        tokenizer_gguf=args.tokenizer_gguf,
        vocoder_onnx=args.vocoder_onnx,
        speaker=args.speaker,
        language=args.language,
        instruct=args.instruct,
        speaker_embedding=args.speaker_embedding,
        ref_codes=args.ref_codes,
        ref_text=args.ref_text,
        clone_prompt=args.clone_prompt,
        clone_prompt_dir=args.clone_prompt_dir,
        device=args.device,
        dtype=args.dtype,
        greedy=args.greedy,
        seed=args.seed,
        non_streaming=args.non_streaming,
        max_frames=args.max_frames,
        text=text_options(args),
        max_batch=args.max_batch,
        max_context=args.max_context,
        **({"vocoder_threads": args.vocoder_threads} if "vocoder_threads" in args else {}),
        **({"chunk_frames": args.chunk_frames} if "chunk_frames" in args else {}),
        **({"first_chunk_frames": args.first_chunk_frames} if "first_chunk_frames" in args else {}),
        **({"left_context": args.left_context} if "left_context" in args else {}),
    )


def build_parser() -> argparse.ArgumentParser:
    from engines.runtime.cli import common_parser

    p = common_parser(
        "qwen3",
        description="Qwen3-TTS engine (GGUF + ONNX vocoder) for ttsdock",
        max_concurrent=QWEN3_MAX_CONCURRENT,
    )
    add_model_arguments(p)
    s = p.add_argument_group("streaming")
    s.add_argument(
        "--chunk-frames",
        type=int_in(1, None, "--chunk-frames"),
        default=4,
        help="codec frames per vocoder chunk",
    )
    s.add_argument(
        "--first-chunk-frames",
        type=int_in(1, None, "--first-chunk-frames"),
        default=None,
        help="frames in the first chunk (default: a ramp 1, 2, 4, ... up to --chunk-frames)",
    )
    s.add_argument(
        "--left-context",
        type=int_in(0, None, "--left-context"),
        default=DEFAULT_LEFT_CONTEXT,
        help="earlier frames decoded with each chunk (one 72-frame attention window; "
        "benchmarks/qwen3_vocoder_context.py measures the trade-off)",
    )
    add_vocoder_threads(s)
    return p


def main(argv: list[str] | None = None) -> int:
    from engines.runtime.cli import run_engine

    p = build_parser()
    args = p.parse_args(argv)
    try:
        opts = options_from_args(args)
        synth = Qwen3Synthesizer(opts)
    except ValueError as exc:
        p.error(str(exc))
    return int(run_engine(synth, args))
