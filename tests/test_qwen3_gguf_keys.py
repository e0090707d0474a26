"""The one GGUF key table: what the converter writes is what the loader reads back."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import qwen3_helpers as qh

from engines.qwen3.weights import gguf_keys as keys


class _NoTensors:
    def ggml_shape(self, name: str) -> tuple[int, ...] | None:
        return None

    def names(self) -> Sequence[str]:
        return []


def _read_back(items: list[tuple[str, str, Any]]) -> dict[str, dict[str, Any]]:
    store = {key: v for _, key, v in items}
    done: dict[str, dict[str, Any]] = {}
    for g in (keys.TALKER, keys.PREDICTOR, keys.CODEC, keys.TEXT):
        done[g.name] = keys.read_group(g, lambda k, _p: store.get(k), _NoTensors(), done)
    return done


@pytest.mark.parametrize("kind", ["custom_voice", "voice_design", "base"])
def test_written_keys_read_back_to_the_config(kind: str) -> None:
    cfg = qh.tiny_config(kind)
    items = keys.write_items(cfg, (keys.TALKER, keys.PREDICTOR, keys.CODEC, keys.TEXT))
    assert len({k for _, k, _ in items}) == len(items)  # each key written once
    got = _read_back(items)
    tc = cfg["talker_config"]
    cp = tc["code_predictor_config"]
    assert got["talker"]["hidden_size"] == tc["hidden_size"]
    assert got["talker"]["n_layers"] == tc["num_hidden_layers"]
    assert got["talker"]["intermediate_size"] == tc["intermediate_size"]
    assert got["predictor"]["hidden_size"] == cp["hidden_size"]
    assert got["predictor"]["n_layers"] == cp["num_hidden_layers"]
    assert got["codec"]["eos"] == tc["codec_eos_token_id"]
    assert got["text"]["tts_pad"] == cfg["tts_pad_token_id"]
    # every key read is one the writer can produce (no reader-only spellings first)
    written = {k for _, k, _ in items}
    for g in (keys.TALKER, keys.PREDICTOR, keys.CODEC, keys.TEXT):
        for k in g.keys:
            if k.source is not None and k.read:
                assert k.keys[0] in written or k.derive is not None or k.default is not None


def test_missing_values_fall_back_or_name_the_key() -> None:
    done: dict[str, dict[str, Any]] = {}
    with pytest.raises(keys.MetaError, match="talker width"):
        keys.read_group(keys.TALKER, lambda k, p: None, _NoTensors(), done)
    store = {"qwen3-tts.talker.embedding_length": 8, "qwen3-tts.talker.block_count": 1.5}
    with pytest.raises(keys.MetaError, match="must be an integer"):
        keys.read_group(keys.TALKER, lambda k, p: store.get(k), _NoTensors(), done)
    codec = keys.read_group(keys.CODEC, lambda k, p: None, _NoTensors(), done)
    assert codec["eos"] == 2150 and codec["pad"] == 2148
