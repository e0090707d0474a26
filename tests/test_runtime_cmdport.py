"""Engine cmd port (docs/wire.md#engine-cmd-port): every command, every error reply, the
bind retry."""

from __future__ import annotations

import asyncio
import re
import socket
import wave
from pathlib import Path
from typing import Any

import pytest
from runtime_helpers import FakeDock, ToneSynth, cmd, free_port, running_engine

from engines.runtime.cmdport import safe_relative

D6 = r"\d+\.\d{6}"


@pytest.fixture
async def engine(tmp_path: Path):  # type: ignore[no-untyped-def]
    """An engine whose dock port is closed: the cmd port must serve anyway."""
    synth = ToneSynth(phrase_ms=250)
    async with running_engine(synth, free_port(), out_dir=tmp_path) as eng:
        yield eng


async def test_ping_and_status_undocked(engine) -> None:  # type: ignore[no-untyped-def]
    assert await cmd(engine.cmd_port, "PING") == "PONG"
    assert await cmd(engine.cmd_port, "ping\r\n") == "PONG"
    assert await cmd(engine.cmd_port, "STATUS") == (
        "ACTIVE_CALLS:0:DOCK:disconnected:SPEED:1.00:TEST:tone"
    )


async def test_status_docked() -> None:
    dock = FakeDock()
    await dock.start()
    try:
        async with running_engine(ToneSynth(), dock.port) as eng:
            s = await dock.session()
            s.text(3, "hi")
            await s.wait_audio(3)
            assert await cmd(eng.cmd_port, "STATUS") == (
                "ACTIVE_CALLS:1:DOCK:connected:SPEED:1.00:TEST:tone"
            )
    finally:
        await dock.stop()


async def test_test_synth(engine) -> None:  # type: ignore[no-untyped-def]
    reply = await cmd(engine.cmd_port, "TEST_SYNTH:hello world")
    m = re.fullmatch(
        rf"SYNTH_RESULT:(\d+)ms:(\d+):24000:({D6})s:rtf=({D6}):peak=({D6}):rms=({D6})", reply
    )
    assert m, reply
    assert int(m[2]) == 2 * 6000
    assert m[3] == "0.500000"
    assert m[5] == "0.900000"
    assert 0.55 < float(m[6]) < 0.65  # a sine at 0.9 peak, minus the fade-in


@pytest.mark.parametrize(
    "line", ["TEST_SYNTH:!fail", "TEST_SYNTH:", "TEST_SYNTH", "TEST_SYNTH:   "]
)
async def test_test_synth_errors(engine, line: str) -> None:  # type: ignore[no-untyped-def]
    assert await cmd(engine.cmd_port, line) == "ERROR:synthesis failed"


async def test_benchmark(engine) -> None:  # type: ignore[no-untyped-def]
    reply = await cmd(engine.cmd_port, "BENCHMARK:hello|3")
    assert re.fullmatch(rf"BENCH_RESULT:\d+ms:\d+ms:\d+ms:3/3:6000@24000:rtf={D6}", reply), reply
    reply = await cmd(engine.cmd_port, "BENCHMARK:a b")
    assert re.fullmatch(rf"BENCH_RESULT:\d+ms:\d+ms:\d+ms:5/5:12000@24000:rtf={D6}", reply), reply
    reply = await cmd(engine.cmd_port, "BENCHMARK:a|b")  # not a count: part of the text
    assert ":5/5:6000@24000:" in reply
    assert await cmd(engine.cmd_port, "BENCHMARK:!fail|2") == "ERROR:all iterations failed"


async def test_synth_wav_writes_16bit_mono(engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    reply = await cmd(engine.cmd_port, "SYNTH_WAV:sub/dir/out.wav|hello there")
    assert re.fullmatch(
        rf"WAV_RESULT:\d+ms:12000:24000:0\.500000s:rtf={D6}:path=sub/dir/out.wav", reply
    ), reply
    with wave.open(str(tmp_path / "sub/dir/out.wav")) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()) == (
            1,
            2,
            24000,
            12000,
        )
        frames = w.readframes(100)
    assert frames[:2] == b"\x00\x00"  # fade-in starts at zero
    assert not list(tmp_path.rglob("*.part"))  # noqa: ASYNC240


@pytest.mark.parametrize(
    ("line", "reply"),
    [
        ("SYNTH_WAV", "ERROR:format SYNTH_WAV:<path>|<text>"),
        ("SYNTH_WAV:out.wav", "ERROR:format SYNTH_WAV:<path>|<text>"),
        ("SYNTH_WAV:|hello", "ERROR:empty path or text"),
        ("SYNTH_WAV:out.wav|", "ERROR:empty path or text"),
        ("SYNTH_WAV:out.wav|   ", "ERROR:empty path or text"),
        ("SYNTH_WAV:/tmp/x.wav|hello", "ERROR:invalid path (no traversal or absolute paths)"),
        ("SYNTH_WAV:../x.wav|hello", "ERROR:invalid path (no traversal or absolute paths)"),
        ("SYNTH_WAV:a/../../x.wav|hello", "ERROR:invalid path (no traversal or absolute paths)"),
        ("SYNTH_WAV:~/x.wav|hello", "ERROR:invalid path (no traversal or absolute paths)"),
        ("SYNTH_WAV:a\\..\\x.wav|hello", "ERROR:invalid path (no traversal or absolute paths)"),
        ("SYNTH_WAV:x.wav|!fail", "ERROR:synthesis failed"),
    ],
)
async def test_synth_wav_errors(engine, tmp_path: Path, line: str, reply: str) -> None:  # type: ignore[no-untyped-def]
    assert await cmd(engine.cmd_port, line) == reply
    assert list(tmp_path.iterdir()) == []  # noqa: ASYNC240


async def test_synth_wav_symlink_escape_refused(engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    outside = tmp_path.parent / (tmp_path.name + "-outside")
    outside.mkdir()
    (tmp_path / "link").symlink_to(outside)
    reply = await cmd(engine.cmd_port, "SYNTH_WAV:link/x.wav|hello")
    assert reply == "ERROR:invalid path (no traversal or absolute paths)"
    assert list(outside.iterdir()) == []


async def test_synth_wav_write_failure_removes_partial(engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "taken.wav").mkdir()  # the final rename onto a directory fails
    assert await cmd(engine.cmd_port, "SYNTH_WAV:taken.wav|hello") == (
        "ERROR:write failed (disk full?)"
    )
    (tmp_path / "file").write_text("x")  # a file where a directory is needed
    assert await cmd(engine.cmd_port, "SYNTH_WAV:file/x.wav|hello") == (
        "ERROR:write failed (disk full?)"
    )
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["file", "taken.wav"]  # noqa: ASYNC240


def test_safe_relative() -> None:
    assert safe_relative("a/b.wav") is not None
    for bad in ("", "/a", "../a", "a/..", "~x", "c:x.wav", "a\0b", "a\\b"):
        assert safe_relative(bad) is None, bad


@pytest.mark.parametrize(
    ("arg", "reply"),
    [
        ("1.5", "SPEED:1.50"),
        ("9", "SPEED:2.00"),
        ("0.1", "SPEED:0.50"),
        (" 1.234 ", "SPEED:1.23"),
        ("abc", "ERROR:Invalid speed value"),
        ("", "ERROR:Invalid speed value"),
        ("nan", "ERROR:Invalid speed value"),
        ("inf", "ERROR:Invalid speed value"),
    ],
)
async def test_set_speed(engine, arg: str, reply: str) -> None:  # type: ignore[no-untyped-def]
    assert await cmd(engine.cmd_port, f"SET_SPEED:{arg}") == reply


async def test_speed_and_voice_reach_the_call_state() -> None:
    dock = FakeDock()
    await dock.start()
    synth = ToneSynth()
    try:
        async with running_engine(synth, dock.port) as eng:
            s = await dock.session()
            assert await cmd(eng.cmd_port, "GET_SPEED") == "SPEED:1.00"
            assert await cmd(eng.cmd_port, "SET_SPEED:1.25") == "SPEED:1.25"
            assert await cmd(eng.cmd_port, "GET_SPEED") == "SPEED:1.25"
            assert await cmd(eng.cmd_port, "VOICES") == "VOICES:alpha,beta"
            assert await cmd(eng.cmd_port, "GET_VOICE") == "VOICE:alpha"
            assert await cmd(eng.cmd_port, "SET_VOICE:beta") == "VOICE:beta"
            assert await cmd(eng.cmd_port, "SET_VOICE:nope") == "ERROR:Unknown voice nope"
            assert await cmd(eng.cmd_port, "GET_VOICE") == "VOICE:beta"
            s.text(2, "hi")
            await s.wait_audio(2)
            assert (synth.calls[-1].voice, synth.calls[-1].speed) == ("beta", 1.25)
            assert "STATUS" and (await cmd(eng.cmd_port, "STATUS")).endswith(
                ":SPEED:1.25:TEST:tone"
            )
    finally:
        await dock.stop()


async def test_set_log_level(engine) -> None:  # type: ignore[no-untyped-def]
    from svc.logs import current_level

    assert await cmd(engine.cmd_port, "SET_LOG_LEVEL:DEBUG") == "OK"
    assert current_level() == "DEBUG"
    assert await cmd(engine.cmd_port, "SET_LOG_LEVEL:warn") == "OK"
    assert current_level() == "WARN"
    reply = await cmd(engine.cmd_port, "SET_LOG_LEVEL:LOUD")
    assert reply.startswith("ERROR:Unknown log level LOUD")
    assert current_level() == "WARN"
    await cmd(engine.cmd_port, "SET_LOG_LEVEL:INFO")


async def test_stats(engine) -> None:  # type: ignore[no-untyped-def]
    reply = await cmd(engine.cmd_port, "STATS")
    assert reply.startswith("STATS:calls_active=0:")
    for key in (
        "ttfa_p50_ms=",
        "ttfa_p99_ms=",
        "bargein_mute_p99_ms=",
        "bargein_stop_p50_ms=",
        "queue_depth=0",
        "syntheses_waiting=0",
        "max_concurrent=4",
        "synth.phrases=",
    ):
        assert key in reply, key


@pytest.mark.parametrize("line", ["HELLO", "", "GARBAGE:x", "STATUSX", "\xff\xfe"])
async def test_unknown_command(engine, line: str) -> None:  # type: ignore[no-untyped-def]
    assert await cmd(engine.cmd_port, line.encode("latin-1")) == "ERROR:Unknown command"


async def test_long_command_is_bounded(engine) -> None:  # type: ignore[no-untyped-def]
    reply = await cmd(engine.cmd_port, "PING" + "x" * 10000)
    assert reply == "ERROR:Unknown command"


async def test_cmd_port_bind_retry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """During a hot swap the old engine still holds the port: bind as soon as it is free."""
    blocker = socket.socket()
    blocker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    port = blocker.getsockname()[1]
    import svc.net
    from engines.runtime.app import Engine, EngineConfig

    real_start_server = asyncio.start_server
    refused: list[int] = []

    async def counting_start_server(*args: Any, **kwargs: Any) -> asyncio.Server:
        try:
            return await real_start_server(*args, **kwargs)
        except OSError:
            refused.append(1)
            raise

    monkeypatch.setattr(svc.net.asyncio, "start_server", counting_start_server)
    eng = Engine(ToneSynth(), EngineConfig(name="tone", dock_port=free_port(), cmd_port=port))
    await eng.start()
    try:
        async with asyncio.timeout(10):  # barrier: the bind was tried and refused twice
            while len(refused) < 2:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        assert eng.cmd_server is None  # still waiting for the port
        blocker.close()
        async with asyncio.timeout(5):
            while eng.cmd_port is None:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        assert eng.cmd_port == port
        assert await cmd(port, "PING") == "PONG"
    finally:
        blocker.close()
        eng.request_stop("test")
        await eng.shutdown()
