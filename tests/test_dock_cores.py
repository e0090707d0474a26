"""Sans-I/O cores of the dock: slot, call tracker, hold buffer, rate limit, stats, config."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.mgmt import CallEnd, SpeechActive, SpeechIdle
from ttsdock.calls import TRANSITIONS as CALL_TABLE
from ttsdock.calls import Action, CallEvent, CallState, CallTracker
from ttsdock.config import Config, parse_args
from ttsdock.hold import HoldBuffer
from ttsdock.ratelimit import RateLimit
from ttsdock.slot import TRANSITIONS as SLOT_TABLE
from ttsdock.slot import Slot, SlotError, SlotEvent, SlotState
from ttsdock.stats import Stats, percentile


# ------------------------------------------------------------------------------ slot
def test_slot_first_engine_becomes_active() -> None:
    slot: Slot[str] = Slot()
    r = slot.dock("kokoro", "h1", 1.0)
    assert (r.generation, r.replaced, slot.state) == (1, None, SlotState.ACTIVE)
    assert slot.is_current(1) and slot.active_name == "kokoro"


def test_slot_last_connect_wins_and_old_generation_is_stale() -> None:
    slot: Slot[str] = Slot()
    slot.dock("kokoro", "h1", 1.0)
    r = slot.dock("qwen3", "h2", 2.0)
    assert r.generation == 2 and r.replaced is not None and r.replaced.handle == "h1"
    assert slot.state is SlotState.SWAPPING and slot.swaps == 1
    assert not slot.is_current(1) and slot.is_current(2)
    # the replaced engine closing is not a slot-clearing event
    assert slot.leave(1, 3.0, "closed") is False
    assert slot.state is SlotState.ACTIVE and slot.active_name == "qwen3"
    assert [h.name for h in slot.history] == ["kokoro"]


def test_slot_active_leaving_empties_and_asks_for_flush() -> None:
    slot: Slot[str] = Slot()
    slot.dock("a", "h", 0.0)
    assert slot.leave(1, 1.0, "keepalive_timeout") is True
    assert slot.state is SlotState.EMPTY and slot.active is None
    assert not slot.is_current(1)
    assert slot.history[-1].reason == "keepalive_timeout"
    assert slot.leave(1, 1.0, "again") is False  # idempotent


def test_slot_drain_after_newcomer_left() -> None:
    slot: Slot[str] = Slot()
    slot.dock("a", "h1", 0)
    slot.dock("b", "h2", 0)
    assert slot.leave(2, 0, "crash") is True
    assert slot.state is SlotState.EMPTY and slot.draining
    slot.dock("c", "h3", 0)
    assert slot.state is SlotState.ACTIVE
    assert slot.leave(1, 0, "closed") is False  # the old one finally goes
    assert slot.state is SlotState.ACTIVE and slot.active_name == "c"


def test_slot_table_is_closed() -> None:
    with pytest.raises(SlotError):
        Slot[str]()._apply(SlotEvent.LEAVE)  # LEAVE in EMPTY is not in the table
    assert set(SLOT_TABLE) == set(SlotState)


@given(st.lists(st.tuples(st.sampled_from(["dock", "leave"]), st.integers(1, 8)), max_size=60))
def test_slot_invariants(ops: list[tuple[str, int]]) -> None:
    slot: Slot[int] = Slot()
    last = 0
    for op, gen in ops:
        if op == "dock":
            r = slot.dock("e", gen, 0)
            assert r.generation > last
            last = r.generation
        else:
            slot.leave(gen, 0, "x")
        assert (slot.active is None) == (slot.state is SlotState.EMPTY)
        assert slot.active is None or slot.active.generation == slot.generation
        assert slot.generation not in slot.draining


# ------------------------------------------------------------------------------ calls
def test_call_table_covers_every_state_and_event() -> None:
    for state in CallState:
        assert set(CALL_TABLE[state]) == set(CallEvent)


def test_speech_passed_on_only_on_change() -> None:
    t = CallTracker()
    got = [
        t.apply_message(m)
        for m in [SpeechIdle(1), SpeechIdle(1), SpeechActive(1), SpeechActive(1), SpeechIdle(1)]
    ]
    F, S = Action.FORWARD, Action.SUPPRESS
    assert got == [F, S, F, S, F]
    assert t.apply_message(SpeechActive(2)) is F  # first event of another call


def test_call_end_once_then_everything_dropped() -> None:
    t = CallTracker()
    assert t.apply(5, CallEvent.TEXT) is Action.FORWARD
    assert t.apply_message(CallEnd(5)) is Action.FORWARD
    assert t.apply_message(CallEnd(5)) is Action.DROP
    assert t.apply(5, CallEvent.TEXT) is Action.DROP
    assert t.apply_message(SpeechIdle(5)) is Action.DROP
    assert t.state(5) is CallState.ENDED and 5 not in t.live()


def test_ended_ids_remembered_at_least_1000() -> None:
    t = CallTracker(ended_memory=1000)
    for cid in range(1, 1001):
        t.apply_message(CallEnd(cid))
    assert all(t.state(c) is CallState.ENDED for c in range(1, 1001))
    t.apply_message(CallEnd(5000))
    assert t.state(1) is CallState.NEW and t.ended_count == 1000
    with pytest.raises(ValueError):
        CallTracker(ended_memory=999)


def test_live_calls_bounded() -> None:
    t = CallTracker(max_live=10)
    for cid in range(1, 100):
        t.apply(cid, CallEvent.TEXT)
    assert len(t.live()) == 10


# ------------------------------------------------------------------------------ hold
def test_hold_in_order_and_drain() -> None:
    h = HoldBuffer(max_packets=3, max_bytes=100, max_age=10, max_calls=2)
    assert h.hold(1, b"a", 0) is None
    assert h.hold(2, b"x", 0) is None
    assert h.hold(1, b"b", 1) is None
    assert h.calls() == {1: (2, 2), 2: (1, 1)}
    assert list(h.drain()) == [(1, b"a"), (1, b"b"), (2, b"x")]
    assert len(h) == 0 and h.total_bytes == 0


def test_hold_bounds() -> None:
    h = HoldBuffer(max_packets=2, max_bytes=5, max_age=10, max_calls=1)
    assert h.hold(1, b"abc", 0) is None
    d = h.hold(1, b"def", 0)  # 6 bytes > 5
    assert d is not None and (d.reason, d.packets, d.nbytes) == ("hold_full", 1, 3)
    assert h.hold(1, b"d", 0) is None
    d = h.hold(1, b"e", 0)  # third packet > 2
    assert d is not None and d.reason == "hold_full"
    d = h.hold(2, b"x", 0)  # second call > 1
    assert d is not None and d.reason == "hold_calls"
    assert list(h.drain()) == [(1, b"abc"), (1, b"d")]


def test_hold_total_bound() -> None:
    h = HoldBuffer(max_packets=10, max_bytes=10, max_age=10, max_calls=10, max_total_bytes=12)
    assert h.hold(1, b"a" * 10, 0) is None
    d = h.hold(2, b"b" * 3, 0)
    assert d is not None and d.reason == "hold_total"
    assert h.hold(2, b"b" * 2, 0) is None and h.total_bytes == 12


def test_hold_expire_and_discard() -> None:
    h = HoldBuffer(max_age=10)
    h.hold(1, b"old", 0)
    h.hold(1, b"new", 5)
    h.hold(2, b"zz", 1)
    assert h.oldest() == 0
    assert h.expire(9.9) == []
    drops = h.expire(11.5)
    assert [(d.call_id, d.reason, d.packets, d.nbytes) for d in drops] == [
        (1, "hold_expired", 1, 3),
        (2, "hold_expired", 1, 2),
    ]
    d = h.discard(1)
    assert d is not None and (d.reason, d.packets, d.nbytes) == ("call_ended", 1, 3)
    assert h.discard(1) is None and h.total_bytes == 0 and len(h) == 0


@given(
    st.lists(
        st.tuples(
            st.integers(1, 4), st.binary(max_size=40), st.floats(0, 1, allow_subnormal=False)
        ),
        max_size=80,
    )
)
def test_hold_never_exceeds_bounds(items: list[tuple[int, bytes, float]]) -> None:
    h = HoldBuffer(max_packets=5, max_bytes=100, max_age=1000, max_calls=3)
    kept: dict[int, list[bytes]] = {}
    for cid, data, t in items:
        if h.hold(cid, data, t) is None:
            kept.setdefault(cid, []).append(data)
        for n, nb in h.calls().values():
            assert n <= 5 and nb <= 100
        assert len(h.calls()) <= 3
    drained: dict[int, list[bytes]] = {}
    for cid, data in h.drain():
        drained.setdefault(cid, []).append(data)
    assert drained == kept  # in order, nothing lost that was accepted


# ------------------------------------------------------------------------------ misc
def test_rate_limit() -> None:
    rl = RateLimit(1.0)
    assert rl.allow("k", 0.0) == (True, 0)
    assert rl.allow("k", 0.5) == (False, 0)
    assert rl.allow("k", 0.7) == (False, 0)
    assert rl.allow("other", 0.7) == (True, 0)
    assert rl.allow("k", 1.2) == (True, 2)


def test_percentile_and_stats() -> None:
    assert percentile([], 50) == 0
    values = list(range(1, 101))
    assert percentile(values, 50) == 50 and percentile(values, 99) == 99
    assert percentile(values, 100) == 100
    s = Stats()
    for us in (100, 200, 300):
        s.add_hop(us)
    s.drops["oap_down"] += 2
    d = s.as_dict()
    assert d["hop_p50_us"] == 200 and d["hop_max_us"] == 300 and d["drop_oap_down"] == 2
    assert "drops_total=2" in s.line()
    prom = s.prometheus({"engine_active": 1})
    assert 'ttsdock_frames_dropped_total{reason="oap_down"} 2' in prom
    assert "ttsdock_hop_latency_seconds_count 3" in prom and prom.endswith("\n")


def test_config_defaults_env_and_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(__import__("os").environ):
        if k.startswith("TTSDOCK_"):
            monkeypatch.delenv(k)
    cfg = parse_args([])
    assert cfg == Config()
    assert (cfg.llama_mgmt_port, cfg.llama_data_port, cfg.cmd_port, cfg.dock_port) == (
        13140, 13141, 13142, 13143,
    )  # fmt: skip
    assert (cfg.oap_mgmt_port, cfg.oap_data_port, cfg.oap_host) == (13150, 13151, "127.0.0.1")
    monkeypatch.setenv("TTSDOCK_DOCK_PORT", "23143")
    monkeypatch.setenv("TTSDOCK_HOLD_SECONDS", "2.5")
    cfg = parse_args(["--cmd-port", "0", "--udp-log"])
    assert (cfg.dock_port, cfg.hold_seconds, cfg.cmd_port) == (23143, 2.5, 0)
    assert cfg.udp_log == ("127.0.0.1", 22022)
    assert parse_args(["--dock-port", "1"]).dock_port == 1  # the flag wins over the env
    monkeypatch.setenv("TTSDOCK_DOCK_PORT", "x")
    with pytest.raises(SystemExit):
        parse_args([])


def test_config_cipher(tmp_path: Path) -> None:
    key = tmp_path / "ic_key.bin"
    flag = tmp_path / "ic_encryption.flag"
    assert Config().cipher() is None
    key.write_bytes(b"k" * 32)
    assert Config(ic_key=key).cipher() is not None
    assert Config(ic_key=key, ic_flag=flag).cipher() is None  # flag file missing: off
    flag.write_text("1")
    assert Config(ic_key=key, ic_flag=flag).cipher() is not None
    with pytest.raises(ValueError, match="--ic-key"):
        Config(ic_flag=flag).cipher()
    key.write_bytes(b"short")
    with pytest.raises(ValueError, match="32 bytes"):
        Config(ic_key=key).cipher()


def test_config_back_pressure_marks(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(__import__("os").environ):
        if k.startswith("TTSDOCK_"):
            monkeypatch.delenv(k)
    cfg = parse_args([])
    assert (cfg.oap_high_water, cfg.oap_low_water) == (4 << 20, 1 << 20)
    cfg = parse_args(["--oap-high-water", "65536", "--oap-low-water", "0"])
    assert (cfg.oap_high_water, cfg.oap_low_water) == (65536, 0)
    monkeypatch.setenv("TTSDOCK_OAP_HIGH_WATER", "2048")
    assert parse_args(["--oap-low-water", "1024"]).oap_high_water == 2048
    with pytest.raises(SystemExit):
        parse_args(["--oap-high-water", "10", "--oap-low-water", "11"])
