"""The text front end inside an engine: cmd NORMALIZE and RELOAD_LEXICON, SIGHUP, the
flags, and a reload while calls speak (nothing lost, every utterance uses one lexicon)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO

import pytest
from runtime_helpers import FakeDock, ToneSynth, cmd, free_port, running_engine
from text_helpers import TextToneSynth

from engines.runtime.cli import common_parser, text_options
from engines.text import TextOptions
from engines.text.words import cardinal

ROOT = Path(__file__).resolve().parent.parent


class EngineLog:
    """An engine process's stderr (its log lines), read on a thread as they come, so that
    a test can wait for a logged event instead of sleeping."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stderr is not None
        self._lines: list[str] = []
        self._loop = asyncio.get_running_loop()
        self._new_line = asyncio.Event()
        self._reader = threading.Thread(target=self._read, args=(proc.stderr,), daemon=True)
        self._reader.start()

    def _read(self, stream: IO[bytes]) -> None:
        for raw in stream:
            self._lines.append(raw.decode(errors="replace"))
            try:
                self._loop.call_soon_threadsafe(self._new_line.set)
            except RuntimeError:  # the test's loop is gone: nobody waits any more
                pass

    def _seen(self, event: str) -> bool:
        return any(event in line for line in list(self._lines))

    def text(self) -> str:
        self._reader.join(timeout=20)  # after the process ended: everything it wrote
        return "".join(self._lines)

    async def wait_for(self, event: str, within: float) -> None:
        async with asyncio.timeout(within):
            while True:
                self._new_line.clear()
                if self._seen(event):
                    return
                await self._new_line.wait()


def lexicon(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "lexicon.txt"
    p.write_text(text, encoding="utf-8")
    return p


async def test_normalize_command_shows_the_spoken_form(tmp_path: Path) -> None:
    synth = TextToneSynth(TextOptions(lexicon=lexicon(tmp_path, "Acme | * | Ackmee\n")))
    async with running_engine(synth, free_port()) as eng:
        reply = await cmd(eng.cmd_port, "NORMALIZE:**Acme** total: $42.50, Mon–Fri 8:00–17:00")
        assert reply == (
            "Ackmee total: forty-two dollars and fifty cents, Monday to Friday "
            "eight a.m. to five p.m."
        )
        de = await cmd(eng.cmd_port, "NORMALIZE:Ihr Termin ist am 3.12. um 14:30 Uhr.")
        assert de == "Ihr Termin ist am dritten Dezember um vierzehn Uhr dreißig."
        assert await cmd(eng.cmd_port, "NORMALIZE:") == "ERROR:format NORMALIZE:<text>"
        assert await cmd(eng.cmd_port, "normalize:a\r\n") == "a"


async def test_reload_lexicon_command(tmp_path: Path) -> None:
    path = lexicon(tmp_path, "Acme | * | Ackmee\n")
    synth = TextToneSynth(TextOptions(lexicon=path))
    async with running_engine(synth, free_port()) as eng:
        path.write_text("Acme | * | Ack me\nBeta | en | Bayta\n", encoding="utf-8")
        assert await cmd(eng.cmd_port, "RELOAD_LEXICON") == "OK 2"
        assert await cmd(eng.cmd_port, "NORMALIZE:Acme Beta") == "Ack me Bayta"
        path.write_text("Acme | * | gone\nno bars here\nX | fr | y\n", encoding="utf-8")
        assert await cmd(eng.cmd_port, "RELOAD_LEXICON") == (
            "ERROR:2:expected 'phrase | lang | replacement [| flags]', got 1 field(s); "
            "3:unknown language 'fr' (de, en or *)"
        )
        assert await cmd(eng.cmd_port, "NORMALIZE:Acme Beta") == "Ack me Bayta"  # old kept


async def test_engine_without_text_front_end_answers_an_error() -> None:
    async with running_engine(ToneSynth(), free_port()) as eng:
        assert (
            await cmd(eng.cmd_port, "NORMALIZE:hi") == "ERROR:0:this engine has no text front end"
        )
        assert await cmd(eng.cmd_port, "RELOAD_LEXICON") == (
            "ERROR:0:this engine has no text front end"
        )


async def test_reload_without_lexicon_flag() -> None:
    async with running_engine(TextToneSynth(), free_port()) as eng:
        assert await cmd(eng.cmd_port, "RELOAD_LEXICON") == (
            "ERROR:0:no lexicon configured (--lexicon PATH)"
        )


async def test_reload_while_calls_speak_loses_nothing(tmp_path: Path) -> None:
    old, new = "Acme | * | Ackmee\n", "Acme | * | Ack me\n"
    path = lexicon(tmp_path, old)
    synth = TextToneSynth(TextOptions(lexicon=path), phrase_ms=20, delay=0.002)
    dock = FakeDock()
    await dock.start()
    texts = [f"Acme order {i} is ready." for i in range(40)]
    try:
        async with running_engine(synth, dock.port) as eng:
            s = await dock.session()
            replies: list[str] = []

            async def reloader() -> None:
                for i in range(30):
                    body = (new if i % 2 else old) if i % 3 else "broken line\n"
                    path.write_text(body, encoding="utf-8")
                    replies.append(await cmd(eng.cmd_port, "RELOAD_LEXICON"))
                    await asyncio.sleep(0.005)

            task = asyncio.ensure_future(reloader())
            for i, text in enumerate(texts):
                s.text(1 + i % 4, text)
                await asyncio.sleep(0.003)
            await task
            for call in range(1, 5):
                await s.wait_audio(call, n=1, within=20)
            async with asyncio.timeout(30):
                while eng.stats.utterances_completed < len(texts):  # noqa: ASYNC110
                    await asyncio.sleep(0.02)
            assert eng.stats.utterances_failed == 0
            assert eng.stats.texts_dropped == 0
    finally:
        await dock.stop()
    assert any(r == "OK 1" for r in replies) and any(r.startswith("ERROR:1:") for r in replies)
    # every text was spoken once, each with one whole lexicon (old or new), none lost
    assert len(synth.spoken) == len(texts)
    said = sorted(synth.spoken)
    want = sorted(
        f"{name} order {cardinal(i, 'en')} is ready."
        for i in range(len(texts))
        for name in ("Ackmee", "Ack me")
    )
    assert all(x in want for x in said), said
    numbers = sorted(x.split(" order ")[1] for x in said)
    assert numbers == sorted(f"{cardinal(i, 'en')} is ready." for i in range(len(texts)))


def test_common_flags_build_text_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = common_parser("x")
    args = p.parse_args(
        ["--no-normalize", "--lexicon", str(tmp_path / "l.txt"), "--date-order", "dmy"]
    )
    assert text_options(args) == TextOptions(False, tmp_path / "l.txt", "dmy")
    assert text_options(p.parse_args([])) == TextOptions()
    monkeypatch.setenv("TTSDOCK_NO_NORMALIZE", "yes")
    monkeypatch.setenv("TTSDOCK_DATE_ORDER", "dmy")
    assert text_options(common_parser("x").parse_args([])) == TextOptions(False, None, "dmy")
    monkeypatch.setenv("TTSDOCK_DATE_ORDER", "ymd")
    with pytest.raises(SystemExit) as exc:
        common_parser("x")
    assert exc.value.code == 2


def test_engine_flags_reach_both_engines(tmp_path: Path) -> None:
    from engines.kokoro.cli import build_parser as kokoro_parser
    from engines.kokoro.cli import config_from_args
    from engines.qwen3.cli.dock import build_parser as qwen3_parser
    from engines.qwen3.cli.dock import options_from_args

    flags = ["--no-normalize", "--lexicon", str(tmp_path / "l.txt")]
    k = config_from_args(kokoro_parser().parse_args(flags))
    assert k.text == TextOptions(False, tmp_path / "l.txt")
    q = options_from_args(qwen3_parser().parse_args([*flags, "--model-dir", str(tmp_path)]))
    assert q.text == TextOptions(False, tmp_path / "l.txt")


@pytest.mark.slow
async def test_sighup_reloads_the_lexicon_in_a_real_process(tmp_path: Path) -> None:
    path = lexicon(tmp_path, "Acme | * | Ackmee\n")
    port = free_port()
    proc = subprocess.Popen(  # noqa: ASYNC220 - the engine runs beside the loop
        [
            sys.executable,
            str(ROOT / "tests" / "text_helpers.py"),
            "--dock-port",
            str(free_port()),
            "--cmd-port",
            str(port),
            "--lexicon",
            str(path),
        ],
        cwd=str(ROOT),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    log = EngineLog(proc)
    try:

        async def normalized() -> str:
            async with asyncio.timeout(30):
                while True:
                    try:
                        return await cmd(port, "NORMALIZE:Acme", within=5)
                    except OSError:
                        await asyncio.sleep(0.1)

        assert await normalized() == "Ackmee"
        path.write_text("Acme | * | Ack me\n", encoding="utf-8")
        proc.send_signal(signal.SIGHUP)
        async with asyncio.timeout(20):
            reply = await normalized()
            while reply != "Ack me":
                await asyncio.sleep(0.05)
                reply = await normalized()
        path.write_text("bad\n", encoding="utf-8")
        proc.send_signal(signal.SIGHUP)
        await log.wait_for("lexicon_reload_rejected", within=20)  # the reload has run
        assert await normalized() == "Ack me"  # a bad file on reload keeps the old lexicon
        assert proc.poll() is None  # SIGHUP never ends the engine
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    assert "lexicon_reloaded" in log.text() and "lexicon_reload_rejected" in log.text()


def test_bad_lexicon_at_start_up_fails_the_engine(tmp_path: Path) -> None:
    path = lexicon(tmp_path, "broken\n")
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tests" / "text_helpers.py"),
            "--dock-port",
            str(free_port()),
            "--cmd-port",
            "0",
            "--lexicon",
            str(path),
        ],
        cwd=str(ROOT),
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert b"1:expected" in proc.stderr


def test_engine_unit_reloads_the_lexicon_with_sighup() -> None:
    unit = (ROOT / "systemd" / "ttsdock-engine@.service").read_text(encoding="utf-8")
    assert "\nExecReload=/bin/kill -HUP $MAINPID\n" in unit
