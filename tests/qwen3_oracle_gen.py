"""Regenerate the Qwen3-TTS golden outputs with the official ``qwen-tts`` package.

Run in the oracle venv (see .dev/COMMON.md / the qwen3 report)::

    .dev/oracle-venv/bin/python tests/qwen3_oracle_gen.py [--out tests/golden/qwen3] [--time]

It builds tiny official models (custom_voice 1.7B-style with a 64->32
projection, voice_design 48->32, base 0.6B-style with equal widths), loads
the deterministic weights of ``tests/qwen3_helpers.py`` into them, tokenises
the chat templates with the Hugging Face Qwen2 tokenizer built from the tiny
tokenizer files, runs official greedy ``generate`` for every case and writes
``cases.json`` (ids, settings, codes) plus ``prefill.npz`` (talker prefill and
trailing rows). Only configs and tokenizer files are stored; weights are
re-derived from the configs by both sides.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import json
import sys
import time
import types
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import qwen3_helpers as qh  # noqa: E402

#: Models: kind -> tiny_config kwargs.
MODELS: dict[str, dict[str, Any]] = {
    "custom_voice": {"size": "1b7", "hidden": 64, "cp_hidden": 32},
    "voice_design": {"size": "1b7", "hidden": 48, "cp_hidden": 32},
    "base": {"size": "0b6", "hidden": 32, "cp_hidden": 32},
}
MAX_FRAMES = 24  # official max_new_tokens = MAX_FRAMES + 1 (it yields N-1 frames)

CASES: list[dict[str, Any]] = [
    {
        "name": "customvoice_nonstreaming",
        "model": "custom_voice",
        "text": "Hello world, the quick brown fox.",
        "language": "english",
        "speaker": "ryan",
        "non_streaming": True,
    },
    {
        "name": "customvoice_dialect_auto",
        "model": "custom_voice",
        "text": "Hello world, how are you today?",
        "language": "auto",
        "speaker": "eric",
        "non_streaming": False,
    },
    {
        "name": "customvoice_instruct_streaming",
        "model": "custom_voice",
        "text": "The quick brown fox is a test of speech.",
        "language": "english",
        "speaker": "vivian",
        "instruct": "Speak warmly and slowly.",
        "non_streaming": False,
    },
    {
        "name": "voicedesign_instruct",
        "model": "voice_design",
        "text": "Hello world, this is a test.",
        "language": "auto",
        "instruct": "A calm deep voice.",
        "non_streaming": True,
    },
    {
        "name": "voicedesign_streaming",
        "model": "voice_design",
        "text": "Hallo Welt, how are you?",
        "language": "german",
        "instruct": "A calm voice, speak slowly.",
        "non_streaming": False,
    },
    {
        "name": "base_xvector",
        "model": "base",
        "text": "Hello world, the quick brown fox.",
        "language": "english",
        "xvector": True,
        "non_streaming": False,
    },
    {
        "name": "base_icl_streaming",
        "model": "base",
        "text": "The quick brown fox is a test of speech today.",
        "language": "english",
        "icl": {"ref_text": "This is the reference text.", "frames": 5},
        "non_streaming": False,
    },
    {
        "name": "base_icl_nonstreaming",
        "model": "base",
        "text": "The quick brown fox is a test of speech today.",
        "language": "auto",
        "icl": {"ref_text": "This is the reference text.", "frames": 5},
        "non_streaming": True,
    },
    {
        "name": "base_icl_long_reference",
        "model": "base",
        "text": "Hello world.",
        "language": "english",
        "icl": {"ref_text": "Hello.", "frames": 12},
        "non_streaming": False,
    },
]


def stub_torchaudio() -> None:
    """torchaudio on PyPI cannot load against torch 2.13; only the 25 Hz tokenizer needs it."""
    ta = types.ModuleType("torchaudio")
    ta.__path__ = []  # type: ignore[attr-defined]
    comp = types.ModuleType("torchaudio.compliance")
    comp.__path__ = []  # type: ignore[attr-defined]
    kaldi = types.ModuleType("torchaudio.compliance.kaldi")
    ta.compliance = comp  # type: ignore[attr-defined]
    comp.kaldi = kaldi  # type: ignore[attr-defined]
    for mod in (ta, comp, kaldi):
        mod.__spec__ = importlib.machinery.ModuleSpec(
            mod.__name__, None, is_package=hasattr(mod, "__path__")
        )
    sys.modules.setdefault("torchaudio", ta)
    sys.modules.setdefault("torchaudio.compliance", comp)
    sys.modules.setdefault("torchaudio.compliance.kaldi", kaldi)


def build_official(kind: str) -> tuple[Any, dict[str, Any]]:
    """The official model for ``kind`` with the deterministic weights; returns (model, config)."""
    stub_torchaudio()
    import torch
    from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSConfig
    from qwen_tts.core.models.modeling_qwen3_tts import Qwen3TTSForConditionalGeneration

    cfg_dict = qh.tiny_config(kind, **MODELS[kind])
    kwargs = {k: v for k, v in cfg_dict.items() if k != "model_type"}
    cfg = Qwen3TTSConfig(**kwargs)
    torch.manual_seed(0)
    model = Qwen3TTSForConditionalGeneration(cfg).eval()
    arrays = qh.state_dict_arrays(cfg_dict)
    state = {k: torch.from_numpy(v.copy()) for k, v in arrays.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    bad_missing = [m for m in missing if not m.startswith("speaker_encoder.")]
    if bad_missing or unexpected:
        raise SystemExit(
            f"{kind}: state dict mismatch: missing={bad_missing} unexpected={unexpected}"
        )
    return model, json.loads(cfg.to_json_string())


def hf_tokenizer(model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    for tid, text in qh.SPECIAL_TOKENS.items():
        got = tok.convert_tokens_to_ids(text)
        if got != tid:
            raise SystemExit(f"HF tokenizer gives {text} id {got}, expected {tid}")
    return tok


def run_case(model: Any, tok: Any, case: dict[str, Any], width: int) -> dict[str, Any]:
    import torch

    def ids(s: str) -> list[int]:
        return [int(i) for i in tok(s, return_tensors="pt")["input_ids"][0].tolist()]

    input_ids = ids(f"<|im_start|>assistant\n{case['text']}<|im_end|>\n<|im_start|>assistant\n")
    instruct_ids = (
        ids(f"<|im_start|>user\n{case['instruct']}<|im_end|>\n") if case.get("instruct") else None
    )
    kwargs: dict[str, Any] = {}
    ref_ids = None
    out: dict[str, Any] = dict(case)
    if case.get("xvector") or case.get("icl"):
        vec = torch.from_numpy(qh.xvector(width))
        if case.get("icl"):
            code = torch.from_numpy(qh.ref_codes(case["icl"]["frames"]))
            ref_ids = ids(f"<|im_start|>assistant\n{case['icl']['ref_text']}<|im_end|>\n")
            kwargs["voice_clone_prompt"] = {
                "ref_code": [code],
                "ref_spk_embedding": [vec],
                "x_vector_only_mode": [False],
                "icl_mode": [True],
            }
            kwargs["ref_ids"] = [torch.tensor([ref_ids])]
        else:
            kwargs["voice_clone_prompt"] = {
                "ref_code": [None],
                "ref_spk_embedding": [vec],
                "x_vector_only_mode": [True],
                "icl_mode": [False],
            }
    captured: dict[str, Any] = {}
    orig = model.talker.generate

    def hook(*a: Any, **kw: Any) -> Any:
        captured["rows"] = kw["inputs_embeds"][0].detach().clone()
        captured["trailing"] = kw["trailing_text_hidden"][0].detach().clone()
        return orig(*a, **kw)

    model.talker.generate = hook
    try:
        t0 = time.perf_counter()
        codes, _ = model.generate(
            input_ids=[torch.tensor([input_ids])],
            instruct_ids=[torch.tensor([instruct_ids])] if instruct_ids else None,
            languages=[case["language"]],
            speakers=[case.get("speaker")],
            non_streaming_mode=case["non_streaming"],
            max_new_tokens=MAX_FRAMES + 1,
            do_sample=False,
            subtalker_dosample=False,
            repetition_penalty=1.05,
            **kwargs,
        )
        wall = time.perf_counter() - t0
    finally:
        model.talker.generate = orig
    c = codes[0].cpu().numpy().astype(np.int64)
    out.update(
        input_ids=input_ids,
        instruct_ids=instruct_ids,
        ref_ids=ref_ids,
        max_frames=MAX_FRAMES,
        codes=c.tolist(),
        official_seconds=round(wall, 3),
    )
    out["_rows"] = captured["rows"].float().numpy()
    out["_trailing"] = captured["trailing"].float().numpy()
    return out


def generate(out_dir: Path, *, cases: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Build the models, run the cases, return ``{"cases": [...], "arrays": {...}}``."""
    results: list[dict[str, Any]] = []
    arrays: dict[str, np.ndarray] = {}
    models: dict[str, tuple[Any, Any, int]] = {}
    for case in cases or CASES:
        kind = case["model"]
        if kind not in models:
            model, cfg = build_official(kind)
            mdir = out_dir / kind
            mdir.mkdir(parents=True, exist_ok=True)
            (mdir / "config.json").write_text(json.dumps(cfg, indent=1, sort_keys=True) + "\n")
            qh.write_tiny_tokenizer(mdir)
            models[kind] = (model, hf_tokenizer(mdir), cfg["talker_config"]["hidden_size"])
        model, tok, width = models[kind]
        res = run_case(model, tok, case, width)
        arrays[f"{case['name']}.rows"] = res.pop("_rows")
        arrays[f"{case['name']}.trailing"] = res.pop("_trailing")
        results.append(res)
        print(f"{case['name']}: {len(res['codes'])} frames in {res['official_seconds']} s")
    return {"cases": results, "arrays": arrays}


def time_official(kind: str = "custom_voice", frames: int = 40, repeats: int = 2) -> float:
    """Official greedy ``generate`` frames/s on the tiny config (best of ``repeats``)."""
    import torch

    torch.set_flush_denormal(True)
    model, _ = build_official(kind)
    ids = torch.tensor([[151644, 77091, 198, 312, 317, 151645, 198, 151644, 77091, 198]])
    best = 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        codes, _ = model.generate(
            input_ids=[ids],
            languages=["english"],
            speakers=["ryan"],
            non_streaming_mode=False,
            max_new_tokens=frames + 1,
            do_sample=False,
            subtalker_dosample=False,
            repetition_penalty=1.05,
        )
        n = int(codes[0].shape[0])
        best = max(best, n / (time.perf_counter() - t0))
    return best


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=qh.GOLDEN)
    p.add_argument("--time", action="store_true", help="also time official generate()")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    args = p.parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    res = generate(out)
    doc = {
        "about": (
            "Official qwen-tts 0.1.1 greedy outputs (repetition_penalty 1.05) for tiny models; "
            "weights: tests/qwen3_helpers.py state_dict_arrays(config.json); regenerate with "
            "tests/qwen3_oracle_gen.py in the oracle venv"
        ),
        "cases": res["cases"],
    }
    (out / "cases.json").write_text(json.dumps(doc, indent=1) + "\n")
    np.savez_compressed(out / "prefill.npz", **res["arrays"])
    if args.time:
        fps = time_official()
        print(f"official generate(): {fps:.2f} frames/s (tiny custom_voice, greedy)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
