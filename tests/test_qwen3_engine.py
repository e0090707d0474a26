"""Qwen3Synthesizer, ``ttsdock qwen3`` and ``ttsdock qwen3-synth`` (engines/qwen3).

The first half drives the synthesiser with a scripted frame engine (fast, no
torch); the second half runs the real engine end to end on a tiny generated
GGUF model set plus the tiny vocoder.
"""

from __future__ import annotations

import asyncio
import threading
import wave
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from qwen3_vocoder_fixture import export_tiny_vocoder

from engines.qwen3.modes import PresetSpeaker
from engines.qwen3.serving.synthesizer import Qwen3Options, Qwen3Synthesizer
from engines.qwen3.serving.vocoder import SAMPLES_PER_FRAME
from engines.qwen3.weights.paths import VOCODER_FILE, ModeModelPaths, split_file_names
from engines.runtime.synth import (
    CallState,
    CancelToken,
    SynthesisCancelled,
    SynthesisError,
    Synthesizer,
    VoiceNotFound,
)


class ScriptedEngine:
    """Frames derived from the request; checks ``cancel`` like the real engine."""

    def __init__(self, mode: str, frames_per_char: int = 1) -> None:
        self.mode = mode
        self.timings: dict[str, float] = {}
        self.frames_per_char = frames_per_char
        self.produced = 0
        self.requests: list[Any] = []
        self.on_frame: Callable[[int], None] | None = None

    def iter_frames(
        self, req: Any, *, cancel: Callable[[], bool] | None = None
    ) -> Iterator[np.ndarray]:
        self.requests.append(req)
        rng = np.random.default_rng(len(req.text))
        self.timings = {"prefill": 1.0, "talker": 0.0, "code_predictor": 0.0}
        n = min(len(req.text) * self.frames_per_char, req.max_frames)
        for i in range(n):
            if cancel is not None and cancel():
                return
            self.timings["talker"] += 0.5
            self.timings["code_predictor"] += 0.25
            self.produced += 1
            if self.on_frame is not None:
                self.on_frame(i)
            yield rng.integers(0, 2048, size=16, dtype=np.int64)

    def preset_speakers(self) -> list[Any]:
        return list(PresetSpeaker)

    def generate_codes(self, req: Any, *, cancel: Any = None) -> tuple[np.ndarray, dict]:
        frames = list(self.iter_frames(req, cancel=cancel))
        return np.stack(frames) if frames else np.zeros((0, 16), np.int64), dict(self.timings)


def _fake_dir(d: Path, mode: str) -> Path:
    names = split_file_names(mode)
    for key in ("talker_gguf", "code_predictor_gguf", "tokenizer_gguf"):
        (d / names[key]).write_bytes(b"GGUF fake")
    export_tiny_vocoder(d / VOCODER_FILE)
    return d


def _synth(
    d: Path, mode: str = "customvoice", engine: ScriptedEngine | None = None, **kw: Any
) -> tuple[Qwen3Synthesizer, ScriptedEngine]:
    eng = engine or ScriptedEngine(mode)
    s = Qwen3Synthesizer(
        Qwen3Options(model_dir=d, mode=mode, **kw), generator_loader=lambda paths, opts: eng
    )
    return s, eng


@pytest.fixture
def cv_dir(tmp_path: Path) -> Path:
    return _fake_dir(tmp_path, "customvoice")


def test_is_a_synthesizer(cv_dir: Path) -> None:
    s, _ = _synth(cv_dir)
    assert isinstance(s, Synthesizer)
    assert s.name == "qwen3" and s.sample_rate == 24000


def test_streams_24k_float32(cv_dir: Path) -> None:
    s, _ = _synth(cv_dir, first_chunk_frames=2)
    s.load()
    chunks = list(s.synthesize("Hello world.", CallState(1), CancelToken()))
    assert all(c.dtype == np.float32 and c.ndim == 1 for c in chunks)
    sizes = [c.shape[0] // SAMPLES_PER_FRAME for c in chunks]
    assert sizes == [2, 4, 4, 2]  # 12 frames: first chunk 2, then 4s, then the rest
    audio = np.concatenate(chunks)
    assert audio.shape == (12 * SAMPLES_PER_FRAME,)
    assert float(np.abs(audio).max()) <= 1.0
    st = s.stats()
    assert st["last_frames"] == 12 and st["last_completed"] == 1.0
    assert st["last_talker_ms"] == 6.0 and st["last_code_predictor_ms"] == 3.0
    assert st["last_prefill_ms"] == 1.0 and st["last_vocoder_ms"] > 0
    assert st["last_ttfa_ms"] > 0 and st["total_utterances"] == 1
    assert s.status_suffix() == ":MODE:customvoice"


def test_default_first_chunks_ramp_up(cv_dir: Path) -> None:
    s, _ = _synth(cv_dir, chunk_frames=8)
    s.load()
    chunks = list(s.synthesize("a" * 20, CallState(1), CancelToken()))
    sizes = [c.shape[0] // SAMPLES_PER_FRAME for c in chunks]
    assert sizes == [1, 2, 4, 8, 5]  # ramp 1, 2, 4, then steady 8, then the rest
    assert s.self_scheduled is True


def test_streaming_equals_offline_decode(cv_dir: Path) -> None:
    s, eng = _synth(cv_dir, left_context=40)
    s.load()
    audio = np.concatenate(list(s.synthesize("abcdefghij", CallState(1), CancelToken())))
    codes, _ = eng.generate_codes(eng.requests[-1])
    assert s.vocoder is not None
    np.testing.assert_allclose(audio, s.vocoder.decode(codes), atol=1e-5)


def test_cancel_stops_within_a_frame(cv_dir: Path) -> None:
    s, eng = _synth(cv_dir, chunk_frames=1)
    s.load()
    tok = CancelToken()
    eng.on_frame = lambda i: tok.cancel() if i == 5 else None
    got: list[np.ndarray] = []
    with pytest.raises(SynthesisCancelled):
        for c in s.synthesize("x" * 100, CallState(1), tok):
            got.append(c)
    assert eng.produced == 6  # the frame in flight when cancel fired, nothing after
    assert len(got) <= 5
    assert s.stats()["total_cancelled"] == 1.0


def test_cancel_before_start(cv_dir: Path) -> None:
    s, eng = _synth(cv_dir)
    s.load()
    tok = CancelToken()
    tok.cancel()
    with pytest.raises(SynthesisCancelled):
        list(s.synthesize("hello", CallState(1), tok))
    assert eng.produced == 0


def test_consumer_cancel_between_chunks(cv_dir: Path) -> None:
    s, eng = _synth(cv_dir, chunk_frames=2, first_chunk_frames=2)
    s.load()
    tok = CancelToken()
    gen = s.synthesize("y" * 50, CallState(1), tok)
    next(gen)
    tok.cancel()
    with pytest.raises(SynthesisCancelled):
        next(gen)
    assert eng.produced == 2


def test_voices_and_speakers(cv_dir: Path) -> None:
    s, eng = _synth(cv_dir)
    s.load()
    assert "vivian" in s.voices() and "uncle_fu" in s.voices() and len(s.voices()) == 9
    assert s.default_voice == "vivian"
    list(s.synthesize("hi", CallState(1, voice="Ryan"), CancelToken()))
    assert eng.requests[-1].speaker.as_str() == "ryan"
    with pytest.raises(VoiceNotFound, match="nobody"):
        list(s.synthesize("hi", CallState(1, voice="nobody"), CancelToken()))


def test_engine_speaker_list_wins(cv_dir: Path) -> None:
    eng = ScriptedEngine("customvoice")
    eng.preset_speakers = lambda: ["serena", "eric"]  # type: ignore[attr-defined]
    s, _ = _synth(cv_dir, engine=eng, speaker="Eric")
    s.load()
    assert s.voices() == ["serena", "eric"] and s.default_voice == "eric"
    with pytest.raises(VoiceNotFound, match="serena, eric"):
        list(s.synthesize("hi", CallState(1, voice="vivian"), CancelToken()))


def test_unknown_default_speaker_fails_load(cv_dir: Path) -> None:
    s, _ = _synth(cv_dir, speaker="nobody")
    with pytest.raises(SynthesisError, match="nobody"):
        s.load()


def test_base_and_design_voices(tmp_path: Path) -> None:
    for mode in ("base", "voicedesign"):
        (tmp_path / mode).mkdir()
        d = _fake_dir(tmp_path / mode, mode)
        s, eng = _synth(d, mode=mode, instruct="calm" if mode == "voicedesign" else None)
        s.load()
        assert s.voices() == ["default"] and s.default_voice == "default"
        list(s.synthesize("hello", CallState(1), CancelToken()))
        assert eng.requests[-1].speaker is None
        with pytest.raises(VoiceNotFound):
            list(s.synthesize("hello", CallState(1, voice="vivian"), CancelToken()))


def test_bad_options_fail_load_before_model(tmp_path: Path) -> None:
    d = _fake_dir(tmp_path, "base")
    loaded: list[int] = []

    def loader(paths: ModeModelPaths, opts: Qwen3Options) -> ScriptedEngine:
        loaded.append(1)
        return ScriptedEngine("base")

    s = Qwen3Synthesizer(
        Qwen3Options(model_dir=d, mode="base", instruct="x"), generator_loader=loader
    )
    with pytest.raises(SynthesisError, match="instruct"):
        s.load()
    s = Qwen3Synthesizer(
        Qwen3Options(model_dir=d, mode="base", speaker="vivian"), generator_loader=loader
    )
    with pytest.raises(SynthesisError, match="speaker"):
        s.load()
    assert loaded == []


def test_missing_files_fail_load(tmp_path: Path) -> None:
    s, _ = _synth(tmp_path)
    with pytest.raises(SynthesisError, match=r"talker file .*missing"):
        s.load()
    d = _fake_dir(tmp_path, "customvoice")
    (d / VOCODER_FILE).write_bytes(b"junk")
    s, _ = _synth(d)
    with pytest.raises(SynthesisError, match=r"vocoder ONNX .*cannot be loaded"):
        s.load()


def test_mode_mismatch_fails_load(cv_dir: Path) -> None:
    s, _ = _synth(cv_dir, engine=ScriptedEngine("base"))
    with pytest.raises(SynthesisError, match="base checkpoint"):
        s.load()


def test_engine_load_error_is_clear(cv_dir: Path) -> None:
    def boom(paths: ModeModelPaths, opts: Qwen3Options) -> Any:
        raise RuntimeError("tensor talker.blk.0.attn_q.weight missing")

    s = Qwen3Synthesizer(Qwen3Options(model_dir=cv_dir), generator_loader=boom)
    with pytest.raises(SynthesisError, match=r"cannot load the model.*attn_q"):
        s.load()


def test_not_loaded_and_blank_text(cv_dir: Path) -> None:
    s, eng = _synth(cv_dir)
    with pytest.raises(SynthesisError, match="not loaded"):
        list(s.synthesize("hi", CallState(1), CancelToken()))
    s.load()
    assert list(s.synthesize("   ", CallState(1), CancelToken())) == []
    assert eng.produced == 0


def test_concurrent_calls_serialised(cv_dir: Path) -> None:
    s, _ = _synth(cv_dir)
    s.load()
    results: dict[int, int] = {}

    def run(cid: int) -> None:
        chunks = list(s.synthesize("z" * (10 + cid), CallState(cid), CancelToken()))
        results[cid] = sum(c.shape[0] for c in chunks)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {i: (10 + i) * SAMPLES_PER_FRAME for i in range(3)}


def test_warm_up_and_close(cv_dir: Path) -> None:
    s, eng = _synth(cv_dir)
    s.load()
    s.warm_up()
    assert eng.produced == 4  # warm-up is capped at 4 frames
    s.close()
    with pytest.raises(SynthesisError, match="not loaded"):
        list(s.synthesize("hi", CallState(1), CancelToken()))


def test_options_validation(cv_dir: Path) -> None:
    with pytest.raises(ValueError, match="mode"):
        Qwen3Synthesizer(Qwen3Options(model_dir=cv_dir, mode="clone"))
    with pytest.raises(ValueError, match="max_frames"):
        Qwen3Synthesizer(Qwen3Options(model_dir=cv_dir, max_frames=0))
    with pytest.raises(SynthesisError, match="model-dir"):
        Qwen3Synthesizer(Qwen3Options()).load()


def test_cli_parser_rejects(capsys: pytest.CaptureFixture[str]) -> None:
    from engines.qwen3.cli import synth as synth_cli

    assert synth_cli.main(["--mode", "base"]) == 2  # --text missing
    assert "--text" in capsys.readouterr().err
    assert synth_cli.main(["--text", "hi"]) == 2
    assert "--model-dir" in capsys.readouterr().err


def test_synth_cli_missing_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from engines.qwen3.cli import synth as synth_cli

    rc = synth_cli.main(["--model-dir", str(tmp_path), "--mode", "base", "--text", "hi"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and "talker file" in err and "missing" in err


def test_write_wav(tmp_path: Path) -> None:
    from engines.qwen3.cli.synth import write_wav

    write_wav(tmp_path / "a.wav", np.array([0.0, 0.5, -1.5], np.float32))
    with wave.open(str(tmp_path / "a.wav")) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (24000, 1, 2)
        pcm = np.frombuffer(w.readframes(3), "<i2")
    assert pcm.tolist() == [0, 16384, -32767]


# -- the real engine on a tiny generated model -------------------------------------------------


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    pytest.importorskip("gguf")
    helpers = pytest.importorskip("qwen3_helpers")
    d = tmp_path_factory.mktemp("qwen3tiny")
    hf = helpers.write_checkpoint(d / "hf", helpers.tiny_config("custom_voice"))
    out = d / "models"
    helpers.convert_checkpoint(hf, out, dtype="f16")
    export_tiny_vocoder(out / VOCODER_FILE)
    return out


def _real(tiny_dir: Path, **kw: Any) -> Qwen3Synthesizer:
    kw.setdefault("max_frames", 12)
    s = Qwen3Synthesizer(Qwen3Options(model_dir=tiny_dir, mode="customvoice", **kw))
    s.load()
    return s


def test_real_engine_streams_audio(tiny_dir: Path) -> None:
    s = _real(tiny_dir, seed=7, left_context=40, first_chunk_frames=1)
    assert s.voices() == ["vivian", "dylan", "eric", "ryan"]  # from the GGUF metadata
    assert s.default_voice == "vivian"
    chunks = list(s.synthesize("Hello world.", CallState(1, voice="ryan"), CancelToken()))
    st = s.stats()
    frames = int(st["last_frames"])
    assert 2 <= frames <= 12 and st["last_completed"] == 1.0
    assert chunks[0].shape == (SAMPLES_PER_FRAME,)  # first chunk after one frame
    audio = np.concatenate(chunks)
    assert audio.dtype == np.float32 and audio.shape == (frames * SAMPLES_PER_FRAME,)
    assert float(np.abs(audio).max()) <= 1.0
    for k in ("prefill", "talker", "code_predictor", "vocoder"):
        assert st[f"last_{k}_ms"] > 0, k
    # Same seed offline: identical codes, and the streamed audio equals the full decode.
    req = s.make_request("Hello world.", "ryan")
    codes, _ = s.generator.generate_codes(req)
    assert codes.shape == (frames, 16) and codes.dtype == np.int64
    assert s.vocoder is not None
    np.testing.assert_allclose(audio, s.vocoder.decode(codes), atol=1e-5)


def test_real_engine_cancel_within_a_frame(tiny_dir: Path) -> None:
    s = _real(tiny_dir, chunk_frames=1, max_frames=40, seed=3)
    tok = CancelToken()
    got = 0
    with pytest.raises(SynthesisCancelled):
        for _chunk in s.synthesize("Hello world, hello world.", CallState(1), tok):
            got += 1
            if got == 2:
                tok.cancel()
    assert got == 2
    assert s.stats()["last_frames"] == 2  # no frame generated after the cancel
    assert s.stats()["total_cancelled"] == 1.0


def test_real_engine_cancel_from_another_thread(tiny_dir: Path) -> None:
    s = _real(tiny_dir, chunk_frames=1, max_frames=200, seed=5)
    tok = CancelToken()
    first = threading.Event()
    seen: list[int] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            for c in s.synthesize("Hello world, hello world.", CallState(1), tok):
                seen.append(c.shape[0])
                first.set()
        except SynthesisCancelled:
            pass
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            first.set()

    t = threading.Thread(target=run)
    t.start()
    assert first.wait(60)
    tok.cancel()
    t.join(60)
    assert not t.is_alive() and not errors
    frames = int(s.stats()["last_frames"])
    assert frames <= len(seen) + 1  # at most the frame in flight when cancel fired


def test_real_engine_rejects_bad_voice_and_language(tiny_dir: Path) -> None:
    with pytest.raises(VoiceNotFound, match="sohee"):
        _real(tiny_dir, speaker="sohee")  # a preset, but not in this checkpoint
    s = _real(tiny_dir, language="klingon")
    with pytest.raises(SynthesisError, match="klingon"):
        list(s.synthesize("Hello.", CallState(1), CancelToken()))


def test_real_engine_mode_mismatch(tiny_dir: Path) -> None:
    talker = next(tiny_dir.glob("*-talker-*.gguf"))
    s = Qwen3Synthesizer(
        Qwen3Options(
            mode="voicedesign",
            talker_gguf=talker,
            code_predictor_gguf=next(tiny_dir.glob("*-code-predictor-*.gguf")),
            tokenizer_gguf=next(tiny_dir.glob("*-tokenizer.gguf")),
            vocoder_onnx=tiny_dir / VOCODER_FILE,
            instruct="A calm voice.",
        )
    )
    with pytest.raises(SynthesisError, match="custom_voice"):
        s.load()


def test_synth_cli_writes_codes_and_wav(tiny_dir: Path, tmp_path: Path, capsys: Any) -> None:
    from engines.qwen3.cli import synth as synth_cli

    base = ["--model-dir", str(tiny_dir), "--mode", "customvoice", "--speaker", "eric"]
    args = [*base, "--text", "Hello world.", "--greedy", "--max-frames", "8"]
    c1, c2, wav = tmp_path / "a.npy", tmp_path / "b.npy", tmp_path / "a.wav"
    assert synth_cli.main([*args, "--codes-out", str(c1), "--wav-out", str(wav)]) == 0
    out = capsys.readouterr().out
    assert "frames:" in out and "code_predictor:" in out and "vocoder:" in out
    codes = np.load(c1)
    assert codes.dtype == np.int64 and codes.ndim == 2 and codes.shape[1] == 16
    assert 2 <= codes.shape[0] <= 8
    assert int(codes.min()) >= 0 and int(codes.max()) < 2048  # no EOS frame
    with wave.open(str(wav)) as w:
        assert w.getframerate() == 24000 and w.getnframes() == codes.shape[0] * SAMPLES_PER_FRAME
    # Codes only: no vocoder needed, and greedy output is reproducible.
    assert synth_cli.main([*args, "--codes-out", str(c2), "--vocoder-onnx", "/nonexistent"]) == 0
    np.testing.assert_array_equal(np.load(c2), codes)
    capsys.readouterr()


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--speaker", "nobody"], "nobody"),
        (["--language", "klingon"], "klingon"),
        (["--mode", "base"], "base-talker"),
        (["--max-frames", "0"], "max-frames"),
    ],
)
def test_synth_cli_bad_inputs(
    tiny_dir: Path, capsys: pytest.CaptureFixture[str], extra: list[str], needle: str
) -> None:
    from engines.qwen3.cli import synth as synth_cli

    argv = ["--model-dir", str(tiny_dir), "--text", "Hello.", "--max-frames", "4", *extra]
    assert synth_cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err


async def test_real_engine_docks_and_streams(tiny_dir: Path) -> None:
    rh = pytest.importorskip("runtime_helpers")
    s = Qwen3Synthesizer(
        Qwen3Options(model_dir=tiny_dir, mode="customvoice", max_frames=10, seed=1)
    )
    dock = rh.FakeDock(ping_every=0)
    await dock.start()
    try:
        async with rh.running_engine(s, dock.port):
            sess = await dock.session()
            assert b"qwen3" in sess.hello
            sess.text(7, "Hello world.")
            total = 0
            got: list[np.ndarray] = []
            for _ in range(1200):  # until the utterance's samples have all arrived (<= 60 s)
                got = [rh.audio_samples(r) for r in sess.audio(7)]
                total = sum(a.shape[0] for a in got)
                if total and total == int(s.stats().get("last_frames", -1)) * SAMPLES_PER_FRAME:
                    break
                await asyncio.sleep(0.05)
            frames = int(s.stats()["last_frames"])
            assert frames >= 2 and total == frames * SAMPLES_PER_FRAME
            assert all(a.shape[0] <= 4800 for a in got)
    finally:
        await dock.stop()


def test_dock_cli_refuses_to_run_without_model(tmp_path: Path) -> None:
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    code = "from engines.qwen3.cli.dock import main; raise SystemExit(main())"
    port = "1"  # never reached: loading fails first
    p = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "--model-dir",
            str(tmp_path),
            "--dock-port",
            port,
            "--cmd-port",
            "0",
            "--mode",
            "base",
        ],
        cwd=str(root),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 1, p.stderr
    assert "qwen3-tts-1.7b-base-talker-f16.gguf" in p.stderr and "missing" in p.stderr


@pytest.fixture(scope="module")
def tiny_base_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    pytest.importorskip("gguf")
    helpers = pytest.importorskip("qwen3_helpers")
    d = tmp_path_factory.mktemp("qwen3base")
    hf = helpers.write_checkpoint(d / "hf", helpers.tiny_config("base"))
    out = d / "models"
    helpers.convert_checkpoint(hf, out, dtype="f16")
    export_tiny_vocoder(out / VOCODER_FILE)
    np.save(d / "ref.npy", helpers.ref_codes(5))
    np.save(d / "xvec.npy", helpers.xvector(64))
    return out


def test_real_engine_icl_voice_clone(tiny_base_dir: Path, tmp_path: Path) -> None:
    d = tiny_base_dir.parent
    ref = np.load(d / "ref.npy")
    s = Qwen3Synthesizer(
        Qwen3Options(
            model_dir=tiny_base_dir,
            mode="base",
            max_frames=8,
            seed=2,
            ref_codes=d / "ref.npy",
            ref_text="Hello.",
            speaker_embedding=d / "xvec.npy",
            left_context=40,
        )
    )
    s.load()
    assert s.voices() == ["default"]
    audio = np.concatenate(list(s.synthesize("Hello world.", CallState(1), CancelToken())))
    req = s.make_request("Hello world.", None)
    assert req.voice_clone_prompt is not None and req.voice_clone_prompt.uses_icl
    codes, _ = s.generator.generate_codes(req)
    assert audio.shape == (codes.shape[0] * SAMPLES_PER_FRAME,)
    assert s.vocoder is not None
    whole = s.vocoder.decode(np.concatenate([ref, codes]))
    np.testing.assert_allclose(audio, whole[ref.shape[0] * SAMPLES_PER_FRAME :], atol=1e-5)

    from engines.qwen3.cli import synth as synth_cli

    wav = tmp_path / "clone.wav"
    argv = ["--model-dir", str(tiny_base_dir), "--mode", "base", "--text", "Hello world."]
    argv += ["--ref-codes", str(d / "ref.npy"), "--ref-text", "Hello.", "--max-frames", "6"]
    assert synth_cli.main([*argv, "--wav-out", str(wav), "--seed", "1"]) == 0
    with wave.open(str(wav)) as w:
        assert w.getnframes() % SAMPLES_PER_FRAME == 0 and w.getnframes() > 0


def test_icl_options_checked(tiny_base_dir: Path, tiny_dir: Path, tmp_path: Path) -> None:
    d = tiny_base_dir.parent
    s = Qwen3Synthesizer(
        Qwen3Options(model_dir=tiny_base_dir, mode="base", ref_codes=d / "ref.npy")
    )
    with pytest.raises(SynthesisError, match="ref-text"):
        s.load()
    s = Qwen3Synthesizer(Qwen3Options(model_dir=tiny_dir, ref_codes=d / "ref.npy", ref_text="Hi."))
    with pytest.raises(SynthesisError, match="needs mode base"):
        s.load()
    np.save(tmp_path / "bad.npy", np.zeros((3, 15), np.int64))
    s = Qwen3Synthesizer(
        Qwen3Options(
            model_dir=tiny_base_dir, mode="base", ref_codes=tmp_path / "bad.npy", ref_text="Hi."
        )
    )
    with pytest.raises(SynthesisError, match=r"\[frames, 16\]"):
        s.load()
