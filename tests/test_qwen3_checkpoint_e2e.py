"""From an official-layout checkpoint to audio at OAP, all as real processes.

A tiny official-layout Base checkpoint (config.json, safetensors with the
speaker encoder, tokenizer files, ``speech_tokenizer/`` with the 12 Hz codec)
is converted by ``python -m ttsdock qwen3-convert`` (GGUF files, the exported
vocoder, speaker encoder and codec encoder), two voice-clone prompts are made
from a WAV by ``python -m ttsdock qwen3-clone-prompt``, and ``python -m ttsdock
qwen3`` docks into a real ``ttsdock serve`` with them: text from the fake LLaMA
stage comes out as audio packets at the fake OAP, in the default (ICL) voice,
then in another voice chosen for one call on the cmd port.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import qwen3_codec_helpers as ch
from e2e_helpers import Cleanup, EngineProcess, check_audio_packets, now_us, wait_active
from runtime_helpers import free_port
from test_e2e_pipeline import NO_NICE, end_engine, settled, stage
from test_qwen3_clone_prompt import wav_bytes

pytestmark = pytest.mark.slow

pytest.importorskip("torch")
pytest.importorskip("onnxruntime")


def ttsdock(*args: str) -> str:
    res = subprocess.run(
        [sys.executable, "-m", "ttsdock", *args], capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout + res.stderr


@pytest.fixture(scope="module")
def base_models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("ckpt-e2e")
    hf, _ = ch.write_full_checkpoint(root / "Qwen3-TTS-12Hz-0.6B-Base", "base")
    out = root / "models"
    text = ttsdock("qwen3-convert", "--hf-dir", str(hf), "--out", str(out), "--dtype", "f16")
    assert "vocoder: ONNX vs torch" in text and "codec encoder" in text, text
    wav = root / "ref.wav"
    from engines.qwen3.serving.clone_prompt import resample

    audio16k = resample(ch.test_audio(3.0), 24000, 16000)  # 16 kHz stereo, back to 24 kHz
    wav.write_bytes(wav_bytes(audio16k, 16000, channels=2))
    prompts = root / "prompts"
    text = ttsdock(
        "qwen3-clone-prompt", "--model-dir", str(out), "--ref-wav", str(wav),
        "--ref-text", "This is the reference.", "--out", str(prompts / "alice.npz"),
    )  # fmt: skip
    assert "ICL, 38 frames" in text, text
    ttsdock(
        "qwen3-clone-prompt", "--model-dir", str(out), "--ref-wav", str(wav),
        "--x-vector-only", "--out", str(prompts / "bob.npz"),
    )  # fmt: skip
    return out, prompts


async def test_checkpoint_to_oap_with_clone_prompts(
    base_models: tuple[Path, Path], tmp_path: Path, cleanup: Cleanup
) -> None:
    models, prompts = base_models
    st = await stage(tmp_path, cleanup)
    eng = cleanup.engine(
        await EngineProcess(
            tmp_path, "qwen3", st.dock.ports["dock"], free_port(),
            "--model-dir", str(models), "--mode", "base", "--max-frames", "10", "--seed", "1",
            "--clone-prompt", str(prompts / "alice.npz"), "--clone-prompt-dir", str(prompts),
            env=NO_NICE,
        ).start()
    )  # fmt: skip
    await wait_active(st.dock, "qwen3", eng)
    assert await eng.cmd("VOICES") == "VOICES:alice,bob"
    assert await eng.cmd("GET_VOICE") == "VOICE:alice"

    t0 = now_us()
    st.llama.text(1, "Hello world.")
    stats = await settled(eng, st.oap, completed=1)
    check_audio_packets(st.oap.of(1), t0)
    frames = int(float(stats["synth.last_frames"]))
    assert frames >= 1 and st.oap.samples(1) == frames * 1920, stats

    # another stored prompt for call 2 only; call 3 keeps the engine's voice
    assert await eng.cmd("SET_CALL_VOICE:2|bob") == "VOICE:2:bob"
    assert (await eng.cmd("SET_CALL_VOICE:2|carol")).startswith("ERROR:Unknown voice carol")
    assert await eng.cmd("SET_CALL_VOICE:x|bob") == "ERROR:format SET_CALL_VOICE:<call_id>|<voice>"
    st.llama.text(2, "Hello world.")
    await settled(eng, st.oap, completed=2)
    assert st.oap.samples(2) > 0
    # the same text with the same seed in another voice: other audio
    assert not (st.oap.audio(2).shape == st.oap.audio(1).shape
                and (st.oap.audio(2) == st.oap.audio(1)).all())  # fmt: skip
    assert re.fullmatch(r"VOICES:alice,bob", await eng.cmd("RELOAD_VOICES"))
    await end_engine(eng)
    await st.stop_dock()
