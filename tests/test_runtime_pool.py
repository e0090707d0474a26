"""The inference scheduler over a real dock socket: a pool of workers, one deadline queue,
self-scheduled synthesisers on their own threads, and the delivery metrics."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import structlog
from protocol_servers_helpers import parse_metrics, sample
from runtime_helpers import RATE, DockSession, FakeDock, ToneSynth, audio_samples, cmd, tone

from engines.runtime.cli import common_parser
from engines.runtime.schedule import MAX_AHEAD_S, SYNTH_WORKERS
from engines.runtime.synth import CallState, CancelToken, FloatArray, unit_grant
from protocol import CallEnd, SpeechActive


async def wait_for(cond, within: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(within):
        while not cond():  # noqa: ASYNC110
            await asyncio.sleep(0.005)


def audio_s(s: DockSession, call_id: int) -> float:
    return sum(audio_samples(r).size for r in s.audio(call_id)) / RATE


class StepSynth(ToneSynth):
    """One tone per ``next()``; records which threads ran steps and how many at once."""

    def __init__(self, phrase_ms: int = 100, delay: float = 0.02) -> None:
        super().__init__(phrase_ms=phrase_ms, delay=delay)
        self.in_step = 0
        self.max_in_step = 0
        self.step_threads: set[str] = set()
        self.aheads: list[float | None] = []
        self.gated = threading.Event()  # a "!gate" step is holding its worker
        self.gate_open = threading.Event()

    def synthesize(self, text: str, state: CallState, cancel: CancelToken) -> Iterator[FloatArray]:
        try:
            yield from self._steps(text, state, cancel)
        finally:
            with self._lock:
                self.finished += 1

    def _steps(self, text: str, state: CallState, cancel: CancelToken) -> Iterator[FloatArray]:
        for word in text.split():
            with self._lock:
                self.in_step += 1
                self.max_in_step = max(self.max_in_step, self.in_step)
                self.step_threads.add(threading.current_thread().name)
                pb = state.playback
                self.aheads.append(None if pb is None else pb.ahead_s())
            try:
                cancel.raise_if_cancelled()
                if word == "!gate":
                    self.gated.set()
                    self.gate_open.wait(10)
                self._work(self.delay)
            finally:
                with self._lock:
                    self.in_step -= 1
                    self.phrases += 1
            yield tone(len(word), self.phrase_ms)


@pytest.mark.parametrize("workers", [1, 2])
async def test_pool_bounds_units_running_at_once(dock: FakeDock, workers: int) -> None:
    synth = StepSynth(phrase_ms=50, delay=0.03)
    async with running(synth, dock, synth_workers=workers) as eng:
        s = await dock.session()
        for call in (1, 2, 3, 4):
            s.text(call, "w " * 12)
        await wait_for(lambda: eng.stats.utterances_completed == 4)
        # one generator is never advanced from two threads ("generator already
        # executing" would fail the utterance)
        assert eng.stats.utterances_failed == 0
        assert synth.max_in_step == workers
        assert synth.step_threads <= {f"synth-worker-{i}" for i in range(workers)}
        assert eng.calls.pool is not None and eng.calls.pool.live_threads() == workers
        stats = await cmd(eng.cmd_port, "STATS")
        assert f":synth_workers={workers}:" in stats and ":sched_queued=0:" in stats
        assert "sched_wait_n=" in stats


async def test_new_utterance_goes_ahead_of_later_units_of_calls_with_audio_queued(
    dock: FakeDock,
) -> None:
    synth = StepSynth(phrase_ms=500, delay=0.03)
    busy = (1, 2, 3, 4, 5)
    async with running(synth, dock, synth_workers=1, max_concurrent=8) as eng:
        eng.calls.max_ahead_s = 1000.0  # never parked: only the deadlines order the work
        s = await dock.session()
        for call in busy:
            s.text(call, "w " * 200)
        await wait_for(lambda: all(audio_s(s, c) >= 3.0 for c in busy))
        t_sent = time.monotonic()
        s.text(9, "hello there")
        await s.wait_audio(9)
        first = s.audio(9)[0].t
        between = [r for r in s.audio() if r.event.call_id != 9 and t_sent <= r.t <= first]
        # only the unit in progress (a 500 ms tone = 3 packets) and one already in flight
        # may come first; a round robin over the five busy calls would put 15 packets first
        assert len(between) <= 6, len(between)
        assert eng.stats.underruns == 0


class RecallSynth(StepSynth):
    """A "!hold" step holds its worker until the pool recalls the unit (or ``hold_s``);
    recalled, it ends the unit with no audio and is done again in the next unit, as
    Kokoro's windows are (``UnitGrant.recall``). ``order``: the steps' ends in order."""

    def __init__(self, phrase_ms: int, delay: float, hold_s: float = 10.0) -> None:
        super().__init__(phrase_ms=phrase_ms, delay=delay)
        self.hold_s = hold_s
        self.recalled = 0
        self.order: list[str] = []

    def _steps(self, text: str, state: CallState, cancel: CancelToken) -> Iterator[FloatArray]:
        for word in text.split():
            if word == "!hold":
                recalled = threading.Event()
                recall = unit_grant().recall
                if recall is not None:
                    recall.on_cancel(recalled.set)
                self.gated.set()
                if recalled.wait(self.hold_s):
                    self.recalled += 1
                    self.order.append(f"{state.call_id}:recalled")
                    yield np.zeros(0, np.float32)  # the unit ends; the word comes next
            self._work(self.delay)
            self.order.append(f"{state.call_id}:{word}")
            yield tone(len(word), self.phrase_ms)


async def test_a_new_call_start_recalls_a_unit_of_a_call_with_audio_to_spare(
    dock: FakeDock,
) -> None:
    """One worker, busy with a long unit of a call whose listener has seconds of audio
    queued: a new call's first unit does not wait for it (pool Rule 4). The unit is
    recalled, the new call's first unit runs, then the recalled work again, and the
    first call's listener never runs dry."""
    # each step takes 1 s (a unit is not expected to end at once, and a start that
    # comes up to 0.5 s into one may recall it) and makes 4 s of audio
    synth = RecallSynth(phrase_ms=4000, delay=1.0)
    async with running(synth, dock, synth_workers=1) as eng:
        eng.calls.max_ahead_s = 1000.0  # never parked: the queue grows 3 s a step
        s = await dock.session()
        s.text(1, "w w w !hold w")
        await asyncio.to_thread(synth.gated.wait, 10)
        s.text(9, "hello")
        await wait_for(lambda: eng.stats.utterances_completed == 2, within=30)
        assert synth.recalled == 1, synth.order
        assert synth.order.index("9:hello") < synth.order.index("1:!hold"), synth.order
        assert synth.order.index("1:recalled") < synth.order.index("9:hello"), synth.order
        await wait_for(lambda: audio_s(s, 1) >= 20.0 - 0.01)  # nothing of call 1 lost
        assert audio_s(s, 1) == pytest.approx(20.0, abs=0.01)
        assert eng.stats.underruns == 0 and eng.stats.utterances_failed == 0
        assert ":sched_recalled=1:" in await cmd(eng.cmd_port, "STATS")
        prom = parse_metrics(await cmd(eng.cmd_port, "METRICS"))
        assert sample(prom, "ttsdock_engine_sched_recalled_total") == 1


async def test_a_start_does_not_recall_a_unit_whose_listener_would_run_dry(
    dock: FakeDock,
) -> None:
    """The unit holding the worker belongs to a call with little audio queued (words of
    100 ms that take 1 s each): recalling it would cut a gap into that call, so the new
    call waits."""
    synth = RecallSynth(phrase_ms=100, delay=1.0, hold_s=1.0)
    async with running(synth, dock, synth_workers=1) as eng:
        s = await dock.session()
        s.text(1, "w w !hold w")
        await asyncio.to_thread(synth.gated.wait, 10)
        s.text(9, "hello")
        await wait_for(lambda: eng.stats.utterances_completed == 2, within=30)
        assert synth.order.index("1:!hold") < synth.order.index("9:hello"), synth.order
        assert synth.recalled == 0
        assert eng.calls.pool is not None and eng.calls.pool.recalled == 0


async def test_parked_utterance_stays_a_bounded_time_ahead(dock: FakeDock) -> None:
    synth = StepSynth(phrase_ms=500, delay=0.005)
    async with running(synth, dock, synth_workers=1) as eng:
        s = await dock.session()
        s.text(1, "w " * 100)  # 50 s of audio that a fast synthesiser could make at once
        await s.wait_audio(1)
        t0 = s.audio(1)[0].t
        # it runs ahead up to the cap (however long a slow machine takes to get there)
        await wait_for(lambda: audio_s(s, 1) >= MAX_AHEAD_S)
        await asyncio.sleep(1.0)  # time to run further ahead, if it would
        await s.ping_rtt()
        elapsed = time.monotonic() - t0
        made = audio_s(s, 1)
        # never more than the cap plus one unit ahead of real-time playback
        assert made <= elapsed + MAX_AHEAD_S + 0.5 + 0.1, (made, elapsed)
        pool = eng.calls.pool
        assert pool is not None
        await wait_for(lambda: pool.snapshot()[:2] == (1, 1))  # queued, and parked
        stats = await cmd(eng.cmd_port, "STATS")
        assert ":sched_parked=" in stats
        ahead = float(stats.split("ahead_ms=")[1].split(":")[0])
        assert 0 < ahead <= (MAX_AHEAD_S + 0.6) * 1000
        # the synthesiser saw its playback clock ahead of the listener
        seen = [a for a in synth.aheads[1:] if a is not None]
        assert seen and max(seen) > 1.0


@pytest.mark.parametrize("event", ["speech_active", "call_end"])
async def test_bargein_and_call_end_remove_queued_work(dock: FakeDock, event: str) -> None:
    synth = StepSynth(phrase_ms=500, delay=0.005)
    async with running(synth, dock, synth_workers=1) as eng:
        s = await dock.session()
        s.text(1, "w " * 100)
        await wait_for(lambda: audio_s(s, 1) >= MAX_AHEAD_S)  # parked at the cap
        phrases = synth.phrases
        s.send(SpeechActive(1) if event == "speech_active" else CallEnd(1))
        await wait_for(lambda: synth.finished == 1)  # the pool closed the generator
        assert synth.phrases <= phrases + 1  # no more units were computed for it
        queued, parked, _busy, open_jobs = eng.calls.pool.snapshot()
        assert (queued, parked, open_jobs) == (0, 0, 0)


async def test_bargein_ends_the_utterance_at_once_even_while_the_pool_is_busy(
    dock: FakeDock,
) -> None:
    synth = StepSynth(phrase_ms=500, delay=0.0)
    async with running(synth, dock, synth_workers=1) as eng:
        s = await dock.session()
        s.text(1, "w " * 20)
        await s.wait_audio(1)
        s.text(2, "!gate w")  # holds the only worker until the test opens the gate
        await asyncio.to_thread(synth.gated.wait, 10)
        s.send(SpeechActive(1))
        s.text(1, "fresh answer")
        # the cancelled utterance ends on the loop at once, so the call's next text is
        # queued in the scheduler although no worker is free (the old generator is closed
        # first thing once one is, ahead of every unit)
        w = eng.calls.calls[1]
        await wait_for(lambda: w.current is not None and w.current.text == "fresh answer")
        synth.gate_open.set()
        await s.wait_audio(1, len(s.audio(1)) + 2)
        await wait_for(lambda: synth.finished == 3)
        assert eng.stats.utterances_cancelled == 1


class BarrierSynth(ToneSynth):
    """Each utterance blocks until three utterances are inside ``next()`` at once: only
    possible with a thread per utterance (a pool of 1 would never get there)."""

    self_scheduled = True

    def __init__(self) -> None:
        super().__init__()
        self.barrier = threading.Barrier(3, timeout=10)
        self.threads: set[str] = set()

    def synthesize(self, text: str, state: CallState, cancel: CancelToken) -> Iterator[FloatArray]:
        self.threads.add(threading.current_thread().name)
        assert state.playback is not None
        self.barrier.wait()
        yield tone(3, 100)


async def test_self_scheduled_synthesizer_keeps_a_thread_per_utterance(dock: FakeDock) -> None:
    synth = BarrierSynth()
    async with running(synth, dock, synth_workers=1) as eng:
        assert eng.calls.pool is None
        s = await dock.session()
        for call in (1, 2, 3):
            s.text(call, "hello")
        await wait_for(lambda: eng.stats.utterances_completed == 3)
        assert eng.stats.utterances_failed == 0
        assert synth.threads == {"synth-1", "synth-2", "synth-3"}
        stats = await cmd(eng.cmd_port, "STATS")
        assert ":synth_workers=self_scheduled:" in stats
        assert all(len(s.audio(c)) == 1 for c in (1, 2, 3))


async def test_underruns_are_counted_and_logged(dock: FakeDock) -> None:
    slow = StepSynth(phrase_ms=100, delay=0.25)  # 0.25 s of compute per 0.1 s of audio
    with structlog.testing.capture_logs() as logs:
        async with running(slow, dock, synth_workers=1) as eng:
            s = await dock.session()
            s.text(5, "a b c d")
            await wait_for(lambda: eng.stats.utterances_completed == 1)
            stats = await cmd(eng.cmd_port, "STATS")
            metrics = await cmd(eng.cmd_port, "METRICS")
    assert eng.stats.underruns == 3  # every phrase after the first came late
    assert 3 * 0.1 <= eng.stats.underrun_ms / 1000 <= 3 * 0.25 + 1.0
    assert ":underruns=3:" in stats
    assert "call.5=idle" in stats and ",underruns=3," in stats and ",ttfa_ms=" in stats
    prom = dict(line.rsplit(" ", 1) for line in metrics.splitlines() if line and line[0] != "#")
    assert prom["ttsdock_engine_underruns_total"] == "3"
    assert float(prom["ttsdock_engine_underrun_seconds_total"]) >= 0.3
    assert prom["ttsdock_engine_ttfa_seconds_count"] == "1"
    assert prom["ttsdock_engine_synth_workers"] == "1"
    assert "ttsdock_engine_sched_wait_seconds_sum" in prom
    assert 'ttsdock_engine_call_ahead_seconds{call_id="5"}' in prom
    done = [e for e in logs if e["event"] == "utterance_completed"]
    assert len(done) == 1 and done[0]["log_level"] == "info"
    d = done[0]
    assert d["underruns"] == 3 and d["units"] == 4 and d["audio_s"] == pytest.approx(0.4)
    assert d["ttfa_ms"] > 0 and d["compute_ms"] >= 4 * 250 * 0.9


async def test_no_underrun_when_synthesis_keeps_ahead(dock: FakeDock) -> None:
    fast = StepSynth(phrase_ms=300, delay=0.01)
    with structlog.testing.capture_logs() as logs:
        async with running(fast, dock, synth_workers=1) as eng:
            s = await dock.session()
            s.text(6, "a b c d e f")
            s.text(6, "g h")  # the second sentence follows the first one's audio
            await wait_for(lambda: eng.stats.utterances_completed == 2)
    assert eng.stats.underruns == 0
    done = [e for e in logs if e["event"] == "utterance_completed"]
    assert [d["underruns"] for d in done] == [0, 0]
    assert done[0]["ahead_max_ms"] > 300


def test_synth_workers_flag_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert common_parser("tone").parse_args([]).synth_workers == SYNTH_WORKERS  # one per core
    assert common_parser("tone").parse_args(["--synth-workers", "2"]).synth_workers == 2
    monkeypatch.setenv("TTSDOCK_SYNTH_WORKERS", "3")
    assert common_parser("tone").parse_args([]).synth_workers == 3
    with pytest.raises(SystemExit) as exc:
        common_parser("tone").parse_args(["--synth-workers", "0"])
    assert exc.value.code == 2


def running(synth: ToneSynth, dock: FakeDock, **config: Any) -> Any:
    from runtime_helpers import running_engine

    return running_engine(synth, dock.port, **config)
