"""``ttsdock kokoro-convert`` on bad input, and the engine on a stale or corrupt converted dir.

Every bad input is exit 2 with a message naming the file, the key and the
reason, and leaves no output directory behind (all checks run before the
conversion writes anything; the output is built in a hidden directory and
moved into place last).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytest.importorskip("kokoro")
torch = pytest.importorskip("torch")

from kokoro_convert_helpers import write_checkpoint  # noqa: E402

from engines.kokoro.backend import OnnxBackend  # noqa: E402
from engines.kokoro.convert.cli import main  # noqa: E402
from engines.kokoro.converted import FORMAT, MANIFEST, VERSION  # noqa: E402
from engines.kokoro.models import ModelFileError  # noqa: E402


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    ckpt, cfg, voices = write_checkpoint(tmp_path_factory.mktemp("kc-src"))
    return ckpt, cfg, voices[0]


def run(
    capsys: pytest.CaptureFixture[str], out: Path, ckpt: Path, cfg: Path, *voices: Path
) -> tuple[int, str]:
    argv = ["--checkpoint", str(ckpt), "--config", str(cfg), "--out", str(out)]
    for v in voices:
        argv += ["--voice", str(v)]
    rc = main(argv)
    return rc, capsys.readouterr().err


def assert_nothing_written(out: Path) -> None:
    assert not out.exists() or not any(out.iterdir()), sorted(out.iterdir())


def edited_checkpoint(src: Path, dst: Path, edit: object) -> Path:
    state = torch.load(str(src), map_location="cpu", weights_only=True)
    edit(state)  # type: ignore[operator]
    torch.save(state, dst)
    return dst


def test_a_checkpoint_missing_a_module_is_refused(source, tmp_path, capsys) -> None:
    ckpt, cfg, voice = source
    bad = edited_checkpoint(ckpt, tmp_path / "bad.pth", lambda s: s.pop("predictor"))
    rc, err = run(capsys, tmp_path / "out", bad, cfg, voice)
    assert rc == 2
    assert str(bad) in err and "'predictor'" in err and "missing" in err, err
    assert_nothing_written(tmp_path / "out")


def test_a_checkpoint_with_a_wrong_shape_is_refused(source, tmp_path, capsys) -> None:
    ckpt, cfg, voice = source
    key = "lstm.weight_ih_l0"

    def shrink(state: dict) -> None:
        state["predictor"][key] = state["predictor"][key][:, :-1].clone()

    bad = edited_checkpoint(ckpt, tmp_path / "bad.pth", shrink)
    rc, err = run(capsys, tmp_path / "out", bad, cfg, voice)
    assert rc == 2
    assert f"predictor.{key}" in err and "has shape" in err and str(cfg) in err, err
    assert_nothing_written(tmp_path / "out")


def test_a_config_that_does_not_match_the_checkpoint_is_refused(source, tmp_path, capsys) -> None:
    ckpt, cfg, voice = source
    config = json.loads(cfg.read_text("utf-8"))
    config["n_layer"] = 2  # the checkpoint has one predictor layer
    other = tmp_path / "config.json"
    other.write_text(json.dumps(config), "utf-8")
    rc, err = run(capsys, tmp_path / "out", ckpt, other, voice)
    assert rc == 2
    assert str(other) in err and str(ckpt) in err and "key predictor." in err, err
    assert_nothing_written(tmp_path / "out")


def test_a_config_missing_a_key_is_refused(source, tmp_path, capsys) -> None:
    ckpt, cfg, voice = source
    config = json.loads(cfg.read_text("utf-8"))
    del config["istftnet"]
    other = tmp_path / "config.json"
    other.write_text(json.dumps(config), "utf-8")
    rc, err = run(capsys, tmp_path / "out", ckpt, other, voice)
    assert rc == 2 and str(other) in err and "'istftnet' missing" in err, err
    assert_nothing_written(tmp_path / "out")


def test_a_voice_of_the_wrong_shape_is_refused(source, tmp_path, capsys) -> None:
    ckpt, cfg, _voice = source
    bad = tmp_path / "df_bad.pt"
    torch.save(torch.zeros(510, 1, 128), bad)
    rc, err = run(capsys, tmp_path / "out", ckpt, cfg, bad)
    assert rc == 2
    assert str(bad) in err and "(510, 1, 128)" in err and "expected" in err, err
    assert_nothing_written(tmp_path / "out")


def test_an_unwritable_output_directory_is_refused(source, tmp_path, capsys) -> None:
    ckpt, cfg, voice = source
    if os.geteuid() == 0:  # root writes into read-only directories: block with a file
        blocker = tmp_path / "a-file"
        blocker.write_text("x")
        out = blocker / "models"
    else:
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o500)
        out = locked / "models"
    try:
        rc, err = run(capsys, out, ckpt, cfg, voice)
    finally:
        out.parent.chmod(0o700)
    assert rc == 2 and str(out) in err and "not writable" in err, err
    assert not out.exists()


# ------------------------------------------------------------ the engine's side
def fake_converted(tmp_path: Path, **manifest: object) -> Path:
    """A converted-looking directory (the refusal happens before any graph is parsed)."""
    d = tmp_path / "kokoro-german"
    d.mkdir()
    for name in ("kokoro-f32.onnx", "kokoro-f32.prosody", "kokoro-f32.decoder", "vocab.json"):
        (d / name).write_bytes(name.encode())
    import hashlib

    files = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in d.iterdir()}
    body = {
        "format": FORMAT,
        "version": VERSION,
        "files": files,
        "graphs": {
            "kokoro-f32.onnx": {
                "precision": "float32",
                "prosody": "kokoro-f32.prosody",
                "decoder": "kokoro-f32.decoder",
            }
        },
        **manifest,
    }
    (d / MANIFEST).write_text(json.dumps(body), "utf-8")
    return d / "kokoro-f32.onnx"


@pytest.mark.parametrize("split", [True, False])
def test_a_corrupt_converted_file_is_refused_by_the_engine(tmp_path, split) -> None:
    model = fake_converted(tmp_path)
    victim = model.with_name("kokoro-f32.decoder" if split else "kokoro-f32.onnx")
    victim.write_bytes(b"flipped")
    with pytest.raises(ModelFileError, match=rf"{victim.name} is corrupt or changed"):
        OnnxBackend(model, split=split).load()
    assert not victim.with_name("kokoro-f32.onnx.prosody").exists()  # nothing was cut


def test_a_converted_file_gone_missing_is_refused(tmp_path) -> None:
    model = fake_converted(tmp_path)
    model.with_name("vocab.json").unlink()
    with pytest.raises(ModelFileError, match=r"vocab\.json is missing"):
        OnnxBackend(model).load()


def test_a_stale_converted_directory_is_refused(tmp_path) -> None:
    model = fake_converted(tmp_path, version=VERSION - 1)
    with pytest.raises(ModelFileError, match=r"is stale: format version 0.*kokoro-convert"):
        OnnxBackend(model).load()
