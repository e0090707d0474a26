"""Random-weight Kokoro checkpoints written by the official ``kokoro`` package (test oracle).

The tiny config keeps every width the decoder hard-codes (512/1024 channels,
the iSTFT sizes) and shrinks what the config controls (PL-BERT, the number of
predictor layers, one generator residual kernel). ``REAL_CONFIG`` is
Kokoro-82M's architecture (hexgrad/Kokoro-82M ``config.json``; the shipped
ONNX graph's weight shapes are consistent with it).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from engines.kokoro.models import load_vocab

_ISTFTNET = {
    "upsample_kernel_sizes": [20, 12],
    "upsample_rates": [10, 6],
    "gen_istft_hop_size": 5,
    "gen_istft_n_fft": 20,
    "upsample_initial_channel": 512,
}
_COMMON = {
    "n_token": 178,
    "hidden_dim": 512,
    "style_dim": 128,
    "max_dur": 50,
    "dropout": 0.2,
    "n_mels": 80,
    "text_encoder_kernel_size": 5,
    "max_conv_dim": 512,
    "dim_in": 64,
    "multispeaker": True,
}


def tiny_config() -> dict[str, Any]:
    return {
        **_COMMON,
        "vocab": load_vocab(),
        "n_layer": 1,
        "plbert": {
            "hidden_size": 32,
            "num_attention_heads": 2,
            "intermediate_size": 64,
            "max_position_embeddings": 512,
            "num_hidden_layers": 2,
            "embedding_size": 16,
            "dropout": 0.1,
        },
        "istftnet": {
            **_ISTFTNET,
            "resblock_kernel_sizes": [3],
            "resblock_dilation_sizes": [[1, 3, 5]],
        },
    }


def real_config() -> dict[str, Any]:
    return {
        **_COMMON,
        "vocab": load_vocab(),
        "n_layer": 3,
        "plbert": {
            "hidden_size": 768,
            "num_attention_heads": 12,
            "intermediate_size": 2048,
            "max_position_embeddings": 512,
            "num_hidden_layers": 12,
            "dropout": 0.1,
        },
        "istftnet": {
            **_ISTFTNET,
            "resblock_kernel_sizes": [3, 7, 11],
            "resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5], [1, 3, 5]],
        },
    }


def random_kmodel(config: dict[str, Any], seed: int = 0) -> Any:
    """The official ``KModel`` with its own random initialisation, durations made speech-like.

    Random weights give every token ~25 frames (half of ``max_dur``'s sigmoids);
    a bias on ``duration_proj`` brings that to 2-10 frames so sentences stay short.
    And random weights predict F0 near 0 Hz: all unvoiced, the excitation pure
    noise. A bias on ``F0_proj`` puts F0 around 120 Hz, so the harmonic source
    (the deterministic part of the excitation) drives the audio as in speech.
    """
    import torch

    from engines.kokoro.convert.checkpoint import _skeleton

    torch.manual_seed(seed)
    model = _skeleton(config)
    with torch.no_grad():
        lin = model.predictor.duration_proj.linear_layer
        lin.bias.copy_(torch.randn_like(lin.bias) * 0.3 - 2.3)
        model.predictor.F0_proj.bias.fill_(120.0)
    return model.eval()


def write_checkpoint(
    out_dir: Path, config: dict[str, Any] | None = None, seed: int = 0, voices: int = 1
) -> tuple[Path, Path, list[Path]]:
    """``kokoro.pth``, ``config.json`` and ``df_test<i>.pt`` voices (510 x 1 x 256)."""
    import torch

    from engines.kokoro.convert.checkpoint import MODULES

    config = config or tiny_config()
    model = random_kmodel(config, seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    ckpt = out_dir / "kokoro.pth"
    torch.save({name: getattr(model, name).state_dict() for name in MODULES}, ckpt)
    cfg = out_dir / "config.json"
    cfg.write_text(json.dumps(config, ensure_ascii=False), "utf-8")
    rng = np.random.default_rng(seed + 100)
    paths = []
    for i in range(voices):
        pack = (rng.standard_normal((510, 1, 256)) * 0.15).astype(np.float32)
        path = out_dir / f"df_test{i}.pt"
        torch.save(torch.from_numpy(pack), path)
        paths.append(path)
    return ckpt, cfg, paths


def probe_tokens(vocab: dict[str, int], n: int, seed: int = 0) -> list[int]:
    rng = np.random.default_rng(seed)
    ids = sorted(set(vocab.values()))
    return [int(x) for x in rng.choice(ids, size=n)]


_CONVERTED: dict[str, Path] = {}


def converted_models(tmp_path_factory: Any) -> Path:
    """A tiny random checkpoint (one voice ``df_test0``) through ``kokoro-convert``, once per
    session: the models dir holding ``kokoro-german/``. Wrap in a module fixture."""
    if "dir" not in _CONVERTED:
        from engines.kokoro.convert.cli import main

        base = tmp_path_factory.mktemp("kokoro-convert")
        ckpt, cfg, voices = write_checkpoint(base / "src")
        out = base / "models"
        argv = ["--checkpoint", str(ckpt), "--config", str(cfg), "--out", str(out)]
        rc = main([*argv, "--voice", str(voices[0]), "--variant", "german"])
        assert rc == 0, "kokoro-convert failed on the tiny checkpoint"
        _CONVERTED["dir"] = out
        _CONVERTED["src"] = base / "src"
    return _CONVERTED["dir"]


def official_model(src: Path) -> Any:
    """The oracle: ``KModel`` built by the official constructor from the local files."""
    from kokoro import KModel

    return KModel(
        repo_id="hexgrad/Kokoro-82M",
        config=str(src / "config.json"),
        model=str(src / "kokoro.pth"),
        disable_complex=True,
    ).eval()


def source_dir() -> Path:
    return _CONVERTED["src"]


def held_noise_copy(variant_dir: Path, dst: Path, seed: int, max_samples: int = 400_000) -> Path:
    """A re-stamped copy of a converted directory whose float32 graphs read their noise from
    a constant: the first ``samples`` rows of ``default_rng(seed).standard_normal((1,
    max_samples, 9))``, which are exactly what ``validate.held_noise(seed)`` hands the
    official forward (numpy draws in order). So a whole-sentence render in the engine
    holds the noise equal to the official one. Returns ``dst/kokoro-<variant>``."""
    import hashlib
    import shutil

    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from engines.kokoro.converted import MANIFEST

    out = dst / variant_dir.name
    shutil.copytree(variant_dir, out)
    manifest = json.loads((out / MANIFEST).read_text("utf-8"))
    table = np.random.default_rng(seed).standard_normal((1, max_samples, 9)).astype(np.float32)
    for name in ("kokoro-f32.onnx", "kokoro-f32.decoder"):
        model = onnx.load(str(out / name))
        (node,) = [n for n in model.graph.node if n.op_type == "RandomNormalLike"]
        pos = list(model.graph.node).index(node)
        model.graph.node.remove(node)
        base = node.output[0]
        model.graph.initializer.append(numpy_helper.from_array(table, base + "/table"))
        model.graph.initializer.append(
            helper.make_tensor(base + "/zeros", TensorProto.INT64, [3], [0, 0, 0])
        )
        nodes = [
            helper.make_node("Shape", [node.input[0]], [base + "/shape"]),
            helper.make_node("Slice", [base + "/table", base + "/zeros", base + "/shape"], [base]),
        ]
        for k, n in enumerate(nodes):
            model.graph.node.insert(pos + k, n)
        onnx.save(model, str(out / name))
        manifest["files"][name] = hashlib.sha256((out / name).read_bytes()).hexdigest()
    (out / MANIFEST).write_text(json.dumps(manifest), "utf-8")
    return out
