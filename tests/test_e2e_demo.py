"""System level: the main job (scripts/demo.py) and the ``ttsdock`` command line.

scripts/demo.py runs as a subprocess: it starts the dock and the Kokoro engine as real
processes, plays LLaMA and OAP, and writes a WAV; the test checks the WAV's format and
content and the printed timing table.
"""

from __future__ import annotations

import re
import subprocess
import sys
import wave
from importlib.metadata import entry_points
from pathlib import Path

import numpy as np
import pytest
from e2e_helpers import ROOT, clean_env, rms

pytestmark = pytest.mark.slow

pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    kh = pytest.importorskip("kokoro_helpers")
    return Path(kh.shared_models_dir(tmp_path_factory))


def test_demo_speaks_both_sentences_into_a_wav(models_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out" / "demo.wav"
    p = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "demo.py"), "--out", str(out),
         "--models-dir", str(models_dir)],
        cwd=str(tmp_path), capture_output=True, text=True, timeout=600,
        # synthesis threads at the loop's priority: see NO_NICE in test_e2e_pipeline.py
        env=clean_env(TTSDOCK_SYNTH_NICE="0"),
    )  # fmt: skip
    logs = "".join(
        f"\n--- {f.name}\n{f.read_text(errors='replace')[-3000:]}"
        for f in sorted(out.parent.glob("*.log"))
    )
    assert p.returncode == 0, f"{p.stdout}\n{p.stderr}{logs}"
    assert "stopped: dock exit 0, engine exit 0" in p.stdout, p.stdout
    for name in ("dock.log", "kokoro.log"):
        text = (out.parent / name).read_text(errors="replace")
        assert "Traceback" not in text, text

    # The WAV: 24 kHz mono 16-bit, two sentences (each > 1 s) and a 0.5 s gap after each.
    with wave.open(str(out)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (24000, 1, 2)
        n = w.getnframes()
        pcm = np.frombuffer(w.readframes(n), dtype="<i2").astype(np.float32) / 32768.0
    assert pcm.size == n and n / 24000 > 2.0 + 1.0
    level = rms(pcm)
    assert 0.02 < level < 0.5, level  # speech, not silence and not clipping noise
    assert float(np.max(np.abs(pcm))) < 0.999  # normalised to about 0.9 peak, no clipping
    # the last 0.5 s is the gap written after the second sentence
    assert float(np.max(np.abs(pcm[-12000:]))) == 0.0
    # not one long tone: the level changes over time (syllables, pauses)
    frames = pcm[: n - n % 2400].reshape(-1, 2400)
    frame_rms = np.sqrt(np.mean(frames.astype(np.float64) ** 2, axis=1))
    assert float(np.std(frame_rms)) > 0.01

    # The table: a header with TTFA and RTF, and one row per sentence with both numbers.
    lines = p.stdout.splitlines()
    header = [ln for ln in lines if "TTFA" in ln and "RTF" in ln and "lang" in ln]
    assert len(header) == 1, p.stdout
    rows = [
        m
        for ln in lines
        if (m := re.match(r"^(en|de)\s+(\d+)ms\s+([\d.]+)s\s+([\d.]+)s\s+([\d.]+)\s+\S", ln))
    ]
    assert [m.group(1) for m in rows] == ["en", "de"], p.stdout
    for m in rows:
        ttfa_ms, audio_s, wall_s, rtf = (float(m.group(i)) for i in range(2, 6))
        assert ttfa_ms > 0 and audio_s > 1.0 and wall_s > 0
        assert rtf == pytest.approx(wall_s / audio_s, abs=0.02)
        assert ttfa_ms / 1000 < wall_s  # first audio comes before the last
    total = sum(float(m.group(3)) for m in rows) + 2 * 0.5
    assert n / 24000 == pytest.approx(total, abs=0.02)  # the WAV holds what the table says
    assert re.search(rf"wrote {re.escape(str(out))} \([\d.]+ s, 24 kHz mono 16-bit\)", p.stdout)


# --------------------------------------------------------------------- the command line
EXPECTED_COMMANDS = {
    "serve",
    "ctl",
    "kokoro",
    "kokoro-convert",
    "qwen3",
    "qwen3-convert",
    "qwen3-synth",
    "qwen3-clone-prompt",
}


def _ttsdock(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ttsdock", *args],
        cwd=str(ROOT), env=clean_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _registered() -> set[str]:
    return {ep.name for ep in entry_points(group="ttsdock.commands")}


def test_help_lists_every_subcommand() -> None:
    names = _registered()
    assert names >= EXPECTED_COMMANDS
    p = _ttsdock("--help")
    assert p.returncode == 0, p.stderr
    listed = {m.group(1) for m in re.finditer(r"^  (\S+)\s+\S", p.stdout, re.MULTILINE)}
    assert listed == names, p.stdout
    bad = _ttsdock("no-such-command")
    assert bad.returncode == 2 and "unknown command 'no-such-command'" in bad.stderr


@pytest.mark.parametrize("name", sorted(EXPECTED_COMMANDS))
def test_each_subcommand_help_exits_0(name: str) -> None:
    p = _ttsdock(name, "--help")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(f"usage: ttsdock {name}"), p.stdout[:200]
    assert p.stderr == ""
