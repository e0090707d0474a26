"""Resolution of Qwen3-TTS model file names (engines/qwen3/weights/paths.py)."""

from __future__ import annotations

import enum
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engines.qwen3.modes import MODES, mode_slug
from engines.qwen3.weights.paths import (
    QUANTS,
    VOCODER_FILE,
    ModelPathError,
    ModeModelPaths,
    bundled_file_name,
    split_file_names,
)


def _touch(d: Path, name: str, data: bytes = b"GGUF\x03\x00\x00\x00") -> Path:
    p = d / name
    p.write_bytes(data)
    return p


def _split_set(d: Path, mode: str, size: str = "1.7b", quant: str = "f16") -> None:
    names = split_file_names(mode, size, quant)
    _touch(d, names["talker_gguf"])
    _touch(d, names["code_predictor_gguf"])
    _touch(d, names["tokenizer_gguf"])
    _touch(d, VOCODER_FILE, b"\x08\x07onnx")


class _Mode(enum.Enum):
    Base = "base"
    CustomVoice = "custom_voice"
    VoiceDesign = "voice_design"


def test_no_torch_import() -> None:
    # paths.py is imported by the converter and CLIs; it must stay light.
    assert "engines.qwen3.weights.paths" in sys.modules
    import engines.qwen3.weights.paths as mod

    src = Path(mod.__file__).read_text()
    assert "import torch" not in src and "import numpy" not in src


def test_seed_default_names(tmp_path: Path) -> None:
    p = ModeModelPaths.from_model_dir(tmp_path, "customvoice")
    assert p.talker_gguf == tmp_path / "qwen3-tts-1.7b-customvoice-talker-f16.gguf"
    assert p.code_predictor_gguf == tmp_path / "qwen3-tts-1.7b-customvoice-code-predictor-f16.gguf"
    assert p.tokenizer_gguf == tmp_path / "qwen3-tts-1.7b-customvoice-tokenizer.gguf"
    assert p.vocoder_onnx == tmp_path / "qwen3-tts-vocoder.onnx"


@pytest.mark.parametrize(
    ("given_mode", "slug"),
    [
        ("base", "base"),
        ("customvoice", "customvoice"),
        ("CustomVoice", "customvoice"),
        ("custom_voice", "customvoice"),
        ("voice-design", "voicedesign"),
        (_Mode.Base, "base"),
        (_Mode.CustomVoice, "customvoice"),
        (_Mode.VoiceDesign, "voicedesign"),
    ],
)
def test_mode_slug(given_mode: object, slug: str) -> None:
    assert mode_slug(given_mode) == slug


def test_mode_enum_by_name() -> None:
    class ByName(enum.Enum):
        VoiceDesign = 3

    assert mode_slug(ByName.VoiceDesign) == "voicedesign"


@pytest.mark.parametrize("bad", ["", "clone", "basex", 3, None])
def test_mode_slug_rejects(bad: object) -> None:
    with pytest.raises(ValueError, match="mode"):
        mode_slug(bad)


def test_split_files_resolved(tmp_path: Path) -> None:
    _split_set(tmp_path, "base")
    p = ModeModelPaths.from_model_dir(tmp_path, "base").check()
    assert p.talker_gguf.name == "qwen3-tts-1.7b-base-talker-f16.gguf"
    assert not p.bundled
    assert len(p.gguf_files()) == 3


def test_quant_preference_per_file(tmp_path: Path) -> None:
    for q in ("q4_k", "q5_k", "q8_0"):
        _touch(tmp_path, split_file_names("base", quant=q)["talker_gguf"])
    for q in ("q4_k", "q6_k"):
        _touch(tmp_path, split_file_names("base", quant=q)["code_predictor_gguf"])
    p = ModeModelPaths.from_model_dir(tmp_path, "base")
    assert p.talker_gguf.name.endswith("-talker-q8_0.gguf")
    assert p.code_predictor_gguf.name.endswith("-code-predictor-q6_k.gguf")


def test_converter_dtypes_resolved(tmp_path: Path) -> None:
    _touch(tmp_path, split_file_names("base", quant="q8_0")["talker_gguf"])
    _touch(tmp_path, split_file_names("base", quant="f32")["talker_gguf"])
    _touch(tmp_path, split_file_names("base", quant="bf16")["code_predictor_gguf"])
    _touch(tmp_path, split_file_names("base", quant="q4_k")["code_predictor_gguf"])
    p = ModeModelPaths.from_model_dir(tmp_path, "base")
    assert p.talker_gguf.name.endswith("-talker-f32.gguf")
    assert p.code_predictor_gguf.name.endswith("-code-predictor-bf16.gguf")


def test_f16_beats_every_quant(tmp_path: Path) -> None:
    for q in QUANTS:
        _touch(tmp_path, split_file_names("base", quant=q)["talker_gguf"])
    assert ModeModelPaths.from_model_dir(tmp_path, "base").talker_gguf.name.endswith("-f16.gguf")


def test_bundled_used_for_all_three(tmp_path: Path) -> None:
    _split_set(tmp_path, "voicedesign")
    b = _touch(tmp_path, bundled_file_name("voicedesign", quant="q8_0"))
    p = ModeModelPaths.from_model_dir(tmp_path, "voicedesign")
    assert p.talker_gguf == p.code_predictor_gguf == p.tokenizer_gguf == b
    assert p.bundled and p.gguf_files() == [b]


def test_bundled_quant_preference(tmp_path: Path) -> None:
    _touch(tmp_path, bundled_file_name("base", quant="q4_k"))
    f16 = _touch(tmp_path, bundled_file_name("base", quant="f16"))
    assert ModeModelPaths.from_model_dir(tmp_path, "base").talker_gguf == f16


def test_small_model_resolved_when_only_it_exists(tmp_path: Path) -> None:
    _split_set(tmp_path, "customvoice", size="0.6b", quant="q8_0")
    p = ModeModelPaths.from_model_dir(tmp_path, "customvoice").check()
    assert p.talker_gguf.name == "qwen3-tts-0.6b-customvoice-talker-q8_0.gguf"
    assert p.tokenizer_gguf.name == "qwen3-tts-0.6b-customvoice-tokenizer.gguf"


def test_large_model_wins_over_small(tmp_path: Path) -> None:
    _split_set(tmp_path, "base", size="0.6b")
    _split_set(tmp_path, "base", size="1.7b", quant="q4_k")
    p = ModeModelPaths.from_model_dir(tmp_path, "base")
    assert p.talker_gguf.name.startswith("qwen3-tts-1.7b-")
    q = ModeModelPaths.from_model_dir(tmp_path, "base", size="0.6b")
    assert q.talker_gguf.name == "qwen3-tts-0.6b-base-talker-f16.gguf"


def test_other_mode_files_ignored(tmp_path: Path) -> None:
    _split_set(tmp_path, "base")
    p = ModeModelPaths.from_model_dir(tmp_path, "customvoice")
    with pytest.raises(ModelPathError, match=r"customvoice-talker-f16\.gguf.*missing"):
        p.check()


def test_explicit_paths_win(tmp_path: Path) -> None:
    _split_set(tmp_path, "base")
    other = _touch(tmp_path, "my-talker.gguf")
    voc = _touch(tmp_path, "voc.onnx", b"x")
    p = ModeModelPaths.from_model_dir(tmp_path, "base", talker_gguf=other, vocoder_onnx=voc)
    assert p.talker_gguf == other and p.vocoder_onnx == voc
    assert p.code_predictor_gguf.name.endswith("code-predictor-f16.gguf")
    assert p.check() is p


def test_from_files_bundled(tmp_path: Path) -> None:
    b = _touch(tmp_path, "anything.gguf")
    p = ModeModelPaths.from_files(str(b))
    assert p.bundled and p.tokenizer_gguf == b
    assert p.vocoder_onnx == tmp_path / VOCODER_FILE
    with pytest.raises(ModelPathError, match="vocoder"):
        p.check()
    p.check(need_vocoder=False)


def test_strings_become_paths() -> None:
    p = ModeModelPaths("a", "b", "c", "d")  # type: ignore[arg-type]
    assert all(isinstance(x, Path) for x in (p.talker_gguf, p.vocoder_onnx))
    assert p.with_overrides(tokenizer_gguf="t", vocoder_onnx=None).tokenizer_gguf == Path("t")
    with pytest.raises(TypeError, match="bogus"):
        p.with_overrides(bogus="x")


def test_frozen() -> None:
    p = ModeModelPaths(Path("a"), Path("b"), Path("c"), Path("d"))
    with pytest.raises(AttributeError):
        p.talker_gguf = Path("x")  # type: ignore[misc]


def test_check_reasons(tmp_path: Path) -> None:
    _split_set(tmp_path, "base")
    good = ModeModelPaths.from_model_dir(tmp_path, "base")

    missing = good.with_overrides(tokenizer_gguf=tmp_path / "nope.gguf")
    with pytest.raises(ModelPathError, match=r"tokenizer file .*nope\.gguf.*missing") as ei:
        missing.check()
    assert ei.value.role == "tokenizer" and ei.value.path == tmp_path / "nope.gguf"

    (tmp_path / "dir.gguf").mkdir()
    with pytest.raises(ModelPathError, match=r"talker file .*is a directory"):
        good.with_overrides(talker_gguf=tmp_path / "dir.gguf").check()

    empty = _touch(tmp_path, "empty.onnx", b"")
    with pytest.raises(ModelPathError, match=r"vocoder file .*empty"):
        good.with_overrides(vocoder_onnx=empty).check()

    notgguf = _touch(tmp_path, "x.gguf", b"PK\x03\x04zip")
    with pytest.raises(ModelPathError, match=r"code predictor file .*not a GGUF"):
        good.with_overrides(code_predictor_gguf=notgguf).check()


def test_problems_lists_all(tmp_path: Path) -> None:
    p = ModeModelPaths.from_model_dir(tmp_path, "base")
    assert [e.role for e in p.problems()] == ["talker", "code predictor", "tokenizer", "vocoder"]
    assert [e.role for e in p.problems(need_vocoder=False)] == [
        "talker",
        "code predictor",
        "tokenizer",
    ]
    assert "talker=" in p.describe()


def test_bad_size_and_quant() -> None:
    with pytest.raises(ValueError, match="size"):
        split_file_names("base", size="7b")
    with pytest.raises(ValueError, match="quantisation"):
        split_file_names("base", quant="q2_k")
    with pytest.raises(ValueError, match="quantisation"):
        bundled_file_name("base", quant="q3_k")


@given(
    mode=st.sampled_from(MODES),
    size=st.sampled_from(["1.7b", "0.6b"]),
    tq=st.sampled_from(QUANTS),
    pq=st.sampled_from(QUANTS),
)
def test_roundtrip_any_written_set(mode: str, size: str, tq: str, pq: str) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        _touch(d, split_file_names(mode, size, tq)["talker_gguf"])
        _touch(d, split_file_names(mode, size, pq)["code_predictor_gguf"])
        _touch(d, split_file_names(mode, size)["tokenizer_gguf"])
        _touch(d, VOCODER_FILE, b"onnx")
        p = ModeModelPaths.from_model_dir(d, mode).check()
        assert p.talker_gguf.name == split_file_names(mode, size, tq)["talker_gguf"]
        assert p.code_predictor_gguf.name == split_file_names(mode, size, pq)["code_predictor_gguf"]
