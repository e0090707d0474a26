"""Voice-clone prompts: WAV input, resampling, bad input, prompt files, parity, voices, cmd port."""

from __future__ import annotations

import asyncio
import io
import struct
import wave
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import qwen3_codec_helpers as ch
from hypothesis import given, settings
from hypothesis import strategies as st

from engines.qwen3.serving.clone_prompt import (
    ClonePrompt,
    ClonePromptError,
    ClonePromptWarning,
    load_prompt,
    parse_wav,
    prepare_reference,
    read_wav,
    resample,
)
from engines.runtime.calltable import EngineSettings
from engines.runtime.synth import CallState


def wav_bytes(x: np.ndarray, rate: int, *, bits: int = 16, channels: int = 1) -> bytes:
    buf = io.BytesIO()
    data = np.repeat(x[:, None], channels, axis=1).reshape(-1)
    if bits == 32:  # IEEE float written by hand (the wave module writes PCM only)
        payload = data.astype("<f4").tobytes()
        fmt = struct.pack("<HHIIHH", 3, channels, rate, rate * 4 * channels, 4 * channels, 32)
        riff = b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt
        riff += b"data" + struct.pack("<I", len(payload)) + payload
        return b"RIFF" + struct.pack("<I", len(riff)) + riff
    with wave.open(buf, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(bits // 8)
        w.setframerate(rate)
        if bits == 16:
            w.writeframes((data * 32767).astype("<i2").tobytes())
        elif bits == 24:
            v = (data * (2**23 - 1)).astype("<i4")
            w.writeframes(b"".join(int(s).to_bytes(3, "little", signed=True) for s in v))
        else:
            w.writeframes((data * 127 + 128).astype(np.uint8).tobytes())
    return buf.getvalue()


# -- WAV reading and preparation ---------------------------------------------------------------


@pytest.mark.parametrize("bits", [8, 16, 24, 32])
@pytest.mark.parametrize("channels", [1, 2])
def test_wav_encodings(bits: int, channels: int) -> None:
    x = (0.5 * np.sin(np.arange(2000) / 7.0)).astype(np.float32)
    got, rate = parse_wav(wav_bytes(x, 16000, bits=bits, channels=channels))
    assert rate == 16000 and got.shape == x.shape
    assert np.max(np.abs(got - x)) < {8: 2 / 128, 16: 1e-4, 24: 1e-6, 32: 1e-7}[bits]


def test_unreadable_and_empty(tmp_path: Path) -> None:
    p = tmp_path / "a.mp3"
    p.write_bytes(b"ID3\x03\x00" + b"\x00" * 100)
    with pytest.raises(ClonePromptError, match="not a WAV file"):
        read_wav(p)
    with pytest.raises(ClonePromptError, match="cannot be read"):
        read_wav(tmp_path / "missing.wav")
    empty, rate = parse_wav(wav_bytes(np.zeros(0, np.float32), 24000))
    with pytest.raises(ClonePromptError, match="empty"):
        prepare_reference(empty, rate)


def test_too_short_too_long_silent() -> None:
    with pytest.raises(ClonePromptError, match="at least 1 s"):
        prepare_reference(ch.test_audio(0.9), 24000)
    with pytest.warns(ClonePromptWarning, match="only the first 30 s"):
        y = prepare_reference(ch.test_audio(31.0), 24000)
    assert y.size == 30 * 24000
    with pytest.raises(ClonePromptError, match="silent"):
        prepare_reference(np.zeros(48000, np.float32), 24000)


@pytest.mark.parametrize("rate", [8000, 16000, 44100, 48000])
def test_resample_keeps_pitch_and_level(rate: int) -> None:
    t = np.arange(rate) / rate
    y = resample(np.sin(2 * np.pi * 440.0 * t), rate)
    assert abs(y.size - 24000) <= 1
    mid = y[2400:-2400]
    spec = np.abs(np.fft.rfft(mid * np.hanning(mid.size)))
    peak_hz = np.argmax(spec) * 24000 / mid.size
    assert abs(peak_hz - 440.0) < 2.0
    assert abs(np.max(np.abs(mid)) - 1.0) < 0.02


def test_resample_removes_what_24k_cannot_hold() -> None:
    t = np.arange(48000) / 48000
    y = resample(np.sin(2 * np.pi * 15000.0 * t), 48000)  # above 12 kHz: must not alias
    assert np.max(np.abs(y[2400:-2400])) < 0.02


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_wav_parser_never_crashes(data: bytes) -> None:
    try:
        x, rate = parse_wav(b"RIFF" + data[:4] + b"WAVE" + data[4:])
    except ClonePromptError:
        return
    assert x.dtype == np.float32 and rate >= 1000


# -- prompt files ---------------------------------------------------------------------------------


def _prompt(size: str = "0.6b", width: int = 32, icl: bool = True) -> ClonePrompt:
    return ClonePrompt(
        model_size=size,
        x_vector=np.ones(width, np.float32),
        ref_codes=np.zeros((5, 16), np.int64) if icl else None,
        ref_text="Reference text." if icl else None,
        source="ref.wav",
        seconds=2.0,
    )


def test_prompt_roundtrip_and_size_refusal(tmp_path: Path) -> None:
    p = _prompt().save(tmp_path / "a.npz")
    got = load_prompt(p, model_size="0.6b", width=32)
    assert got.icl and got.ref_text == "Reference text." and got.ref_codes.shape == (5, 16)
    x = _prompt(icl=False).save(tmp_path / "x.npz")
    assert not load_prompt(x).icl and load_prompt(x).ref_text is None
    with pytest.raises(ClonePromptError, match=r"made for the 0\.6b model.*runs the 1\.7b model"):
        load_prompt(p, model_size="1.7b")
    with pytest.raises(ClonePromptError, match=r"x-vector has 32 values.*width is 2048"):
        load_prompt(p, width=2048)


def test_bad_prompt_files(tmp_path: Path) -> None:
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"not a zip")
    with pytest.raises(ClonePromptError, match="not a prompt file"):
        load_prompt(junk)
    other = tmp_path / "other.npz"
    np.savez(other, x=np.zeros(3))
    with pytest.raises(ClonePromptError, match="not a ttsdock clone prompt"):
        load_prompt(other)
    with pytest.raises(ClonePromptError, match="no such file"):
        load_prompt(tmp_path / "none.npz")


# -- parity with the official create_voice_clone_prompt pieces ------------------------------


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    pytest.importorskip("torch")
    from engines.qwen3.cli.convert import main

    root = tmp_path_factory.mktemp("clone")
    hf, _ = ch.write_full_checkpoint(root / "hf", "base")
    out = root / "models"
    assert main(["--hf-dir", str(hf), "--out", str(out), "--dtype", "f32"]) == 0
    return hf, out


def test_prompt_matches_official(converted: tuple[Path, Path], tmp_path: Path) -> None:
    """x-vector and reference codes vs the official extract_speaker_embedding and
    Qwen3TTSTokenizerV2Model.encode (what create_voice_clone_prompt calls) on the same audio."""
    from engines.qwen3.cli.clone import main

    with np.load(ch.GOLDEN_CODEC / "golden.npz") as z:
        golden = {k: z[k] for k in z.files}
    hf, models = converted
    wav = tmp_path / "ref.wav"
    wav.write_bytes(wav_bytes(ch.test_audio(2.0), 24000, bits=32))
    for src in (["--model-dir", str(models)], ["--hf-dir", str(hf)]):
        out = tmp_path / f"p{len(src[1])}.npz"
        args = [*src, "--ref-wav", str(wav), "--ref-text", "Hello there.", "--out", str(out)]
        assert main(args) == 0
        p = load_prompt(out, model_size="0.6b", width=32)
        ref = golden["xvector"]
        assert np.max(np.abs(p.x_vector - ref)) < 1e-4 * np.max(np.abs(ref))
        assert p.ref_codes is not None
        np.testing.assert_array_equal(p.ref_codes, golden["codes_ref"])  # exact
        assert p.ref_text == "Hello there."


def test_odd_length_differs_only_in_last_frame(
    converted: tuple[Path, Path], tmp_path: Path
) -> None:
    from engines.qwen3.cli.clone import main

    with np.load(ch.GOLDEN_CODEC / "golden.npz") as z:
        ref = z["codes_ref_odd"]
    wav = tmp_path / "odd.wav"
    wav.write_bytes(wav_bytes(ch.test_audio(2.03), 24000, bits=32))
    out = tmp_path / "odd.npz"
    args = ["--model-dir", str(converted[1]), "--ref-wav", str(wav), "--ref-text", "x", "--out"]
    assert main([*args, str(out)]) == 0
    codes = load_prompt(out).ref_codes
    assert codes is not None and codes.shape == ref.shape
    np.testing.assert_array_equal(codes[:-1], ref[:-1])


def test_cli_errors(converted: tuple[Path, Path], tmp_path: Path, capsys) -> None:
    from engines.qwen3.cli.clone import main

    _, models = converted
    wav = tmp_path / "r.wav"
    wav.write_bytes(wav_bytes(ch.test_audio(2.0), 24000))
    base = ["--model-dir", str(models), "--ref-wav", str(wav), "--out", str(tmp_path / "o.npz")]
    assert main(base) == 2
    assert "--ref-text is required" in capsys.readouterr().err
    short = tmp_path / "s.wav"
    short.write_bytes(wav_bytes(ch.test_audio(0.5), 24000))
    assert main([*base[:2], "--ref-wav", str(short), "--x-vector-only", "--out", "o.npz"]) == 2
    assert "at least 1 s" in capsys.readouterr().err
    assert main(["--model-dir", str(tmp_path), *base[2:], "--x-vector-only"]) == 2
    assert "no qwen3-tts-*-base-speaker-encoder.onnx" in capsys.readouterr().err
    long = tmp_path / "l.wav"
    long.write_bytes(wav_bytes(ch.test_audio(30.5), 24000))
    out = tmp_path / "long.npz"
    assert main([*base[:2], "--ref-wav", str(long), "--x-vector-only", "--out", str(out)]) == 0
    assert "only the first 30 s" in capsys.readouterr().err
    assert load_prompt(out).seconds == 30.0


# -- the engine: voices from prompts ---------------------------------------------------------------


def test_synthesizer_voices_and_size_refusal(converted: tuple[Path, Path], tmp_path: Path) -> None:
    from engines.qwen3.cli.clone import main
    from engines.qwen3.serving.synthesizer import Qwen3Options, Qwen3Synthesizer
    from engines.runtime.synth import CancelToken, SynthesisError

    _, models = converted
    wav = tmp_path / "r.wav"
    wav.write_bytes(wav_bytes(ch.test_audio(2.0), 24000))
    pdir = tmp_path / "prompts"
    common = ["--model-dir", str(models), "--ref-wav", str(wav)]
    assert main([*common, "--ref-text", "Hi there.", "--out", str(pdir / "alice.npz")]) == 0
    assert main([*common, "--x-vector-only", "--out", str(pdir / "bob.npz")]) == 0

    def synth(**kw: object) -> Qwen3Synthesizer:
        opts = Qwen3Options(model_dir=models, mode="base", greedy=True, max_frames=6, **kw)  # type: ignore[arg-type]
        s = Qwen3Synthesizer(opts)
        s.load()
        return s

    s = synth(clone_prompt=pdir / "alice.npz", clone_prompt_dir=pdir)
    assert s.voices() == ["alice", "bob"] and s.default_voice == "alice"
    assert s.ref_codes is not None and s.ref_codes.shape == (25, 16)
    req_a = s.make_request("Hello.", "alice")
    req_b = s.make_request("Hello.", "bob")
    assert req_a.voice_clone_prompt is not None and req_b.voice_clone_prompt is None
    assert req_b.speaker_embedding is not None
    audio = list(s.synthesize("Hello.", CallState(1, voice=None), CancelToken()))
    assert sum(a.size for a in audio) > 0
    # per call: the cmd port checks the name against the voices, the runtime keeps it in
    # the call's state, and the engine speaks the call's utterances in it
    state = asyncio.run(_call_voice_through_the_runtime(s))
    assert state.voice == "bob"
    req_7 = s.make_request("Hi.", state.voice)
    assert req_7.voice_clone_prompt is None and req_7.speaker_embedding is not None
    assert sum(a.size for a in s.synthesize("Hi.", state, CancelToken())) > 0
    with pytest.raises(SynthesisError, match="unknown voice 'carol'"):
        s.make_request("Hi.", "carol")
    # a prompt dropped into the directory later becomes a voice on RELOAD_VOICES
    (pdir / "carol.npz").write_bytes((pdir / "bob.npz").read_bytes())
    assert s.reload_voices() == ["alice", "bob", "carol"]
    s.close()

    wide = _prompt(size="1.7b", width=2048).save(tmp_path / "wide.npz")
    with pytest.raises(SynthesisError, match=r"made for the 1\.7b model"):
        synth(clone_prompt=wide)


async def _call_voice_through_the_runtime(synth: Any) -> CallState:
    """``SET_CALL_VOICE:7|bob`` (and the refused ``carol``) on a cmd port over ``synth``,
    then call 7's next utterance: the ``CallState`` the runtime hands to ``synthesize``."""
    from engines.runtime.calls import CallManager
    from engines.runtime.cmdport import CommandHandler
    from engines.runtime.stats import RuntimeStats

    settings, stats = EngineSettings(), RuntimeStats()
    calls = CallManager(synth, _NoDock(), stats, settings, max_concurrent=1)
    port = CommandHandler(synth, settings, calls, _NoDock(), stats, Path("."))
    assert await port(b"SET_CALL_VOICE:7|bob") == "VOICE:7:bob"
    assert await port(b"SET_CALL_VOICE:7|carol") == "ERROR:Unknown voice carol"
    table = calls.table
    table.text(7, b"Hi.", 0, now=0.0)
    call = table.calls[7]
    utt = table.next_utterance(call, 0.0)
    assert utt is not None
    table.begin(call, utt)
    return call.state


class _NoDock:
    """A dock link that is never up (the cmd port's ``DockState``, the calls' sink)."""

    docked = False
    write_paused = False

    def send_audio(self, call_id: int, pcm: bytes) -> bool:
        return False

    async def drain(self) -> None:
        return None


# -- cmd port: per-call voices are the runtime's, reloadable voices the engine's ----------


async def test_cmd_port_call_voice_commands() -> None:
    from runtime_helpers import FakeDock, ToneSynth, cmd, free_port, running_engine

    tone = ToneSynth()  # no stored voices: a call voice is still the runtime's to keep
    async with running_engine(tone, free_port()) as eng:
        assert await cmd(eng.cmd_port, "SET_CALL_VOICE:1|x") == "ERROR:Unknown voice x"
        assert await cmd(eng.cmd_port, "SET_CALL_VOICE:1|beta") == "VOICE:1:beta"
        assert await cmd(eng.cmd_port, "RELOAD_VOICES") == "ERROR:Unknown command"

    class VoicedTone(ToneSynth):
        def voices(self) -> list[str]:
            return ["a", "b"]

        def reload_voices(self) -> list[str]:
            return ["a", "b", "c"]

    synth = VoicedTone()
    dock = FakeDock()
    await dock.start()
    try:
        async with running_engine(synth, dock.port) as eng:
            s = await dock.session()
            assert await cmd(eng.cmd_port, "SET_CALL_VOICE:12|b") == "VOICE:12:b"
            s.text(12, "hi")
            await s.wait_audio(12)
            assert await cmd(eng.cmd_port, "SET_CALL_VOICE:12|") == "VOICE:12:-"
            s.text(12, "again")
            await s.wait_audio(12, 2)
            assert (await cmd(eng.cmd_port, "SET_CALL_VOICE:12|z")).startswith(
                "ERROR:Unknown voice"
            )
            assert await cmd(eng.cmd_port, "SET_CALL_VOICE:12") == (
                "ERROR:format SET_CALL_VOICE:<call_id>|<voice>"
            )
            assert await cmd(eng.cmd_port, "RELOAD_VOICES") == "VOICES:a,b,c"
    finally:
        await dock.stop()
    assert [(c.call_id, c.voice) for c in synth.calls if c.call_id == 12] == [
        (12, "b"),
        (12, None),
    ]


def test_synth_cli_with_clone_prompt(converted: tuple[Path, Path], tmp_path: Path, capsys) -> None:
    from engines.qwen3.cli.clone import main as clone
    from engines.qwen3.cli.synth import main as synth

    _, models = converted
    wav = tmp_path / "r.wav"
    wav.write_bytes(wav_bytes(ch.test_audio(2.0), 24000))
    prompt = tmp_path / "alice.npz"
    args = ["--model-dir", str(models), "--ref-wav", str(wav), "--ref-text", "Hi.", "--out"]
    assert clone([*args, str(prompt)]) == 0
    out = tmp_path / "o.wav"
    common = ["--model-dir", str(models), "--mode", "base", "--text", "Hello.", "--greedy"]
    assert (
        synth([*common, "--clone-prompt", str(prompt), "--max-frames", "5", "--wav-out", str(out)])
        == 0
    )
    text = capsys.readouterr().out
    frames = int(text.split("frames: ")[1].split()[0])
    with wave.open(str(out)) as w:
        assert w.getnframes() == frames * 1920 and w.getframerate() == 24000
    wide = _prompt(size="1.7b", width=2048).save(tmp_path / "wide.npz")
    assert synth([*common, "--clone-prompt", str(wide), "--wav-out", str(out)]) == 2
    assert "made for the 1.7b model" in capsys.readouterr().err
