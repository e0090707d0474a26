"""Exact talker prefill layouts (as the official package builds them) for every mode,
as symbolic row strings."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import qwen3_helpers as qh

from engines.qwen3.model.config import CodecIds, TextIds
from engines.qwen3.modes import PresetSpeaker, QtsMode
from engines.qwen3.serving.prefill_layout import IclPrompt, build_layout
from engines.qwen3.serving.request import ModeSynthesizeRequest, VoiceClonePrompt
from engines.qwen3.weights.gguf_loader import DEFAULT_CODEC_IDS, DEFAULT_TEXT_IDS

CODEC = CodecIds(
    *(
        DEFAULT_CODEC_IDS[k]
        for k in (
            "pad_id",
            "bos_id",
            "eos_id",
            "think_id",
            "nothink_id",
            "think_bos_id",
            "think_eos_id",
        )
    )
)
TEXT = TextIds(
    *(
        DEFAULT_TEXT_IDS[k]
        for k in (
            "im_start_id",
            "im_end_id",
            "tts_pad_id",
            "tts_bos_id",
            "tts_eos_id",
            "assistant_id",
            "newline_id",
        )
    )
)
NAMES = {
    151644: "ims",
    77091: "asst",
    198: "nl",
    151671: "pad",
    151672: "bos",
    151673: "eos",
    151645: "ime",
    872: "user",
}
T = [11, 12, 13, 14, 15]  # five text tokens
TARGET = [151644, 77091, 198, *T, 151645, 198, 151644, 77091, 198]
ROLE = ["P(ims)", "P(asst)", "P(nl)"]


def rows(layout):
    return layout.describe(NAMES)


def test_customvoice_language_speaker_non_streaming() -> None:
    lay = build_layout(
        codec=CODEC,
        text=TEXT,
        target_ids=TARGET,
        language_id=2050,
        speaker_codec_id=3061,
        non_streaming=True,
    )
    header = ["P(pad)+C(2154)", "P(pad)+C(2156)", "P(pad)+C(2050)", "P(pad)+C(2157)"]
    header += ["P(pad)+C(3061)", "P(bos)+C(2148)"]
    body = [*[f"P({t})+C(2148)" for t in T], "P(eos)+C(2148)", "P(pad)+C(2149)"]
    assert rows(lay) == [*ROLE, *header, *body]
    assert len(lay.rows) == 16 and lay.describe_trailing(NAMES) == ["P(pad)"]


def test_dialect_auto_streaming() -> None:
    lay = build_layout(
        codec=CODEC, text=TEXT, target_ids=TARGET, language_id=2062, speaker_codec_id=2875
    )
    assert rows(lay)[-3:] == ["P(pad)+C(2875)", "P(bos)+C(2148)", "P(11)+C(2149)"]
    assert len(lay.rows) == 10
    assert lay.describe_trailing(NAMES) == ["P(12)", "P(13)", "P(14)", "P(15)", "P(eos)"]


def test_auto_language_uses_nothink_and_no_speaker_row() -> None:
    lay = build_layout(codec=CODEC, text=TEXT, target_ids=TARGET, language_id=None)
    header = ["P(pad)+C(2155)", "P(pad)+C(2156)", "P(pad)+C(2157)", "P(bos)+C(2148)"]
    assert rows(lay) == [*ROLE, *header, "P(11)+C(2149)"]


def test_voicedesign_instruct_prepended_on_text_track_only() -> None:
    instruct = [151644, 872, 198, 21, 22, 151645, 198, 23]  # 8 tokens
    lay = build_layout(
        codec=CODEC,
        text=TEXT,
        target_ids=TARGET,
        language_id=None,
        instruct_ids=instruct,
        non_streaming=True,
    )
    r = rows(lay)
    assert r[:8] == ["P(ims)", "P(user)", "P(nl)", "P(21)", "P(22)", "P(ime)", "P(nl)", "P(23)"]
    assert r[8:11] == ROLE
    assert lay.instruct_rows == 8 and lay.role_start == 8
    assert "X" not in "".join(r) and len(lay.rows) == 22


def test_base_xvector_and_icl_layouts() -> None:
    lay = build_layout(
        codec=CODEC, text=TEXT, target_ids=TARGET, language_id=2050, speaker_vector=True
    )
    assert rows(lay)[3:9] == [
        "P(pad)+C(2154)",
        "P(pad)+C(2156)",
        "P(pad)+C(2050)",
        "P(pad)+C(2157)",
        "P(pad)+X",
        "P(bos)+C(2148)",
    ]
    icl = IclPrompt(ref_text_ids=[31, 32], n_ref_frames=3)
    s = build_layout(
        codec=CODEC, text=TEXT, target_ids=TARGET, language_id=2050, speaker_vector=True, icl=icl
    )
    assert rows(s)[-4:] == ["P(31)+C(2149)", "P(32)+R0", "P(11)+R1", "P(12)+R2"]
    assert len(s.rows) == 13
    assert s.describe_trailing(NAMES) == ["P(13)", "P(14)", "P(15)", "P(eos)"]
    ns = build_layout(
        codec=CODEC,
        text=TEXT,
        target_ids=TARGET,
        language_id=2050,
        speaker_vector=True,
        icl=icl,
        non_streaming=True,
    )
    assert len(ns.rows) == 21
    assert rows(ns)[-4:] == ["P(pad)+C(2149)", "P(pad)+R0", "P(pad)+R1", "P(pad)+R2"]
    long_ref = IclPrompt(ref_text_ids=[31], n_ref_frames=9)
    lr = build_layout(
        codec=CODEC,
        text=TEXT,
        target_ids=TARGET,
        language_id=None,
        speaker_vector=True,
        icl=long_ref,
    )
    assert rows(lr)[-2:] == ["P(pad)+R7", "P(pad)+R8"]
    assert lr.describe_trailing(NAMES) == ["P(pad)"]


def test_layout_rejects_contradictions() -> None:
    with pytest.raises(ValueError, match="not both"):
        build_layout(
            codec=CODEC,
            text=TEXT,
            target_ids=TARGET,
            language_id=None,
            speaker_codec_id=3061,
            speaker_vector=True,
        )
    with pytest.raises(ValueError, match="no tokens"):
        build_layout(codec=CODEC, text=TEXT, target_ids=TARGET[:3] + TARGET[-5:], language_id=None)


@pytest.fixture(scope="module")
def cv(tmp_path_factory: pytest.TempPathFactory):
    return qh.build_tiny_engine(tmp_path_factory.mktemp("cv"), "custom_voice")[0]


@pytest.fixture(scope="module")
def vd(tmp_path_factory: pytest.TempPathFactory):
    return qh.build_tiny_engine(tmp_path_factory.mktemp("vd"), "voice_design")[0]


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory):
    return qh.build_tiny_engine(
        tmp_path_factory.mktemp("base"), "base", size="0b6", hidden=32, cp_hidden=32
    )[0]


def _token_rows(eng, req) -> list[str]:
    lay = eng.build_layout(req)
    names = {
        i: eng.tokenizer.tokens([i])[0] for r in lay.rows if r.text is not None for i in [r.text]
    }
    return lay.describe(names)


def test_engine_prompt_strings_customvoice_with_instruction(cv) -> None:
    req = ModeSynthesizeRequest(
        text="Hello world", speaker=PresetSpeaker.Eric, language="auto", instruct="Speak warmly."
    )
    got = _token_rows(cv, req)
    n_ins = len(cv.tokenizer.encode_instruction_for_tts("Speak warmly."))
    assert got[:3] == ["P(<|im_start|>)", "P(user)", "P(Ċ)"]
    assert got[n_ins - 2 : n_ins] == ["P(<|im_end|>)", "P(Ċ)"]
    assert got[n_ins : n_ins + 3] == ["P(<|im_start|>)", "P(assistant)", "P(Ċ)"]
    # eric + auto -> think form with the sichuan dialect id, then the preset codec id
    assert got[n_ins + 3 :] == [
        "P(<tts_pad>)+C(2154)",
        "P(<tts_pad>)+C(2156)",
        "P(<tts_pad>)+C(2062)",
        "P(<tts_pad>)+C(2157)",
        "P(<tts_pad>)+C(2875)",
        "P(<tts_text_bos>)+C(2148)",
        "P(Hello)+C(2149)",
    ]
    # explicit english overrides nothing for eric: the language id is used
    req_en = ModeSynthesizeRequest(
        text="Hello world", speaker=PresetSpeaker.Eric, language="English"
    )
    assert "C(2050)" in "".join(_token_rows(cv, req_en))


def test_engine_prompt_voicedesign_omits_speaker(vd) -> None:
    req = ModeSynthesizeRequest(
        text="Hello world",
        mode=QtsMode.VoiceDesign,
        instruct="A calm deep voice.",
        non_streaming=True,
    )
    got = _token_rows(vd, req)
    header = [r for r in got if "+C(" in r]
    assert header[:5] == [
        "P(<tts_pad>)+C(2155)",
        "P(<tts_pad>)+C(2156)",
        "P(<tts_pad>)+C(2157)",
        "P(<tts_text_bos>)+C(2148)",
        "P(Hello)+C(2148)",
    ]
    assert not any("X" in r or "C(30" in r or "C(28" in r for r in got)


def test_engine_prompt_base_zero_embedding_fallback(base) -> None:
    req = ModeSynthesizeRequest(text="Hello world", mode=QtsMode.Base)
    prep = base.prepare(req)
    xi = [i for i, r in enumerate(prep.layout.rows) if r.speaker]
    assert len(xi) == 1
    # the speaker row is text-only (tts_pad) plus a zero vector
    pad = base.model.project_text([151671])[0]
    np.testing.assert_allclose(prep.rows[xi[0]].numpy(), pad.numpy(), rtol=1e-5, atol=1e-6)
    vec = qh.xvector(32)
    prep2 = base.prepare(
        ModeSynthesizeRequest(text="Hello world", mode=QtsMode.Base, speaker_embedding=vec)
    )
    np.testing.assert_allclose(prep2.rows[xi[0]].numpy(), (pad.numpy() + vec), rtol=1e-6, atol=1e-6)
    icl = ModeSynthesizeRequest(
        text="Hello world",
        mode=QtsMode.Base,
        voice_clone_prompt=VoiceClonePrompt(ref_code=qh.ref_codes(4), ref_text="Hello."),
    )
    lay = base.build_layout(icl)
    assert sum(r.ref_frame is not None for r in lay.rows) == 4


def test_instruct_dropped_for_small_customvoice(tmp_path: Path) -> None:
    eng = qh.build_tiny_engine(tmp_path, "custom_voice", size="0b6", hidden=32, cp_hidden=32)[0]
    req = ModeSynthesizeRequest(text="Hello", speaker="ryan", instruct="Speak warmly.")
    lay = eng.build_layout(req)
    assert lay.instruct_rows == 0 and lay.notes["instruct_used"] is False
