"""The call table driven directly: no sockets, no tasks, no threads, no clock."""

from __future__ import annotations

import structlog
import structlog.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from engines.runtime.calltable import (
    ENDED_MEMORY,
    MAX_PENDING_VOICES,
    MAX_QUEUED_TEXTS,
    Call,
    CallPhase,
    CallTable,
    EngineSettings,
    StartWorker,
    Utterance,
    UtteranceEnd,
    WakeWorker,
)
from engines.runtime.schedule import StepEstimate
from engines.runtime.stats import RuntimeStats
from engines.runtime.synth import SAMPLE_RATE, CallState

SINK = object()  # the table only carries a call's sink


def table(*, idle_s: float = 10.0, max_calls: int = 8) -> CallTable:
    return CallTable(
        RuntimeStats(),
        EngineSettings(),
        cpus=2,
        idle_s=idle_s,
        max_calls=max_calls,
        max_ahead_s=2.0,
        playback_clock=lambda: 0.0,
    )


def started(actions: list[StartWorker | WakeWorker]) -> list[int]:
    return [a.call.call_id for a in actions if isinstance(a, StartWorker)]


def woken(actions: list[StartWorker | WakeWorker]) -> list[int]:
    return [a.call.call_id for a in actions if isinstance(a, WakeWorker)]


def next_of(t: CallTable, call: Call, now: float = 0.0) -> Utterance:
    """The call's next utterance (there must be one)."""
    utt = t.next_utterance(call, now)
    assert utt is not None
    return utt


def one_utterance(t_rx_ns: int = 0) -> tuple[CallTable, Call, Utterance]:
    """A table whose call 1 got text ``a`` at ``t_rx_ns``, and that call's utterance."""
    t = table()
    t.text(1, b"a", t_rx_ns, now=0.0)
    call = t.calls[1]
    return t, call, next_of(t, call)


def speak_one(t: CallTable, call: Call, now: float = 0.0) -> None:
    """Run the call's next utterance to its end, as the shell would (one packet)."""
    utt = next_of(t, call, now)
    assert t.admitted(call, utt, utt.t_rx_ns)
    meter = t.begin(call, utt)
    if t.gate(call, utt):
        t.sent(call, utt, 2400, utt.t_rx_ns + 1_000_000, True)
    t.end(call, meter)
    t.finished(call, utt, UtteranceEnd(2400, False), utt.t_rx_ns + 2_000_000)
    t.utterance_done(call)


# -- lifecycle ---------------------------------------------------------------------------


def test_text_opens_a_call_and_wakes_its_worker() -> None:
    t = table()
    actions = t.text(5, b" hello ", 1_000, now=1.0)
    assert started(actions) == [5] and woken(actions) == [5]
    call = t.calls[5]
    assert call.phase is CallPhase.SPEAKING and list(call.queue) == [("hello", 1_000)]
    assert t.stats.calls_started == 1 and t.stats.texts_received == 1


def test_empty_text_is_ignored_and_opens_nothing() -> None:
    t = table()
    assert t.text(5, b"   ", 0, now=0.0) == []
    assert not t.calls and t.stats.texts_received == 1 and t.stats.texts_dropped == 0


def test_queue_bound_drops_and_counts() -> None:
    t = table()
    for i in range(MAX_QUEUED_TEXTS):
        t.text(1, b"x", i, now=0.0)
    assert t.text(1, b"one too many", 0, now=0.0) == []
    assert len(t.calls[1].queue) == MAX_QUEUED_TEXTS and t.stats.texts_dropped == 1


def test_worker_drains_the_queue_in_order_then_goes_idle() -> None:
    t = table()
    t.text(1, b"a", 1, now=0.0)
    t.text(1, b"b", 2, now=0.0)
    call = t.calls[1]
    first = t.next_utterance(call, 0.0)
    assert first is not None and first.text == "a" and call.current is first
    t.utterance_done(call)
    second = t.next_utterance(call, 0.0)
    assert second is not None and second.text == "b"
    t.utterance_done(call)
    assert t.next_utterance(call, 0.0) is None
    assert call.phase is CallPhase.IDLE and call.idle


def test_bargein_cuts_queue_and_utterance_and_the_gate_drops() -> None:
    t = table()
    t.text(1, b"a", 1, now=0.0)
    t.text(1, b"b", 2, now=0.0)
    call = t.calls[1]
    utt = next_of(t, call)
    assert t.gate(call, utt)
    assert t.speech_active(1, 10, now=0.5, now_ns=3_000_010) == []
    assert utt.token.cancelled and not call.queue and utt.t_bargein_ns == 10
    assert call.phase is CallPhase.INTERRUPTED and call.bargeins == 1
    assert t.stats.bargeins == 1 and t.stats.bargein_mute.values[-1] == 3.0
    assert not t.gate(call, utt) and t.stats.packets_suppressed == 1


def test_bargein_with_nothing_to_cut_is_not_counted() -> None:
    t = table()
    t.speech_idle(1, now=0.0)  # prewarm opens the call
    assert t.speech_active(1, 0, now=0.0, now_ns=0) == []
    assert t.stats.bargeins == 0 and t.calls[1].phase is CallPhase.INTERRUPTED


def test_call_end_ends_a_speaking_call_and_remembers_its_id() -> None:
    t, call, utt = one_utterance(1)
    assert woken(t.call_end(1)) == [1]
    assert call.closed and call.phase is CallPhase.ENDED and utt.token.cancelled
    assert not t.gate(call, utt)
    # late events of an ended call open nothing; text reopens it (a fresh state)
    assert t.speech_active(1, 0, now=0.0, now_ns=0) == [] and t.speech_idle(1, 0.0) == []
    assert 1 not in t.calls
    assert started(t.text(1, b"again", 2, now=1.0)) == [1]
    assert t.calls[1] is not call and t.stats.calls_ended == 1


def test_link_lost_cuts_docked_calls_only() -> None:
    class Hooks:
        voice = None
        speed = None

        def utterance_ended(self) -> None:
            pass

    t = table()
    t.open_request(2, SINK, Hooks(), now=0.0)
    t.text(1, b"a", 1, now=0.0)
    t.text(2, b"b", 1, now=0.0)
    assert t.link_lost() == 1
    assert not t.calls[1].queue and list(t.calls[2].queue) == [("b", 1)]


def test_close_ends_every_call_and_refuses_new_text() -> None:
    t = table()
    t.text(1, b"a", 1, now=0.0)
    t.speech_idle(2, now=0.0)
    calls = list(t.calls.values())
    assert sorted(woken(t.close())) == [1, 2]
    assert all(c.closed for c in calls) and not t.calls
    assert t.text(3, b"late", 0, now=0.0) == [] and t.stats.texts_dropped == 1


# -- eviction ----------------------------------------------------------------------------


def test_idle_sweep_evicts_only_idle_calls_past_the_limit() -> None:
    t = table(idle_s=10.0)
    t.speech_idle(1, now=0.0)
    t.text(2, b"busy", 0, now=0.0)  # speaking: never evicted
    t.speech_idle(3, now=5.0)
    assert t.sweep(now=9.0) == []
    assert woken(t.sweep(now=10.0)) == [1]
    assert list(t.calls) == [2, 3] and t.calls_evicted == {"idle": 1, "cap": 0}


def test_opening_over_the_cap_evicts_the_least_recently_active_idle_call() -> None:
    t = table(max_calls=3)
    for cid in (1, 2, 3):
        t.speech_idle(cid, now=float(cid))
    t.speech_idle(1, now=4.0)  # 1 is now the most recent
    actions = t.speech_idle(4, now=5.0)
    assert woken(actions) == [2] and started(actions) == [4]
    assert list(t.calls) == [3, 1, 4] and t.calls_evicted == {"idle": 0, "cap": 1}


def test_ended_memory_is_bounded() -> None:
    t = table()
    for cid in range(ENDED_MEMORY + 10):
        t.call_end(cid)
    assert 0 not in t.ended and ENDED_MEMORY + 9 in t.ended


# -- accounting --------------------------------------------------------------------------


def test_sent_packets_give_ttfa_and_underruns() -> None:
    t, call, utt = one_utterance(1_000_000_000)
    t.begin(call, utt)
    assert call.state.playback is utt.meter
    samples = SAMPLE_RATE // 10  # 100 ms
    t.sent(call, utt, samples, 1_250_000_000, True)  # 250 ms after the text
    assert utt.ttfa_ms == 250.0 and call.last_ttfa_ms == 250.0
    t.sent(call, utt, samples, 1_550_000_000, True)  # the listener ran dry at 1.35 s
    assert call.underruns == 1 and t.stats.underruns == 1
    assert abs(call.underrun_ms - 200.0) < 1e-6
    assert t.stats.packets_sent == 2 and t.stats.samples_sent == 2 * samples


def test_unsent_packet_abandons_the_utterance() -> None:
    t, call, utt = one_utterance(0)
    t.unsent(call, utt)
    assert utt.token.cancelled and t.stats.packets_unsent == 1


def test_units_feed_the_estimates_and_the_load() -> None:
    t, call, utt = one_utterance(0)
    t.begin(call, utt)
    est = StepEstimate()
    pcm = [b"\0" * 4 * 2400]
    with structlog.testing.capture_logs() as logs:
        t.unit(call, utt, est, compute_s=0.2, cores=1, wait_s=0.01, packets=pcm, now=1.0)
        assert t.first_unit.n == 1 and est.n == 0 and utt.steps == 1
        t.unit(call, utt, est, compute_s=0.1, cores=1, wait_s=0.0, packets=pcm, now=1.2)
    # the first unit's line splits the first audio's time: its wait, then its own
    (first,) = [e for e in logs if e["event"] == "first_unit"]
    assert first["wait_ms"] == 10.0 and first["compute_ms"] == 200.0
    assert t.later_unit.n == 1 and est.n == 1 and t.next_unit_s(est, 9.0) == est.value
    t.unit(call, utt, est, compute_s=0.0, cores=1, wait_s=0.0, packets=[], now=1.3)  # a close
    assert utt.steps == 2 and t.stats.sched_wait.count == 2
    assert t.load_snapshot(1.3, None).demand > 0


def test_next_unit_estimate_falls_back_to_the_engine_then_the_last_unit() -> None:
    t = table()
    assert t.next_unit_s(StepEstimate(), 0.3) == 0.3
    t.later_unit.add(0.2)
    assert t.next_unit_s(StepEstimate(), 0.3) == t.later_unit.value


def test_finished_counts_each_outcome_once() -> None:
    t = table()
    t.text(1, b"a", 0, now=0.0)
    t.text(1, b"b", 0, now=0.0)
    t.text(1, b"c", 0, now=0.0)
    call = t.calls[1]
    speak_one(t, call)
    utt = next_of(t, call)
    t.finished(call, utt, UtteranceEnd(0, True, RuntimeError("boom")), 0)
    t.utterance_done(call)
    utt = next_of(t, call)
    utt.token.cancel()
    t.finished(call, utt, UtteranceEnd(0, False), 0)
    s = t.stats
    assert (s.utterances_completed, s.utterances_failed, s.utterances_cancelled) == (1, 1, 1)
    assert s.utterances_truncated == 1


def test_cut_while_waiting_is_not_admitted() -> None:
    t, call, utt = one_utterance(0)
    t.speech_active(1, 0, now=0.0, now_ns=0)
    assert not t.admitted(call, utt, 0) and t.stats.utterances_cancelled == 1


# -- per-call voice ----------------------------------------------------------------------


def test_call_voice_wins_over_the_engine_voice_and_ends_with_the_call() -> None:
    t = table()
    t.settings.voice = "engine"
    t.text(1, b"a", 0, now=0.0)
    call = t.calls[1]
    call.state.set_voice("mine")
    utt = next_of(t, call)
    t.begin(call, utt)
    assert call.state.voice == "mine"
    t.call_end(1)
    t.text(1, b"b", 0, now=0.0)
    fresh = t.calls[1]
    utt = t.next_utterance(fresh, 0.0)
    assert utt is not None
    t.begin(fresh, utt)
    assert fresh.state.voice == "engine" and fresh.state.call_voice is None


def test_set_call_voice_on_an_open_call_goes_to_its_state() -> None:
    t = table()
    t.settings.voice = "engine"
    t.text(1, b"a", 0, now=0.0)
    call = t.calls[1]
    t.set_call_voice(1, "mine", now=0.0)
    assert call.state.call_voice == "mine" and not t.pending_voices
    speak_one(t, call)
    assert call.state.voice == "mine"
    t.set_call_voice(1, None, now=0.0)  # back to the engine's voice
    t.text(1, b"b", 0, now=0.0)
    speak_one(t, call)
    assert call.state.voice == "engine" and call.state.call_voice is None


def test_a_voice_set_before_the_call_opens_waits_for_it() -> None:
    t = table(idle_s=10.0)
    t.settings.voice = "engine"
    t.set_call_voice(1, "early", now=0.0)
    t.set_call_voice(2, "gone", now=0.0)
    t.set_call_voice(2, None, now=0.0)  # cleared before the call opened
    assert list(t.pending_voices) == [1]
    t.speech_idle(1, now=1.0)  # the call opens (prewarm): the voice is its own now
    assert t.calls[1].state.call_voice == "early" and not t.pending_voices
    t.text(1, b"a", 0, now=1.0)
    speak_one(t, t.calls[1])
    assert t.calls[1].state.voice == "early"
    t.text(2, b"b", 0, now=1.0)
    speak_one(t, t.calls[2])
    assert t.calls[2].state.voice == "engine"


def test_a_pending_voice_ends_with_call_end_idle_time_and_the_bound() -> None:
    t = table(idle_s=10.0)
    t.set_call_voice(1, "v", now=0.0)
    t.call_end(1)  # the call ended before it ever opened
    t.text(1, b"a", 0, now=0.0)
    assert t.calls[1].state.call_voice is None
    t.set_call_voice(2, "v", now=0.0)
    t.set_call_voice(3, "v", now=5.0)
    t.sweep(now=10.0)  # set idle_s ago: forgotten, like an idle call
    assert list(t.pending_voices) == [3]
    t.sweep(now=15.0)
    assert not t.pending_voices
    for cid in range(100, 100 + MAX_PENDING_VOICES + 2):
        t.set_call_voice(cid, "v", now=20.0)
    assert len(t.pending_voices) == MAX_PENDING_VOICES
    assert next(iter(t.pending_voices)) == 102  # the oldest two went first


def test_engine_state_is_made_once_per_call() -> None:
    st = CallState(1)
    made: list[int] = []

    def make() -> dict[str, int]:
        made.append(1)
        return {}

    assert st.engine_state("k", make) is st.engine_state("k", make)
    assert made == [1] and CallState(2).engine_state("k", dict) == {}


# -- properties --------------------------------------------------------------------------

EVENTS = st.lists(
    st.tuples(
        st.sampled_from(["text", "active", "idle", "end", "sweep", "drain"]),
        st.integers(min_value=0, max_value=5),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(EVENTS)
def test_table_invariants_hold_for_any_event_order(events: list[tuple[str, int]]) -> None:
    """Whatever the order of events: CALL_END always ends the call; a call leaves the table
    only by CALL_END, eviction or close, and then its worker is woken (so it can end);
    eviction never takes a call with queued text or an utterance in progress; after a
    sweep the table holds at most ``max_calls`` calls unless more are speaking."""
    t = table(idle_s=3.0, max_calls=3)
    now = 0.0
    for kind, cid in events:
        now += 1.0
        before = dict(t.calls)
        if kind == "text":
            actions = t.text(cid, b"hi", 0, now)
        elif kind == "active":
            actions = t.speech_active(cid, 0, now, 0)
        elif kind == "idle":
            actions = t.speech_idle(cid, now)
        elif kind == "end":
            actions = t.call_end(cid)
            assert cid not in t.calls and cid in t.ended
            if cid in before:
                assert before[cid].phase is CallPhase.ENDED and before[cid].closed
                assert not before[cid].queue
        elif kind == "sweep":
            actions = t.sweep(now)
        else:  # a worker drains its queue completely
            call = t.calls.get(cid)
            actions = []
            if call is not None:
                while call.queue:
                    speak_one(t, call, now)
                assert t.next_utterance(call, now) is None
        gone = {c for i, c in before.items() if i not in t.calls or t.calls[i] is not c}
        woke = {a.call for a in actions if isinstance(a, WakeWorker)}
        for call in gone:
            assert call in woke and call.closed
            assert call.phase is CallPhase.ENDED
            if kind != "end":  # evicted: it had nothing to say
                assert not call.queue and call.current is None
        for call in t.calls.values():
            assert not call.closed
        if kind == "sweep":
            busy = len([c for c in t.calls.values() if not c.idle])
            assert len(t.calls) <= max(3, busy)
