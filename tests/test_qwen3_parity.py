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

from engines.qwen3.modes import PresetSpeaker, QtsMode
from engines.qwen3.serving.frame_generator import FrameGenerator
from engines.qwen3.serving.request import ModeSynthesizeRequest, VoiceClonePrompt

CASES = qh.load_golden_cases()["cases"]
MODES = {
    "custom_voice": QtsMode.CustomVoice,
    "voice_design": QtsMode.VoiceDesign,
    "base": QtsMode.Base,
}


def build_engine(
    kind: str, root: Path, *, dtype: str = "f32", bundled: bool = False
) -> FrameGenerator:
    gdir = qh.GOLDEN / kind
    config = json.loads((gdir / "config.json").read_text())
    hf = root / f"{kind}-hf"
    qh.write_checkpoint(hf, config)
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json"):
        shutil.copy(gdir / name, hf / name)  # the exact files the oracle tokenised with
    paths = qh.convert_checkpoint(hf, root / f"{kind}-gguf-{dtype}", dtype=dtype, bundled=bundled)
    return FrameGenerator.load_mode(paths, MODES[kind])


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> dict[str, FrameGenerator]:
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
    engines: dict[str, FrameGenerator], case: dict[str, Any]
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


# -- batched decoding: every row of a batch gives the codes it gives alone ----------------


def _golden(case: dict[str, Any], frames: int | None = None) -> np.ndarray:
    want = np.asarray(case["codes"], dtype=np.int64)
    return want if frames is None else want[:frames]


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(MODES))
def test_batched_greedy_codes_equal_single_request_codes(
    engines: dict[str, FrameGenerator], kind: str
) -> None:
    """All fixture cases of one checkpoint in one batch (streaming and non-streaming,
    speakers, dialects, instruct and none, ICL and x-vector), plus truncated copies so
    that rows leave at different frames: each row equals the golden (single) codes."""
    eng = engines[kind]
    cases = [c for c in CASES if c["model"] == kind]
    width = eng.meta.talker.hidden_size
    reqs: list[tuple[str, ModeSynthesizeRequest]] = []
    want: dict[str, np.ndarray] = {}
    for i, case in enumerate(cases):
        reqs.append((case["name"], request_for(case, width)))
        want[case["name"]] = _golden(case)
        cut = 3 + 4 * i  # rows finishing at frames 3, 7, 11, ...
        short = request_for({**case, "max_frames": cut}, width)
        reqs.append((f"{case['name']}-{cut}", short))
        want[f"{case['name']}-{cut}"] = _golden(case, cut)
    saved = eng.batching
    eng.close()
    eng.batching = type(saved)(max_batch=len(reqs), max_context=256)
    try:
        results = eng.generate_batch(reqs)
        stats = eng.batch_stats()
    finally:
        eng.close()
        eng.batching = saved
    for res in results:
        assert res.error is None, res.error
        assert res.codes is not None
        np.testing.assert_array_equal(res.codes, want[res.name], err_msg=res.name)
    # they really ran together (one prefill joins per frame step, short rows leave early)
    assert stats["batch_size_max"] > len(reqs) // 2
    assert stats["batch_size_mean"] > 1


@pytest.mark.slow
def test_newcomer_joins_midway_and_cancel_frees_its_row(
    engines: dict[str, FrameGenerator],
) -> None:
    """A second request joins while the first is 5 frames in; a third is cancelled
    after 2 frames (barge-in): the first two still equal their golden codes."""
    eng = engines["custom_voice"]
    width = eng.meta.talker.hidden_size
    a_case, b_case = CASES[0], CASES[1]
    a = eng.submit(request_for(a_case, width), name="a")
    got_a = [next(a) for _ in range(5)]
    stop = [False]
    c = eng.submit(request_for(CASES[2], width), name="c", cancel=lambda: stop[0])
    b = eng.submit(request_for(b_case, width), name="b")
    got_c = [next(c), next(c)]
    stop[0] = True
    from engines.runtime.synth import SynthesisCancelled

    with pytest.raises(SynthesisCancelled):
        for _ in range(100):
            next(c)
    got_a += list(a)
    got_b = list(b)
    np.testing.assert_array_equal(np.stack(got_a), _golden(a_case))
    np.testing.assert_array_equal(np.stack(got_b), _golden(b_case))
    np.testing.assert_array_equal(np.stack(got_c), _golden(CASES[2], 2))
    st = eng.batch_stats()
    assert st["cancelled"] >= 1 and st["active"] == 0


@pytest.mark.slow
def test_request_that_does_not_fit_fails_alone(engines: dict[str, FrameGenerator]) -> None:
    eng = engines["custom_voice"]
    width = eng.meta.talker.hidden_size
    ok = request_for(CASES[0], width)
    too_long = request_for({**CASES[0], "max_frames": eng.batching.max_context}, width)
    wrong_mode = request_for(CASES[3], width)  # a voice_design request
    res = eng.generate_batch([("ok", ok), ("long", too_long), ("vd", wrong_mode)])
    assert res[0].error is None
    np.testing.assert_array_equal(res[0].codes, _golden(CASES[0]))
    assert res[1].error is not None and "long" in res[1].error and "KV cache" in res[1].error
    assert res[2].error is not None and "vd" in res[2].error and "mode" in res[2].error
