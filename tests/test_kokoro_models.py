"""Model assembly, file checks, voice formats, directory resolution, CLI wiring."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

from engines.kokoro import models
from engines.kokoro.models import (
    KOKORO_INT8_NAME,
    KOKORO_INT8_SHA256,
    ModelFileError,
    assemble_default_model,
    check_model_file,
    default_models_dir,
    load_default_voices,
    load_vocab,
    load_voice_file,
    pick_voice,
    resolve_model_files,
)
from engines.kokoro.synth import KokoroConfig, KokoroSynthesizer
from engines.runtime.synth import VoiceNotFound


def test_assembled_model_has_the_pinned_hash(kokoro_models_dir: Path) -> None:
    path = kokoro_models_dir / "kokoro" / KOKORO_INT8_NAME
    assert path.stat().st_size == models.KOKORO_INT8_SIZE
    assert models.sha256_file(path) == KOKORO_INT8_SHA256
    assert not list(path.parent.glob("*.tmp"))  # no leftovers of the atomic write


def test_corrupt_assembled_model_is_replaced(tmp_path: Path, kokoro_models_dir: Path) -> None:
    target = tmp_path / "kokoro" / KOKORO_INT8_NAME
    target.parent.mkdir()
    target.write_bytes(b"broken")
    assert assemble_default_model(tmp_path) == target
    assert target.stat().st_size == models.KOKORO_INT8_SIZE


def test_bad_parts_fail_with_sha_mismatch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    parts = []
    for i in range(4):
        p = tmp_path / f"part{i}.bin"
        p.write_bytes(bytes([i]) * 100)
        parts.append(p)
    monkeypatch.setattr(models, "_part_resources", lambda: parts)
    with pytest.raises(ModelFileError, match="sha256"):
        assemble_default_model(tmp_path / "m")
    assert not (tmp_path / "m" / "kokoro" / KOKORO_INT8_NAME).exists()
    assert not list((tmp_path / "m" / "kokoro").glob("*.tmp"))


def test_check_model_file_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match=r"missing.onnx"):
        check_model_file(tmp_path / "missing.onnx")
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    with pytest.raises(ModelFileError, match=r"empty.onnx.*empty"):
        check_model_file(empty)
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"xyz")
    with pytest.raises(ModelFileError, match=r"bad.onnx is corrupt: sha256"):
        check_model_file(bad, KOKORO_INT8_SHA256)
    check_model_file(bad, hashlib.sha256(b"xyz").hexdigest())


def test_models_dir_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("WHISPERTALK_MODELS_DIR", str(tmp_path / "wt"))
    assert default_models_dir() == tmp_path / "wt"
    monkeypatch.delenv("WHISPERTALK_MODELS_DIR")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_models_dir() == tmp_path / "xdg" / "ttsdock" / "models"


def test_voice_formats(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    pack = rng.standard_normal((512, 256)).astype(np.float32)
    pack.tofile(tmp_path / "df_eva_voice.bin")
    np.save(tmp_path / "mine.npy", pack[:510].reshape(510, 1, 256))
    np.savez(tmp_path / "set.npz", a=pack[:510].reshape(510, 1, 256), b=pack[:10])
    bin_voice = load_voice_file(tmp_path / "df_eva_voice.bin")
    np.testing.assert_array_equal(bin_voice["df_eva"], pack)
    assert load_voice_file(tmp_path / "mine.npy")["mine"].shape == (510, 256)
    assert set(load_voice_file(tmp_path / "set.npz")) == {"a", "b"}
    (tmp_path / "odd.bin").write_bytes(b"\0" * 1000)
    with pytest.raises(ModelFileError, match=r"odd.bin"):
        load_voice_file(tmp_path / "odd.bin")
    np.save(tmp_path / "wrong.npy", np.zeros((3, 7), np.float32))
    with pytest.raises(ModelFileError, match=r"wrong.npy"):
        load_voice_file(tmp_path / "wrong.npy")
    with pytest.raises(ModelFileError, match=r"unknown format"):
        (tmp_path / "v.txt").write_text("x")
        load_voice_file(tmp_path / "v.txt")


def test_shipped_voices_and_vocab() -> None:
    voices = load_default_voices()
    assert set(voices) == {"jf_alpha", "jf_gongitsune", "jf_nezumi", "jf_tebukuro", "jm_kumo"}
    assert all(v.shape == (510, 256) for v in voices.values())
    vocab = load_vocab()
    assert len(vocab) == 114 and vocab[","] == 3 and vocab["?"] == 6
    with pytest.raises(VoiceNotFound, match="xx"):
        pick_voice(voices, "xx")


def test_bad_vocab_named(tmp_path: Path) -> None:
    p = tmp_path / "vocab.json"
    p.write_text("{not json")
    with pytest.raises(ModelFileError, match=r"vocab.json"):
        load_vocab(p)
    p.write_text(json.dumps({"vocab": {"a": -1}}))
    with pytest.raises(ModelFileError, match="bad entry"):
        load_vocab(p)


def test_variant_layout(tmp_path: Path, kokoro_models_dir: Path) -> None:
    vdir = tmp_path / "kokoro-german"
    vdir.mkdir()
    np.zeros((512, 256), np.float32).tofile(vdir / "df_eva_voice.bin")
    (vdir / "vocab.json").write_text(json.dumps({"vocab": load_vocab()}))
    model = kokoro_models_dir / "kokoro" / KOKORO_INT8_NAME
    os.symlink(model, vdir / "kokoro-german.onnx")
    files = resolve_model_files(models_dir=tmp_path, variant="german")
    assert files.model == vdir / "kokoro-german.onnx"
    assert files.vocab == vdir / "vocab.json"
    assert files.voice_files == [vdir / "df_eva_voice.bin"]
    synth = KokoroSynthesizer(KokoroConfig(models_dir=tmp_path, variant="german"))
    synth.load()
    assert synth.default_voice == "df_eva" and "jf_alpha" in synth.voices()
    synth.close()
    with pytest.raises(ModelFileError, match="kokoro-nope"):
        resolve_model_files(models_dir=tmp_path, variant="nope")


def test_unknown_default_voice_fails_at_load(kokoro_models_dir: Path) -> None:
    synth = KokoroSynthesizer(KokoroConfig(models_dir=kokoro_models_dir, voice="nobody"))
    with pytest.raises(VoiceNotFound, match="nobody"):
        synth.load()


def test_env_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KOKORO_VOICE", "jm_kumo")
    monkeypatch.setenv("KOKORO_VARIANT", "german")
    cfg = KokoroConfig.from_env()
    assert (cfg.voice, cfg.variant) == ("jm_kumo", "german")
    assert KokoroConfig.from_env(voice="x").voice == "x"


def test_cli_flags_map_onto_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from engines.kokoro import cli

    captured: dict[str, object] = {}

    def fake_run(synth: KokoroSynthesizer, args: argparse.Namespace) -> int:
        captured["synth"] = synth
        captured["args"] = args
        return 0

    import engines.runtime.cli as runtime_cli

    monkeypatch.setattr(runtime_cli, "run_engine", fake_run)
    rc = cli.main(
        [
            "--voice",
            "jm_kumo",
            "--lang",
            "de",
            "--threads",
            "1",
            "--speed",
            "1.5",
            "--g2p",
            "espeak",
            "--prompt-cache-mb",
            "0",
            "--cmd-port",
            "0",
        ]
    )
    assert rc == 0
    synth = captured["synth"]
    assert isinstance(synth, KokoroSynthesizer)
    cfg = synth.config
    assert (cfg.voice, cfg.lang, cfg.threads, cfg.g2p, cfg.prompt_cache_mb) == (
        "jm_kumo",
        "de",
        1,
        "espeak",
        0.0,
    )
    assert synth._backend is None  # nothing loaded by main itself
    with pytest.raises(SystemExit):
        cli.main(["--speed", "7"])
