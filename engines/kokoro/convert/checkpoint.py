"""The user's files in: config, checkpoint and voices checked, and ``KModel`` built offline.

Rule 1: every check here raises ``ConversionError`` naming the file, the key
and the reason; nothing is written.
Rule 2: ``KModel`` is only ever given a local config dict and a local
checkpoint (never a hub id to fetch): it is built on an empty checkpoint and
the real weights are then loaded strictly here, because ``KModel`` itself
falls back to a non-strict load that would hide a mismatch.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

#: Top-level modules of a Kokoro checkpoint (``KModel`` attributes).
MODULES = ("bert", "bert_encoder", "predictor", "text_encoder", "decoder")
#: Config keys ``KModel`` reads.
CONFIG_KEYS = (
    "vocab",
    "n_token",
    "plbert",
    "hidden_dim",
    "style_dim",
    "n_layer",
    "max_dur",
    "dropout",
    "text_encoder_kernel_size",
    "n_mels",
    "istftnet",
)
ISTFTNET_KEYS = (
    "upsample_kernel_sizes",
    "upsample_rates",
    "gen_istft_hop_size",
    "gen_istft_n_fft",
    "resblock_dilation_sizes",
    "resblock_kernel_sizes",
    "upsample_initial_channel",
)
VOICE_DIM = 256
REPO_ID = "hexgrad/Kokoro-82M"  # only silences KModel's warning; nothing is fetched


class ConversionError(Exception):
    """A user-facing reason why the conversion cannot run (exit status 2)."""


def load_config(path: Path) -> dict[str, Any]:
    """The checkpoint's ``config.json``, with every key ``KModel`` reads."""
    try:
        config = json.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        raise ConversionError(f"config {path}: file does not exist") from None
    except (OSError, ValueError) as exc:
        raise ConversionError(f"config {path}: not readable JSON ({exc})") from None
    if not isinstance(config, dict):
        raise ConversionError(f"config {path}: not a JSON object")
    for key in CONFIG_KEYS:
        if key not in config:
            raise ConversionError(f"config {path}: key {key!r} missing")
    vocab = config["vocab"]
    if not isinstance(vocab, dict) or not vocab:
        raise ConversionError(f"config {path}: key 'vocab' is not a non-empty object")
    for sym, idx in vocab.items():
        if not isinstance(idx, int) or not 0 < idx < int(config["n_token"]):
            raise ConversionError(
                f"config {path}: key 'vocab' entry {sym!r} -> {idx!r} outside 1..n_token-1"
            )
    if not isinstance(config["istftnet"], dict):
        raise ConversionError(f"config {path}: key 'istftnet' is not an object")
    for key in ISTFTNET_KEYS:
        if key not in config["istftnet"]:
            raise ConversionError(f"config {path}: key 'istftnet.{key}' missing")
    return config


def load_checkpoint(path: Path) -> dict[str, dict[str, Any]]:
    """The checkpoint's module state dicts (``{"bert": {...}, ...}``), without ``module.``."""
    import torch

    if not path.is_file():
        raise ConversionError(f"checkpoint {path}: file does not exist")
    try:
        raw = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ConversionError(f"checkpoint {path}: not a torch checkpoint ({exc})") from None
    if not isinstance(raw, dict):
        raise ConversionError(f"checkpoint {path}: not a dict of module state dicts")
    out: dict[str, dict[str, Any]] = {}
    for name in MODULES:
        if name not in raw:
            raise ConversionError(f"checkpoint {path}: module {name!r} missing")
        sd = raw[name]
        if not isinstance(sd, dict):
            raise ConversionError(f"checkpoint {path}: module {name!r} is not a state dict")
        if sd and all(k.startswith("module.") for k in sd):  # saved from DataParallel
            sd = {k[len("module.") :]: v for k, v in sd.items()}
        out[name] = sd
    return out


def _skeleton(config: dict[str, Any]) -> Any:
    """``KModel`` of ``config`` with its own random initialisation (an empty checkpoint)."""
    import torch
    from kokoro import KModel

    fd, empty = tempfile.mkstemp(suffix=".pth")
    os.close(fd)
    try:
        torch.save({}, empty)
        return KModel(repo_id=REPO_ID, config=config, model=empty, disable_complex=True)
    finally:
        os.unlink(empty)


def build_kmodel(config: dict[str, Any], checkpoint: Path, config_path: Path) -> Any:
    """The official ``KModel`` (``disable_complex=True``) with the checkpoint loaded strictly.

    A module, key or shape the config does not expect is a ``ConversionError``
    naming the key, both files and both shapes.
    """
    states = load_checkpoint(checkpoint)
    try:
        model = _skeleton(config)
    except Exception as exc:
        raise ConversionError(f"config {config_path}: KModel cannot be built ({exc})") from None
    for name in MODULES:
        module = getattr(model, name)
        want = module.state_dict()
        have = states[name]
        for key, tensor in want.items():
            if key not in have:
                raise ConversionError(
                    f"checkpoint {checkpoint}: key {name}.{key} missing "
                    f"(the config {config_path} builds it)"
                )
            got = tuple(have[key].shape)
            if got != tuple(tensor.shape):
                raise ConversionError(
                    f"checkpoint {checkpoint}: key {name}.{key} has shape {got}, but the "
                    f"config {config_path} gives {tuple(tensor.shape)}"
                )
        extra = sorted(set(have) - set(want))
        if extra:
            raise ConversionError(
                f"checkpoint {checkpoint}: key {name}.{extra[0]} is not in the model the "
                f"config {config_path} describes ({len(extra)} such keys)"
            )
        module.load_state_dict(have, strict=True)
    return model.eval()


def load_voice(path: Path) -> npt.NDArray[np.float32]:
    """A voice ``.pt`` (rows x 1 x 256 or rows x 256) as float32 rows x 256."""
    import torch

    if not path.is_file():
        raise ConversionError(f"voice {path}: file does not exist")
    try:
        tensor = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ConversionError(f"voice {path}: not a torch tensor file ({exc})") from None
    if not isinstance(tensor, torch.Tensor):
        raise ConversionError(f"voice {path}: holds a {type(tensor).__name__}, not a tensor")
    shape = tuple(tensor.shape)
    if len(shape) == 3 and shape[1] == 1:
        tensor = tensor[:, 0, :]
    if tensor.ndim != 2 or tensor.shape[1] != VOICE_DIM or tensor.shape[0] == 0:
        raise ConversionError(
            f"voice {path}: shape {shape}, expected (rows, 1, {VOICE_DIM}) or (rows, {VOICE_DIM})"
        )
    pack = np.ascontiguousarray(tensor.detach().float().numpy(), dtype=np.float32)
    if not np.all(np.isfinite(pack)):
        raise ConversionError(f"voice {path}: contains NaN or infinite values")
    return pack


def remove_weight_norm(model: Any) -> int:
    """Fold every ``weight_norm`` into a plain weight (faster export and inference); the count."""
    import torch

    folded = 0
    for module in model.modules():
        hooks = list(module._forward_pre_hooks.values())
        if any(type(h).__name__ == "WeightNorm" for h in hooks):
            torch.nn.utils.remove_weight_norm(module)
            folded += 1
    return folded
