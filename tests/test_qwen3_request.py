"""Request validation: self-contained checks and the ones against the loaded checkpoint."""

from __future__ import annotations

import numpy as np
import pytest
import qwen3_helpers as qh

from engines.qwen3.errors import RequestError
from engines.qwen3.modes import PRESET_SPEAKERS_ALL, PresetSpeaker, QtsMode
from engines.qwen3.serving.request import ModeSynthesizeRequest, VoiceClonePrompt
from engines.runtime.synth import SynthesisError


def test_modes_and_presets() -> None:
    assert [m.as_str() for m in QtsMode] == ["base", "customvoice", "voicedesign"]
    assert QtsMode.parse("custom_voice") is QtsMode.CustomVoice
    assert QtsMode.parse("Voice-Design") is QtsMode.VoiceDesign
    assert len(PRESET_SPEAKERS_ALL) == 9
    assert PresetSpeaker.parse("Uncle_Fu").as_str() == "uncle_fu"
    assert PresetSpeaker.parse("onoanna") is PresetSpeaker.Ono_Anna
    with pytest.raises(RequestError, match="unknown preset speaker 'bob'"):
        PresetSpeaker.parse("bob")
    with pytest.raises(RequestError, match="unknown mode"):
        QtsMode.parse("karaoke")


BAD = [
    (dict(text="  "), "text must be"),
    (dict(text="hi", mode=QtsMode.Base, speaker=PresetSpeaker.Ryan), "needs mode customvoice"),
    (dict(text="hi", mode=QtsMode.VoiceDesign, speaker="ryan"), "needs mode customvoice"),
    (dict(text="hi", mode=QtsMode.Base, instruct="x"), "instruct is not supported in base"),
    (dict(text="hi", speaker_embedding=np.zeros(4, np.float32)), "speaker_embedding needs mode"),
    (dict(text="hi", voice_clone_prompt=VoiceClonePrompt()), "voice_clone_prompt needs mode"),
    (dict(text="hi", mode="base", speaker_embedding=np.zeros((2, 2))), "1-D vector"),
    (dict(text="hi", mode="base", speaker_embedding=np.array([np.nan])), "finite"),
    (
        dict(text="hi", mode="base", voice_clone_prompt=VoiceClonePrompt(ref_text="a")),
        "needs ref_code",
    ),
    (
        dict(
            text="hi",
            mode="base",
            voice_clone_prompt=VoiceClonePrompt(ref_code=np.zeros((2, 16), np.int64)),
        ),
        "non-empty ref_text",
    ),
    (
        dict(
            text="hi",
            mode="base",
            voice_clone_prompt=VoiceClonePrompt(ref_code=np.zeros((2, 8), np.int64), ref_text="a"),
        ),
        r"shape \[R>=1, 16\]",
    ),
    (
        dict(
            text="hi",
            mode="base",
            voice_clone_prompt=VoiceClonePrompt(ref_code=np.full((2, 16), 2048), ref_text="a"),
        ),
        r"in \[0, 2048\)",
    ),
    (dict(text="hi", max_frames=0), "max_frames"),
    (dict(text="hi", temperature=0.0), "temperature must be > 0"),
    (dict(text="hi", top_p=1.5), "top_p must be in"),
    (dict(text="hi", subtalker_top_k=-1), "subtalker_top_k"),
    (dict(text="hi", repetition_penalty=float("nan")), "repetition_penalty"),
]


@pytest.mark.parametrize(("kw", "msg"), BAD, ids=[m for _, m in BAD])
def test_validate_rejects(kw: dict, msg: str) -> None:
    req = ModeSynthesizeRequest(**kw)
    with pytest.raises(RequestError, match=msg) as ei:
        req.validate()
    assert isinstance(ei.value, ValueError) and isinstance(ei.value, SynthesisError)


def test_validate_accepts_defaults() -> None:
    ModeSynthesizeRequest(text="hi").validate()
    ModeSynthesizeRequest(
        text="hi", mode="base", speaker_embedding=np.ones(8, np.float32)
    ).validate()
    xv = VoiceClonePrompt(ref_spk_embedding=np.ones(8, np.float32), x_vector_only_mode=True)
    ModeSynthesizeRequest(text="hi", mode="base", voice_clone_prompt=xv).validate()


@pytest.fixture(scope="module")
def cv(tmp_path_factory: pytest.TempPathFactory):
    return qh.build_tiny_engine(tmp_path_factory.mktemp("cv"), "custom_voice")[0]


def test_engine_level_checks(cv, tmp_path_factory: pytest.TempPathFactory) -> None:
    ok = ModeSynthesizeRequest(text="Hello", speaker=PresetSpeaker.Ryan, language="english")
    cv.check_request(ok)
    with pytest.raises(RequestError, match="differs from the loaded checkpoint mode customvoice"):
        cv.check_request(ModeSynthesizeRequest(text="Hello", mode=QtsMode.VoiceDesign))
    with pytest.raises(RequestError, match=r"'sohee' is not in this checkpoint's metadata"):
        cv.check_request(ModeSynthesizeRequest(text="Hello", speaker=PresetSpeaker.Sohee))
    with pytest.raises(RequestError, match="unsupported language 'klingon'"):
        cv.check_request(ModeSynthesizeRequest(text="Hello", language="klingon"))
    with pytest.raises(RequestError, match="unsupported language 'sichuan_dialect'"):
        cv.check_request(ModeSynthesizeRequest(text="Hello", language="sichuan_dialect"))
    assert [s.as_str() for s in cv.preset_speakers()] == ["dylan", "eric", "ryan", "vivian"] or {
        s.as_str() for s in cv.preset_speakers()
    } == {"dylan", "eric", "ryan", "vivian"}
    assert cv.languages()[0] == "auto" and "sichuan_dialect" not in cv.languages()


def test_mode_mismatch_with_metadata_identity(cv) -> None:
    from engines.qwen3.errors import Qwen3TtsError
    from engines.qwen3.serving.frame_generator import FrameGenerator
    from engines.qwen3.weights.paths import ModeModelPaths

    src = cv.source.split(" + ")
    paths = ModeModelPaths(src[0], src[1], src[0].replace("talker-f32", "x"), "v.onnx")
    with pytest.raises(Qwen3TtsError, match=r"checkpoint is custom_voice .* mode base"):
        FrameGenerator.load_mode(paths, QtsMode.Base)


def test_base_embedding_width_checked(tmp_path) -> None:
    eng = qh.build_tiny_engine(tmp_path, "base", size="0b6", hidden=32, cp_hidden=32)[0]
    with pytest.raises(RequestError, match="needs 32"):
        eng.check_request(
            ModeSynthesizeRequest(text="Hi", mode="base", speaker_embedding=np.ones(16, np.float32))
        )
