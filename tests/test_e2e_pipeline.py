"""System level: the dock and real engines as processes, LLaMA and OAP played over sockets.

Every test starts ``python -m ttsdock serve`` and real engines (``python -m ttsdock kokoro``
on the real Kokoro model, ``python -m ttsdock qwen3`` on a tiny generated model) on free
loopback ports, sends text Packets and mgmt frames as the C++ LLaMA stage does, and
checks what reaches the fake OAP byte by byte. Nothing waits a fixed time where a poll
with a (generous) deadline works; every process is stopped at teardown.
"""

from __future__ import annotations

import asyncio
import re
import sys
import time
from pathlib import Path

import pytest
from dock_helpers import DockProcess, FakeLlama, recv_until
from e2e_helpers import (
    START_TIMEOUT,
    TIMEOUT,
    Cleanup,
    EngineProcess,
    RecordingOap,
    check_audio_packets,
    clean_env,
    now_us,
    poll,
    rms,
    wait_active,
)
from runtime_helpers import free_port

from protocol.mgmt import CallEnd, SpeechActive, SpeechIdle

pytestmark = pytest.mark.slow

pytest.importorskip("onnxruntime")


# --------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    kh = pytest.importorskip("kokoro_helpers")
    return Path(kh.shared_models_dir(tmp_path_factory))


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny generated Qwen3-TTS CustomVoice model set (GGUF files + tiny ONNX vocoder)."""
    pytest.importorskip("torch")
    pytest.importorskip("gguf")
    qh = pytest.importorskip("qwen3_helpers")
    from qwen3_vocoder_fixture import export_tiny_vocoder

    from engines.qwen3.weights.paths import VOCODER_FILE

    d = tmp_path_factory.mktemp("e2e-qwen3")
    hf = qh.write_checkpoint(d / "hf", qh.tiny_config("custom_voice", text_hidden=8))
    out = d / "models"
    qh.convert_checkpoint(hf, out, dtype="f16")
    export_tiny_vocoder(out / VOCODER_FILE)
    return out


#: Synthesis threads at the loop's priority (the default since niced threads were found to
#: starve the engine's event loop of the GIL on a busy host: see
#: test_keepalive_survives_cpu_contention below); pinned here so an inherited
#: TTSDOCK_SYNTH_NICE cannot change what these tests are about.
NO_NICE = {"TTSDOCK_SYNTH_NICE": "0"}


class Stage:
    """Fake OAP + dock process + fake LLaMA, all up and connected."""

    def __init__(self, oap: RecordingOap, dock: DockProcess, llama: FakeLlama) -> None:
        self.oap, self.dock, self.llama = oap, dock, llama

    def kokoro(
        self, models_dir: Path, cmd_port: int, tag: str = "", env: dict[str, str] | None = None
    ) -> EngineProcess:
        return EngineProcess(
            self.dock.tmp, "kokoro", self.dock.ports["dock"], cmd_port,
            "--models-dir", str(models_dir), "--threads", "1", tag=tag,
            env=NO_NICE if env is None else env,
        )  # fmt: skip

    async def stop_dock(self) -> None:
        rc = await self.dock.stop()
        logs = self.dock.logs()
        assert rc == 0, logs
        assert "Traceback" not in logs, logs


async def stage(tmp: Path, cleanup: Cleanup, *dock_args: str) -> Stage:
    oap = RecordingOap()
    await oap.start()
    cleanup.later(oap.stop)
    dock = cleanup.dock(DockProcess(tmp, oap.ports, *dock_args))
    await dock.start()
    await poll(lambda: _true(oap.mgmt is not None and oap.data is not None), what="OAP connects")
    llama = await FakeLlama(dock.ports).connect()
    cleanup.later(llama.close)
    return Stage(oap, dock, llama)


async def _true(x: bool) -> bool:
    return x


async def settled(
    eng: EngineProcess, oap: RecordingOap, *, before: int = 0, completed: int | None = None
) -> dict[str, str]:
    """Poll until the engine has nothing queued or running, has completed ``completed``
    utterances (if given), and every packet it sent has reached OAP (its ``packets_sent``
    equals what OAP holds beyond the first ``before`` packets); its final STATS."""
    last: dict[str, str] = {}

    async def done() -> bool:
        nonlocal last
        eng.check_alive()
        last = await eng.stats()
        busy = int(last["syntheses_running"]) + int(last["syntheses_waiting"])
        return (
            busy == 0
            and int(last["queue_depth"]) == 0
            and (completed is None or int(last["utterances_completed"]) == completed)
            and int(last["packets_sent"]) == len(oap.arrivals) - before
        )

    try:
        await poll(done, START_TIMEOUT, f"{eng.kind} idle with all audio at OAP")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; OAP holds {len(oap.arrivals)}; engine: {last}") from None
    return last


async def end_engine(eng: EngineProcess) -> None:
    rc = await eng.stop()
    logs = eng.logs()
    assert rc == 0, logs[-4000:]
    assert "Traceback" not in logs, logs[-4000:]


# --------------------------------------------------------------------- 2. dock + Kokoro
LONG = {
    1: "Thank you for calling today. Your order has shipped. It will arrive on Monday morning.",
    2: "Good afternoon and welcome back. Your ticket was updated. We will call you back soon.",
    3: "Hello there, nice to meet you. Your appointment is on Friday. Please bring your papers.",
}


async def test_kokoro_calls_bargein_and_call_end(
    models_dir: Path, tmp_path: Path, cleanup: Cleanup
) -> None:
    st = await stage(tmp_path, cleanup)
    eng = cleanup.engine(await st.kokoro(models_dir, free_port()).start())
    await wait_active(st.dock, "kokoro", eng)
    t0 = now_us()

    # Three calls at once; as soon as call 2 is heard, its caller barges in.
    for cid, text in LONG.items():
        st.llama.text(cid, text)
    await poll(lambda: _true(len(st.oap.of(2)) > 0), START_TIMEOUT, "first audio of call 2")
    t_barge = now_us()
    st.llama.send(SpeechActive(2))
    stats = await settled(eng, st.oap, completed=2)

    arrivals = st.oap.arrivals
    check_audio_packets(arrivals, t0)
    heard = {cid: st.oap.samples(cid) / 24000 for cid in LONG}
    print(f"audio heard per call (s): {heard}")
    # calls 1 and 3 were spoken in full (three sentences each: several seconds)
    for cid in (1, 3):
        assert heard[cid] > 3.0, heard
        assert rms(st.oap.audio(cid)) > 0.02
        # and they went on after the barge-in of call 2
        assert any(a.t_us > t_barge for a in st.oap.of(cid)), f"call {cid} stopped too"
    assert int(stats["bargeins"]) == 1, stats
    assert int(stats["utterances_cancelled"]) == 1 and int(stats["utterances_completed"]) == 2
    speech = await recv_until(st.oap.messages, lambda m: isinstance(m, SpeechActive))
    assert speech == SpeechActive(2)  # the barge-in also went on to OAP

    # The caller stops talking: the next answer on call 2 is spoken in full again.
    st.llama.send(SpeechIdle(2))
    t_resume = now_us()
    st.llama.text(2, "Okay, sure.")
    await settled(eng, st.oap, completed=3)
    again = [a for a in st.oap.of(2) if a.t_us > t_resume]
    assert sum(a.n_samples for a in again) > 12000, "call 2 stayed silent after SPEECH_IDLE"

    # CALL_END: once per call id. Call 1's twice; call 3's afterwards marks the end of the
    # stream (one mgmt connection: whatever the dock forwarded arrived before it).
    for cid in (1, 1, 2, 3):
        st.llama.send(CallEnd(cid))
    await recv_until(st.oap.messages, lambda m: m == CallEnd(3))
    ends = [m for m in st.oap.seen if isinstance(m, CallEnd)]
    assert ends == [CallEnd(1), CallEnd(2), CallEnd(3)], ends
    dock_stats = await st.dock.stats()
    assert int(dock_stats["drop_duplicate_call_end"]) == 1, dock_stats
    assert int(dock_stats["calls_ended"]) == 3
    # the engine dropped the calls' state
    await poll(
        lambda: _true_async(eng.cmd("STATUS"), lambda r: r.startswith("ACTIVE_CALLS:0:")),
        what="engine ACTIVE_CALLS:0",
    )
    assert int((await eng.stats())["calls_ended"]) == 3
    # text for an ended call is dropped by the dock; a new call behind it is spoken
    st.llama.text(1, "Are you still there?")
    st.llama.text(7, "Bye.")
    stats = await settled(eng, st.oap, completed=4)
    assert int(stats["texts_received"]) == 5, stats  # 3 + "Okay, sure." + "Bye."
    assert await st.dock.stat("drop_call_ended") == 1
    assert st.oap.samples(7) > 2400
    check_audio_packets(st.oap.arrivals, t0)

    # call 2 stopped before its full length: the barge-in left at call 2's first audio, and
    # a sentence's first window leaves at least ``min_window`` frames (1.2 s) to the later
    # windows, which it cancelled. How much the first window holds depends on the speed (a
    # slow or crowded engine plans a later start), so the bound is call 2's own full
    # length (an offline synthesis of the same text, last: it counts as an utterance).
    full = await eng.cmd(f"TEST_SYNTH:{LONG[2]}", within=START_TIMEOUT)
    assert full.startswith("SYNTH_RESULT:"), full
    full_s = int(full.split(":")[2]) / 24000
    assert heard[2] < full_s - 1.0, (heard, full_s)

    await end_engine(eng)
    await st.stop_dock()


async def _true_async(reply: object, pred: object) -> bool:
    assert asyncio.iscoroutine(reply) and callable(pred)
    return bool(pred(await reply))


# --------------------------------------------------------------------- 3. hot swap
async def test_hot_swap_kokoro_to_qwen3(
    models_dir: Path, qwen3_dir: Path, tmp_path: Path, cleanup: Cleanup
) -> None:
    st = await stage(tmp_path, cleanup)
    cmd_port = free_port()
    kokoro = cleanup.engine(await st.kokoro(models_dir, cmd_port).start())
    await wait_active(st.dock, "kokoro", kokoro)
    assert re.search(r":G2P:espeak:PLAN:(int8|fp32|fp32_conv2d)$", await kokoro.cmd("STATUS"))
    st.llama.text(1, "Hello.")
    await settled(kokoro, st.oap, completed=1)
    assert st.oap.samples(1) > 2400

    # The newcomer docks on the same dock port and wants the same cmd port.
    qwen3 = cleanup.engine(
        await EngineProcess(
            tmp_path, "qwen3", st.dock.ports["dock"], cmd_port,
            "--model-dir", str(qwen3_dir), "--max-frames", "12", "--seed", "1", env=NO_NICE,
        ).start()
    )  # fmt: skip
    await wait_active(st.dock, "qwen3", qwen3)
    # the old engine was told to SHUTDOWN and exits 0 (within the 2 s budget + noise)
    rc = await kokoro.wait_exit(TIMEOUT)
    assert rc == 0, kokoro.logs()[-4000:]
    assert kokoro.events("shutdown_requested"), kokoro.logs()[-4000:]
    assert "Traceback" not in kokoro.logs()
    await st.oap.flushes()  # OAP was told to drop the old engine's audio
    engines = (await st.dock.cmd("ENGINES")).strip()
    assert "active=qwen3/" in engines and "swaps=1" in engines, engines

    # netcat on the engine cmd port now reaches the new engine (it retried the bind)
    async def qwen3_answers() -> bool:
        qwen3.check_alive()
        return (
            re.fullmatch(
                r"ACTIVE_CALLS:\d+:DOCK:connected:SPEED:1\.00:MODE:customvoice",
                await qwen3.cmd("STATUS"),
            )
            is not None
        )

    await poll(qwen3_answers, TIMEOUT, "qwen3 on the engine cmd port")

    # new text is spoken by qwen3 and reaches OAP
    before = len(st.oap.arrivals)
    t0 = now_us()
    st.llama.text(2, "Hello world.")
    stats = await settled(qwen3, st.oap, before=before, completed=1)
    new = st.oap.arrivals[before:]
    assert {a.call_id for a in new} == {2}
    check_audio_packets(new, t0)
    frames = float(stats["synth.last_frames"])
    assert frames >= 1 and st.oap.samples(2) == int(frames) * 1920, (stats, st.oap.samples(2))
    assert int(stats["utterances_completed"]) == 1

    await end_engine(qwen3)
    await st.stop_dock()


# --------------------------------------------------------------------- 4. engine crash
HELD = ["Yes.", "Thank you very much.", "Goodbye and have a nice day."]


async def test_engine_crash_then_held_text_reaches_next_engine(
    models_dir: Path, tmp_path: Path, cleanup: Cleanup
) -> None:
    st = await stage(tmp_path, cleanup, "--hold-seconds", "300")
    first = cleanup.engine(await st.kokoro(models_dir, free_port(), tag="kokoro1").start())
    await wait_active(st.dock, "kokoro", first)
    st.llama.text(1, LONG[1])
    await poll(lambda: _true(len(st.oap.of(1)) > 0), START_TIMEOUT, "call 1 speaking")

    first.kill()  # kill -9 in mid-sentence
    assert await first.wait_exit() == -9
    await st.oap.flushes()
    assert (await st.dock.cmd("PING")).strip() == "PONG"
    await poll(lambda: _true_async(st.dock.cmd("STATUS"), lambda r: r.strip() == "NONE"))
    assert st.dock.proc is not None and st.dock.proc.returncode is None

    # text while no engine is docked is held (nothing blocks, nothing is dropped)...
    for text in HELD:
        st.llama.text(5, text)
    st.llama.text(6, "Hello.")

    async def held() -> bool:
        return (await st.dock.stat("text_held")) == 4

    await poll(held, what="4 text packets held")
    calls = (await st.dock.cmd("CALLS")).strip()
    assert "5:" in calls and f"held=3/{sum(len(t) for t in HELD)}B" in calls, calls
    assert (await st.dock.cmd("STATUS")).strip() == "NONE"

    # ...and delivered, in order, when the next engine docks
    before = len(st.oap.arrivals)
    second = cleanup.engine(await st.kokoro(models_dir, free_port(), tag="kokoro2").start())
    await wait_active(st.dock, "kokoro", second)
    stats = await settled(second, st.oap, before=before, completed=4)
    assert int(stats["utterances_completed"]) == 4 and int(stats["texts_received"]) == 4
    assert await st.dock.stat("text_delivered_from_hold") == 4
    started = [e for e in second.events("utterance_started") if e.get("call_id") == 5]
    assert [e["chars"] for e in started] == [len(t) for t in HELD], started
    for cid in (5, 6):
        assert st.oap.samples(cid) > 2400, cid
    assert {a.call_id for a in st.oap.arrivals[before:]} == {5, 6}
    check_audio_packets(st.oap.arrivals[before:], 0)

    await end_engine(second)
    await st.stop_dock()


# --------------------------------------------------------------------- 5. dock restart
async def test_engine_redocks_after_dock_restart(
    models_dir: Path, tmp_path: Path, cleanup: Cleanup
) -> None:
    ports = {k: free_port() for k in ("llama-mgmt", "llama-data", "cmd", "dock")}
    fixed = [a for k, p in ports.items() for a in (f"--{k}-port", str(p))]
    st = await stage(tmp_path, cleanup, *fixed)
    eng = cleanup.engine(await st.kokoro(models_dir, free_port()).start())
    await wait_active(st.dock, "kokoro", eng)
    st.llama.text(1, "Hello.")
    await settled(eng, st.oap, completed=1)
    assert st.oap.samples(1) > 2400

    await st.llama.close()
    await st.stop_dock()
    t_down = time.monotonic()
    await poll(
        lambda: _true_async(eng.cmd("STATUS"), lambda r: ":DOCK:disconnected:" in r),
        what="engine sees the dock gone",
    )
    # idle for more than a second (the engine's silence rule and retry loop must not
    # give up or back off)
    await asyncio.sleep(max(0.0, t_down + 1.5 - time.monotonic()))
    eng.check_alive()

    await st.dock.start()  # the same ports
    assert st.dock.ports["dock"] == ports["dock"]
    t_up = time.monotonic()
    await wait_active(st.dock, "kokoro", eng)
    redock_s = time.monotonic() - t_up
    print(f"engine re-docked {redock_s:.3f} s after the dock was ready again")
    assert int((await eng.stats())["docks"]) == 2
    await poll(lambda: _true(st.oap.mgmt_connects == 2 and st.oap.data_connects == 2))

    llama = await FakeLlama(st.dock.ports).connect()
    cleanup.later(llama.close)
    before = len(st.oap.arrivals)
    t0 = now_us()
    llama.text(2, "Hello again.")
    await settled(eng, st.oap, completed=2)
    assert st.oap.samples(2) > 2400
    check_audio_packets(st.oap.arrivals[before:], t0)

    await end_engine(eng)
    await st.stop_dock()


# --------------------------------------------------------------------- 6. ttsdock ctl
async def ctl(port: int, *words: str) -> tuple[int, str, str]:
    p = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ttsdock", "ctl", "--port", str(port), *words,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=clean_env(),
    )  # fmt: skip
    out, err = await asyncio.wait_for(p.communicate(), TIMEOUT)
    assert p.returncode is not None
    return p.returncode, out.decode(), err.decode()


async def test_ctl_against_dock_and_engine(
    models_dir: Path, tmp_path: Path, cleanup: Cleanup
) -> None:
    st = await stage(tmp_path, cleanup)
    eng = cleanup.engine(await st.kokoro(models_dir, free_port()).start())
    await wait_active(st.dock, "kokoro", eng)
    dock_port = st.dock.ports["cmd"]

    assert await ctl(dock_port, "PING") == (0, "PONG\n", "")
    assert await ctl(dock_port, "STATUS") == (0, "ACTIVE kokoro\n", "")
    assert await ctl(dock_port, "SET_LOG_LEVEL:WARN") == (0, "OK\n", "")
    assert await ctl(dock_port, "FROBNICATE") == (1, "ERR unknown_command\n", "")
    rc, out, _ = await ctl(dock_port, "SET_LOG_LEVEL:LOUD")
    assert rc == 1 and out.startswith("ERR "), out

    port = eng.cmd_port
    assert await ctl(port, "PING") == (0, "PONG\n", "")
    assert await ctl(port, "SET_SPEED:1.5") == (0, "SPEED:1.50\n", "")
    assert await ctl(port, "GET_SPEED") == (0, "SPEED:1.50\n", "")
    assert await ctl(port, "SET_SPEED:fast") == (1, "ERROR:Invalid speed value\n", "")
    assert await ctl(port, "NOPE") == (1, "ERROR:Unknown command\n", "")
    # words are joined with blanks: a sentence needs no quoting
    rc, out, _ = await ctl(port, "TEST_SYNTH:Hello", "there.")
    m = re.fullmatch(
        r"SYNTH_RESULT:(\d+)ms:(\d+):24000:([\d.]+)s:rtf=([\d.]+):peak=([\d.]+):rms=([\d.]+)\n",
        out,
    )
    assert rc == 0 and m is not None, out
    assert int(m.group(2)) > 12000 and float(m.group(5)) == pytest.approx(0.9, abs=0.01)

    rc, out, err = await ctl(free_port(), "PING")  # nothing listens there
    assert (rc, out) == (2, "") and "cannot reach" in err, err

    await end_engine(eng)
    await st.stop_dock()


# ------------------------------------------------------------- keepalive under contention
async def test_keepalive_survives_cpu_contention(
    models_dir: Path, tmp_path: Path, cleanup: Cleanup
) -> None:
    """Kokoro with the default synthesis-thread priority, three calls at once, while two
    other CPU-bound processes run (any shared machine): the engine must stay docked."""
    st = await stage(tmp_path, cleanup)
    eng = cleanup.engine(await st.kokoro(models_dir, free_port(), env={}).start())
    await wait_active(st.dock, "kokoro", eng)
    burners = [
        await asyncio.create_subprocess_exec(sys.executable, "-c", "while 1: pass", env=clean_env())
        for _ in range(2)
    ]

    async def stop_burners() -> None:
        for b in burners:
            if b.returncode is None:
                b.kill()
                await b.wait()

    cleanup.later(stop_burners)
    for cid, text in LONG.items():
        st.llama.text(cid, text)
    timeouts = completed = 0

    async def over() -> bool:
        nonlocal timeouts, completed
        timeouts = await st.dock.stat("keepalive_timeouts")
        completed = int((await eng.stats())["utterances_completed"])
        return timeouts > 0 or completed == len(LONG)

    await poll(over, START_TIMEOUT, "three utterances or a keepalive timeout")
    await stop_burners()
    assert timeouts == 0, f"the dock dropped the busy engine {timeouts} times"
    assert completed == len(LONG)
