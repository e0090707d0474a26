"""Per-call behaviour over a real dock socket (in-process engine, fake dock peer)."""

from __future__ import annotations

import asyncio
import itertools
import time

import numpy as np
import pytest
from runtime_helpers import (
    DockSession,
    FakeDock,
    ToneSynth,
    audio_samples,
    cmd,
    events_of,
    running_engine,
)

from engines.runtime.calltable import (
    TRANSITIONS,
    CallInput,
    CallPhase,
    CallStateError,
    transition,
)
from protocol import CallEnd, Packet, Pong, SpeechActive, SpeechIdle


def test_transition_table_is_total_for_live_phases() -> None:
    for phase in (CallPhase.IDLE, CallPhase.SPEAKING, CallPhase.INTERRUPTED):
        assert set(TRANSITIONS[phase]) == set(CallInput)
        assert transition(phase, CallInput.CALL_END) is CallPhase.ENDED
        assert transition(phase, CallInput.SPEECH_ACTIVE) is CallPhase.INTERRUPTED
        assert transition(phase, CallInput.TEXT) is CallPhase.SPEAKING
    assert transition(CallPhase.INTERRUPTED, CallInput.SPEECH_IDLE) is CallPhase.IDLE
    with pytest.raises(CallStateError):
        transition(CallPhase.ENDED, CallInput.TEXT)


async def settle(s: DockSession) -> None:
    """Barrier instead of a sleep: every frame the engine wrote before it handled these
    PINGs has arrived once their PONGs have (one socket, in order). Two round trips, so
    that audio already handed to the loop by a synthesis thread is written too."""
    await s.ping_rtt()
    await s.ping_rtt()


async def test_text_becomes_framed_audio(dock: FakeDock) -> None:
    synth = ToneSynth(phrase_ms=300)
    async with running_engine(synth, dock.port) as eng:
        s = await dock.session()
        s.text(7, "hello big world")
        await s.wait_audio(7, 6)
        await wait_for(lambda: eng.stats.utterances_completed == 1)  # all packets written
        await settle(s)
        pkts = s.audio(7)
        sizes = [audio_samples(r).size for r in pkts]
        assert sizes == [4800, 2400] * 3  # 300 ms phrases split at 4800 samples
        first = audio_samples(pkts[0])
        assert first[0] == 0.0 and abs(first[1] - 0.9 * np.sin(2 * np.pi * 450 / 24000) / 48) < 1e-6
        allpcm = np.concatenate([audio_samples(r) for r in pkts])
        assert float(np.max(np.abs(allpcm))) == pytest.approx(0.9, abs=1e-4)
        stamps = [int.from_bytes(r.event.payload[4:12], "big") for r in pkts]
        assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)


async def test_fifo_order_within_a_call_and_prosody_carried(dock: FakeDock) -> None:
    synth = ToneSynth(phrase_ms=50, delay=0.01)
    async with running_engine(synth, dock.port) as eng:
        s = await dock.session()
        for text in ("one", "two two", "three three three"):
            s.text(5, text)
        await s.wait_audio(5, 6)
        await wait_for(lambda: eng.stats.utterances_completed == 3)
        await settle(s)
        assert [c.text for c in synth.calls] == ["one", "two two", "three three three"]
        assert [c.prosody_before for c in synth.calls] == [0, 1, 3]
        # audio arrives in utterance order: tone frequency follows word length
        freqs = [dominant_hz(audio_samples(r)) for r in s.audio(5)]
        assert freqs == sorted(freqs)


def dominant_hz(x: np.ndarray) -> float:
    spec = np.abs(np.fft.rfft(x * np.hanning(x.size)))
    return float(np.argmax(spec) * 24000 / x.size)


async def test_bargein_no_audio_after_speech_active(dock: FakeDock) -> None:
    synth = ToneSynth(phrase_ms=200, delay=0.03)
    async with running_engine(synth, dock.port) as eng:
        s = await dock.session()
        s.text(9, " ".join(["word"] * 40))  # ~1.2 s of synthesis, 8 s of audio
        s.text(9, "queued text never spoken")
        s.text(4, " ".join(["other"] * 10))  # an unrelated call keeps talking
        await s.wait_audio(9, 3)
        t_barge = time.monotonic()
        s.send(SpeechActive(9))
        s.send(Packet(4, b"more for four"))
        # PING barrier: the engine answered a PING sent after SPEECH_ACTIVE, so it has
        # processed the barge-in by the time this PONG arrived
        await s.ping_rtt()
        pong_at = events_of(s, Pong)[-1].t
        assert pong_at > t_barge
        # nothing more can come once the cancelled synthesis has ended and the
        # queued text is gone; then a PING barrier flushes what was written before
        await wait_for(lambda: eng.stats.bargein_stop.count == 1)
        w = eng.calls.calls[9]
        assert w.current is None and not w.queue
        await settle(s)
        after = [r for r in s.audio(9) if r.t >= pong_at]
        assert after == []
        await s.wait_audio(4, 11)  # the other call talks on to the end ...
        assert len(s.audio(4)) > 10  # the other call was not affected
        assert [c.text for c in synth.calls if c.call_id == 9] == [" ".join(["word"] * 40)]
        stats = await cmd(eng.cmd_port, "STATS")
        assert ":bargeins=1:" in stats and "bargein_mute_n=1" in stats
        await wait_for(lambda: "bargein_stop_n=1" in eng_stats_sync(eng))


def eng_stats_sync(eng: object) -> str:
    st = eng.stats  # type: ignore[attr-defined]
    return f"bargein_stop_n={st.bargein_stop.count}"


async def wait_for(cond, within: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(within):
        while not cond():  # noqa: ASYNC110
            await asyncio.sleep(0.01)


async def test_speech_idle_then_new_text_is_spoken(dock: FakeDock) -> None:
    synth = ToneSynth(phrase_ms=100, delay=0.02)
    async with running_engine(synth, dock.port) as eng:
        s = await dock.session()
        s.text(3, " ".join(["a"] * 30))
        await s.wait_audio(3, 1)
        s.send(SpeechActive(3))
        await s.ping_rtt()
        assert eng.calls.calls[3].phase.value == "interrupted"
        n = len(s.audio(3))
        s.send(SpeechIdle(3))
        s.text(3, "fresh answer")
        await s.wait_audio(3, n + 2)
        assert synth.calls[-1].text == "fresh answer"
        await wait_for(lambda: eng.calls.calls[3].phase.value == "idle")


async def test_speech_idle_prewarms_call(dock: FakeDock) -> None:
    async with running_engine(ToneSynth(), dock.port) as eng:
        s = await dock.session()
        s.send(SpeechIdle(21))
        await s.ping_rtt()
        assert 21 in eng.calls.calls and eng.calls.calls[21].task is not None
        assert (await cmd(eng.cmd_port, "STATUS")).startswith("ACTIVE_CALLS:1:DOCK:connected")


async def test_call_end_cancels_and_drops_state(dock: FakeDock) -> None:
    synth = ToneSynth(phrase_ms=200, delay=0.03)
    async with running_engine(synth, dock.port) as eng:
        s = await dock.session()
        s.text(11, " ".join(["x"] * 50))
        s.text(11, "never")
        await s.wait_audio(11, 2)
        s.send(CallEnd(11))
        await s.ping_rtt()
        pong_at = events_of(s, Pong)[-1].t
        assert 11 not in eng.calls.calls
        assert (await cmd(eng.cmd_port, "STATUS")).startswith("ACTIVE_CALLS:0:")
        await wait_for(lambda: synth.finished == 1)  # the cancelled synthesis ended
        await settle(s)  # what it handed to the loop is written (or dropped) by now
        assert [r for r in s.audio(11) if r.t >= pong_at] == []
        assert all(c.text != "never" for c in synth.calls)
        # SPEECH_IDLE for an ended call does not resurrect it
        s.send(SpeechIdle(11))
        await s.ping_rtt()
        assert 11 not in eng.calls.calls
        # but new text reopens it (call ids can be reused)
        s.text(11, "again")
        await s.wait_audio(11, len(s.audio(11)) + 1)


async def test_concurrent_calls_interleave(dock: FakeDock) -> None:
    synth = ToneSynth(phrase_ms=100, delay=0.03)
    async with running_engine(synth, dock.port, max_concurrent=4):
        s = await dock.session()
        s.text(1, " ".join(["a"] * 8))
        s.text(2, " ".join(["bb"] * 8))
        await s.wait_audio(1, 8)
        await s.wait_audio(2, 8)
        order = [r.event.call_id for r in s.audio()]
        switches = sum(1 for a, b in itertools.pairwise(order) if a != b)
        assert switches >= 4, order
        assert synth.max_active == 2


@pytest.mark.parametrize("limit", [1, 2])
async def test_max_concurrent_limits_syntheses(dock: FakeDock, limit: int) -> None:
    synth = ToneSynth(phrase_ms=40, delay=0.02)
    async with running_engine(synth, dock.port, max_concurrent=limit) as eng:
        s = await dock.session()
        for call in (1, 2, 3):
            s.text(call, "w w w w w")
        await wait_for(lambda: eng.calls.waiting == 3 - limit)
        stats = await cmd(eng.cmd_port, "STATS")
        assert f"syntheses_waiting={3 - limit}" in stats
        assert f"syntheses_running={limit}" in stats
        for call in (1, 2, 3):
            await s.wait_audio(call, 5)
        assert synth.max_active == limit


async def test_synthesis_exception_is_isolated(dock: FakeDock) -> None:
    synth = ToneSynth(phrase_ms=50, delay=0.01)
    async with running_engine(synth, dock.port) as eng:
        s = await dock.session()
        s.text(1, "fine !crash never")
        s.text(2, "other call talks on")
        s.text(1, "!fail")
        s.text(1, "after the crash")
        await s.wait_audio(2, 4)
        await wait_for(lambda: eng.stats.utterances_failed == 2)
        await s.wait_audio(1, 1 + 3)
        assert len(dock.sessions) == 1 and not s.closed.is_set()
        # an utterance counts as completed after its last packet left: the count may
        # trail the audio the fake dock already holds
        await wait_for(lambda: eng.stats.utterances_completed >= 2)
        assert await s.ping_rtt() >= 0


async def test_pong_latency_unaffected_by_long_synthesis(dock: FakeDock) -> None:
    phrase_compute = 0.25
    synth = ToneSynth(phrase_ms=100, delay=phrase_compute)
    async with running_engine(synth, dock.port, max_concurrent=2):
        s = await dock.session()
        idle = sorted([await s.ping_rtt() for _ in range(20)])
        s.text(1, " ".join(["w"] * 12))
        s.text(2, " ".join(["w"] * 12))
        await s.wait_audio(1, 1)
        busy = []
        for _ in range(20):
            busy.append(await s.ping_rtt())
            await asyncio.sleep(0.013)
        busy.sort()
        assert synth.active >= 1  # still synthesising while we measured
        # If inference ran on the loop a PONG would wait for the phrase in progress
        # (on average half of it); it must be an order of magnitude below that.
        assert busy[len(busy) // 2] < phrase_compute / 10, (idle, busy)
        assert busy[-1] < phrase_compute / 2, busy


async def test_no_dock_audio_is_not_buffered_forever(dock: FakeDock) -> None:
    synth = ToneSynth(phrase_ms=100, delay=0.05)
    async with running_engine(synth, dock.port) as eng:
        s = await dock.session()
        s.text(6, " ".join(["w"] * 40))
        await s.wait_audio(6, 1)
        await dock.stop()  # the dock dies mid-utterance
        await wait_for(lambda: eng.calls.calls[6].current is None)
        assert eng.stats.utterances_cancelled + eng.stats.utterances_completed >= 1
        assert synth.phrases < 40


async def test_shutdown_cancels_and_releases_the_model(dock: FakeDock) -> None:
    synth = ToneSynth(phrase_ms=100, delay=0.05)
    async with running_engine(synth, dock.port) as eng:
        s = await dock.session()
        s.text(1, " ".join(["w"] * 50))
        await s.wait_audio(1)
        eng.request_stop("test")
        await eng.shutdown()
        assert synth.closed and synth.active == 0 and synth.phrases < 50


async def test_model_not_closed_under_a_stuck_synthesis(dock: FakeDock) -> None:
    synth = ToneSynth(phrase_ms=100)
    async with running_engine(synth, dock.port) as eng:
        s = await dock.session()
        s.text(1, "!hang")
        await wait_for(lambda: synth.active == 1)
        eng.request_stop("test")
        await eng.shutdown()
        assert not synth.closed  # closing under a running inference could crash


def test_cancel_token_callbacks_run_once_and_can_be_forgotten() -> None:
    from engines.runtime.synth import CancelToken

    token = CancelToken()
    fired: list[str] = []
    token.on_cancel(lambda: fired.append("a"))
    forget_b = token.on_cancel(lambda: fired.append("b"))
    token.on_cancel(lambda: 1 / 0)  # a failing callback never breaks the canceller
    forget_b()
    token.cancel()
    token.cancel()
    assert fired == ["a"] and token.cancelled
    token.on_cancel(lambda: fired.append("late"))  # already fired: runs at once
    assert fired == ["a", "late"]
