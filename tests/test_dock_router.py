"""The router core (``ttsdock.router``) without sockets: decisions and the counters they move
(the keepalive rule's tests are in ``test_svc_keepalive``)."""

from __future__ import annotations

from protocol.mgmt import CallEnd, SpeechActive, SpeechIdle
from protocol.packet import Packet
from ttsdock.calls import CallTracker
from ttsdock.hold import HoldBuffer
from ttsdock.router import (
    CallEnded,
    Dropped,
    FlushOap,
    Retire,
    Router,
    SendMgmt,
    SendText,
    ToOap,
)
from ttsdock.stats import Stats


def make() -> Router[str]:
    return Router(Stats(), CallTracker(), HoldBuffer())


# ------------------------------------------------------------------------------ router
def test_text_to_active_engine() -> None:
    r = make()
    r.dock("kokoro", "h1", 0.0)
    assert r.text(Packet(3, b"hallo"), 1.0, engine_ready=True) == [SendText(Packet(3, b"hallo"))]
    assert (r.stats.text_frames_in, r.stats.text_bytes_in, r.stats.text_held) == (1, 5, 0)


def test_text_held_without_engine_and_delivered_on_dock_in_order() -> None:
    r = make()
    assert r.text(Packet(3, b"a"), 0.0, engine_ready=False) == []
    assert r.text(Packet(4, b"b"), 0.0, engine_ready=False) == []
    assert r.text(Packet(3, b"c"), 0.0, engine_ready=False) == []
    assert r.stats.text_held == 3
    gen, actions = r.dock("kokoro", "h1", 1.0)
    assert gen == 1 and r.engine == "h1"
    assert actions == [
        SendText(Packet(3, b"a"), from_hold=True),
        SendText(Packet(3, b"c"), from_hold=True),
        SendText(Packet(4, b"b"), from_hold=True),
    ]
    assert r.stats.engines_docked == 1 and r.stats.swaps == 0


def test_text_for_a_closing_engine_is_held() -> None:
    r = make()
    r.dock("kokoro", "h1", 0.0)
    assert r.text(Packet(3, b"x"), 0.0, engine_ready=False) == []
    assert r.hold.calls() == {3: (1, 1)}


def test_text_after_call_end_dropped_and_counted() -> None:
    r = make()
    r.dock("k", "h", 0.0)
    r.call_message(CallEnd(3))
    (d,) = r.text(Packet(3, b"late"), 0.0, engine_ready=True)
    assert isinstance(d, Dropped) and d.reason == "call_ended"
    assert r.stats.drops["call_ended"] == 1


def test_call_end_teed_and_discards_held_text() -> None:
    r = make()
    r.text(Packet(3, b"held"), 0.0, engine_ready=False)
    actions = r.call_message(CallEnd(3))
    assert actions == [
        Dropped("text_dropped", 3, "call_ended", {"packets": 1, "bytes": 4}),
        CallEnded(3),
        ToOap(CallEnd(3)),
    ]  # no engine docked: nothing for an engine
    assert r.stats.calls_ended == 1 and r.stats.drops["call_ended"] == 1
    assert r.call_message(CallEnd(3)) == []
    assert r.stats.drops["duplicate_call_end"] == 1


def test_barge_in_discards_held_text_and_reaches_the_engine() -> None:
    r = make()
    r.dock("k", "h", 0.0)
    r.text(Packet(5, b"held"), 0.0, engine_ready=False)
    actions = r.call_message(SpeechActive(5))
    assert actions[0] == Dropped("text_dropped", 5, "barge_in", {"packets": 1, "bytes": 4})
    assert actions[1:] == [ToOap(SpeechActive(5)), SendMgmt(SpeechActive(5))]
    assert r.stats.drops["barge_in"] == 1
    assert r.call_message(SpeechActive(5)) == []  # no change: suppressed
    assert r.call_message(SpeechIdle(5)) == [ToOap(SpeechIdle(5)), SendMgmt(SpeechIdle(5))]


def test_first_speech_idle_prewarms_the_engine_only() -> None:
    r = make()
    r.dock("k", "h", 0.0)
    assert r.call_message(SpeechIdle(9)) == [SendMgmt(SpeechIdle(9))]
    assert r.call_message(SpeechIdle(9)) == []  # no change
    assert r.call_message(SpeechActive(9)) == [ToOap(SpeechActive(9)), SendMgmt(SpeechActive(9))]


def test_speech_after_end_dropped() -> None:
    r = make()
    r.call_message(CallEnd(6))
    assert r.call_message(SpeechActive(6)) == []
    assert r.stats.drops["speech_after_end"] == 1


def test_swap_retires_old_and_flushes_oap() -> None:
    r = make()
    r.dock("a", "h1", 0.0)
    gen, actions = r.dock("b", "h2", 1.0)
    assert gen == 2 and r.engine == "h2"
    assert isinstance(actions[0], Retire) and actions[0].record.handle == "h1"
    assert actions[1:] == [FlushOap("swap")]
    assert r.stats.swaps == 1 and r.stats.engines_docked == 2
    assert r.leave(1, 2.0, "closed") == []  # the replaced engine leaving: no flush
    assert r.leave(2, 3.0, "crash") == [FlushOap("crash")]
    assert r.engine is None


def test_held_text_expires_counted() -> None:
    r = Router[str](Stats(), CallTracker(), HoldBuffer(max_age=1.0))
    r.text(Packet(3, b"abc"), 0.0, engine_ready=False)
    assert r.expire(0.5) == []
    assert r.expire(1.0) == [Dropped("text_dropped", 3, "hold_expired", {"packets": 1, "bytes": 3})]
    assert r.stats.drops["hold_expired"] == 1
