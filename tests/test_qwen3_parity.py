"""Parity with the official qwen-tts code: same tiny models, same greedy codes.

``tests/golden/qwen3`` holds the official outputs (``tests/qwen3_oracle_gen.py``).
Here the golden checkpoints are rebuilt from their ``config.json`` (weights are
deterministic), converted with our converter, run with our engine, and the
token ids, prefill rows and greedy codes are compared. No official package is
needed; the last test regenerates the golden data when ``qwen_tts`` imports.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import qwen3_helpers as qh

from engines.qwen3.engine import Qwen3TtsEngine
from engines.qwen3.request import (
    ModeSynthesizeRequest,
    PresetSpeaker,
    QtsMode,
    VoiceClonePrompt,
)

CASES = qh.load_golden_cases()["cases"]
MODES = {
    "custom_voice": QtsMode.CustomVoice,
    "voice_design": QtsMode.VoiceDesign,
    "base": QtsMode.Base,
}


def build_engine(
    kind: str, root: Path, *, dtype: str = "f32", bundled: bool = False
) -> Qwen3TtsEngine:
    gdir = qh.GOLDEN / kind
    config = json.loads((gdir / "config.json").read_text())
    hf = root / f"{kind}-hf"
    qh.write_checkpoint(hf, config)
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json"):
        shutil.copy(gdir / name, hf / name)  # the exact files the oracle tokenised with
    paths = qh.convert_checkpoint(hf, root / f"{kind}-gguf-{dtype}", dtype=dtype, bundled=bundled)
    return Qwen3TtsEngine.load_mode(paths, MODES[kind])


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Qwen3TtsEngine]:
    root = tmp_path_factory.mktemp("qwen3_parity")
    return {kind: build_engine(kind, root) for kind in MODES}


def request_for(case: dict[str, Any], width: int) -> ModeSynthesizeRequest:
    vcp = None
    emb = None
    if case.get("icl"):
        vcp = VoiceClonePrompt(
            ref_code=qh.ref_codes(case["icl"]["frames"]),
            ref_text=case["icl"]["ref_text"],
            ref_spk_embedding=qh.xvector(width),
        )
    elif case.get("xvector"):
        emb = qh.xvector(width)
    return ModeSynthesizeRequest(
        text=case["text"],
        mode=MODES[case["model"]],
        language=case["language"],
        speaker=PresetSpeaker.parse(case["speaker"]) if case.get("speaker") else None,
        instruct=case.get("instruct"),
        speaker_embedding=emb,
        voice_clone_prompt=vcp,
        non_streaming=case["non_streaming"],
        greedy=True,
        max_frames=case["max_frames"],
    )


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_tokens_prefill_and_greedy_codes_match_official(
    engines: dict[str, Qwen3TtsEngine], case: dict[str, Any]
) -> None:
    eng = engines[case["model"]]
    tok = eng.tokenizer
    assert tok.encode_tts_text(case["text"]) == case["input_ids"]
    if case.get("instruct_ids"):
        assert tok.encode_instruction_for_tts(case["instruct"]) == case["instruct_ids"]
    if case.get("ref_ids"):
        assert tok.encode_ref_text(case["icl"]["ref_text"]) == case["ref_ids"]
    req = request_for(case, eng.meta.talker.hidden_size)
    prep = eng.prepare(req)
    with np.load(qh.GOLDEN / "prefill.npz") as z:
        want_rows = z[f"{case['name']}.rows"]
        want_trailing = z[f"{case['name']}.trailing"]
    np.testing.assert_allclose(prep.rows.float().numpy(), want_rows, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(prep.trailing.float().numpy(), want_trailing, rtol=1e-5, atol=1e-5)
    codes, timings = eng.generate_codes(req)
    want = np.asarray(case["codes"], dtype=np.int64)
    assert codes.dtype == np.int64
    assert codes.shape == want.shape, (codes.shape, want.shape)
    np.testing.assert_array_equal(codes, want)
    assert set(timings) >= {"prefill", "talker", "code_predictor"}


def test_golden_cases_cover_the_six_modes() -> None:
    names = {c["name"] for c in CASES}
    assert {
        "customvoice_nonstreaming",
        "customvoice_dialect_auto",
        "voicedesign_instruct",
        "base_xvector",
        "base_icl_streaming",
        "base_icl_nonstreaming",
    } <= names
    # the projection (talker width != predictor width) and identity paths are both covered
    widths = {}
    for kind in MODES:
        cfg = json.loads((qh.GOLDEN / kind / "config.json").read_text())["talker_config"]
        widths[kind] = (cfg["hidden_size"], cfg["code_predictor_config"]["hidden_size"])
    assert widths["custom_voice"][0] != widths["custom_voice"][1]
    assert widths["base"][0] == widths["base"][1]
    # the golden weights are exactly what our helper derives from the config
    cfg = json.loads((qh.GOLDEN / "base" / "config.json").read_text())
    assert set(qh.hf_tensor_shapes(cfg)) >= {"talker.codec_head.weight"}


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("qwen_tts") is None, reason="official qwen_tts not installed"
)
def test_regenerated_official_outputs_match_golden(tmp_path: Path) -> None:
    import qwen3_oracle_gen as gen

    got = gen.generate(tmp_path)
    for case, ref in zip(got["cases"], CASES, strict=True):
        assert case["name"] == ref["name"]
        assert case["input_ids"] == ref["input_ids"]
        assert case["codes"] == ref["codes"]
