"""``protocol.connection``: the engine-dock connection state machine, both sides, with the
golden bytes of docs/wire.md#engine-dock and property tests over arbitrary splits and
arbitrary bytes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.connection import (
    TRANSITIONS,
    ConnectionStateError,
    EngineDockConnection,
    Phase,
    Role,
)
from protocol.engine_frames import encode_engine_frame
from protocol.errors import ProtocolError
from protocol.framing import NeedData
from protocol.hello import REASON_BAD_NAME, Hello, HelloRejected, HelloReply
from protocol.mgmt import CallEnd, Ping, Pong
from protocol.packet import Packet

HELLO = b'{"name":"kokoro","sample_rate":24000,"channels":1,"format":"f32le"}\n'
FRAMES = encode_engine_frame(Packet(7, b"hallo")) + b"\x02\x04" + b"\x02\x01\x00\x00\x00\x07"
EVENTS = [Packet(7, b"hallo"), Ping(), CallEnd(7)]


def events(c: EngineDockConnection) -> list[object]:
    out = []
    while not isinstance(ev := c.next_event(), NeedData):
        out.append(ev)
    return out


def test_dock_side_hello_accept_then_frames() -> None:
    c = EngineDockConnection(Role.DOCK)
    c.feed(HELLO + FRAMES)  # frames may follow the HELLO in the same segment
    assert events(c) == [Hello("kokoro")]
    assert c.phase is Phase.DECIDING  # frames wait for the decision
    assert c.accept() == b"OK\n"
    assert c.phase is Phase.FRAMES
    assert events(c) == EVENTS


def test_dock_side_reject() -> None:
    c = EngineDockConnection(Role.DOCK)
    with pytest.raises(HelloRejected) as info:
        c.feed(b'{"name":"bad name","sample_rate":24000,"channels":1,"format":"f32le"}\n')
    assert info.value.reason == REASON_BAD_NAME
    assert c.phase is Phase.CLOSED
    assert c.reject(info.value) == b"ERR hello_bad_name\n"
    c.feed(FRAMES)  # ignored once closed
    assert events(c) == []


def test_dock_side_timeout_reject_while_waiting() -> None:
    c = EngineDockConnection(Role.DOCK)
    c.feed(b'{"name":')
    assert events(c) == []
    reply = c.reject(HelloRejected("hello_timeout_or_too_long"))
    assert reply == b"ERR hello_timeout_or_too_long\n"
    assert c.phase is Phase.CLOSED


def test_engine_side_ok_then_frames() -> None:
    c = EngineDockConnection(Role.ENGINE)
    assert c.hello(Hello("kokoro")) == HELLO
    c.feed(b"OK\n" + FRAMES)
    assert events(c) == [HelloReply(True), *EVENTS]
    assert c.in_frames


def test_engine_side_err_closes() -> None:
    c = EngineDockConnection(Role.ENGINE)
    c.feed(b"ERR hello_bad_name\n")
    assert events(c) == [HelloReply(False, "hello_bad_name")]
    assert c.phase is Phase.CLOSED


def test_engine_side_garbage_reply() -> None:
    c = EngineDockConnection(Role.ENGINE)
    with pytest.raises(ProtocolError):
        c.feed(b"HELLO?\n")
    assert c.phase is Phase.CLOSED


def test_bad_frame_closes() -> None:
    c = EngineDockConnection(Role.ENGINE)
    c.feed(b"OK\n\x07")
    assert c.next_event() == HelloReply(True)
    with pytest.raises(ProtocolError):
        c.next_event()
    assert c.phase is Phase.CLOSED


def test_steps_outside_the_table_are_caller_bugs() -> None:
    with pytest.raises(ConnectionStateError):
        EngineDockConnection(Role.DOCK).accept()  # no HELLO yet
    with pytest.raises(ConnectionStateError):
        EngineDockConnection(Role.DOCK).hello(Hello("x"))  # the dock sends no HELLO
    assert set(TRANSITIONS[Role.ENGINE]) == {Phase.HELLO, Phase.FRAMES, Phase.CLOSED}


@given(st.lists(st.integers(0, len(HELLO + FRAMES)), max_size=12))
def test_any_split_gives_the_same_events_dock(cuts: list[int]) -> None:
    data = HELLO + FRAMES
    c = EngineDockConnection(Role.DOCK)
    got: list[object] = []
    prev = 0
    for cut in [*sorted(cuts), len(data)]:
        c.feed(data[prev:cut])
        prev = cut
        for ev in events(c):
            got.append(ev)
            if isinstance(ev, Hello):
                c.accept()
        got.extend(events(c))
    assert got == [Hello("kokoro"), *EVENTS]


@given(st.lists(st.integers(0, len(FRAMES) + 3), max_size=12))
def test_any_split_gives_the_same_events_engine(cuts: list[int]) -> None:
    data = b"OK\n" + FRAMES
    c = EngineDockConnection(Role.ENGINE)
    got: list[object] = []
    prev = 0
    for cut in [*sorted(cuts), len(data)]:
        c.feed(data[prev:cut])
        prev = cut
        got.extend(events(c))
    assert got == [HelloReply(True), *EVENTS]


@given(st.sampled_from(list(Role)), st.lists(st.binary(max_size=300), max_size=8))
def test_arbitrary_bytes_only_raise_protocol_error(role: Role, chunks: list[bytes]) -> None:
    c = EngineDockConnection(role)
    try:
        for chunk in chunks:
            c.feed(chunk)
            for ev in events(c):
                if isinstance(ev, Hello):
                    c.accept()
            assert c.frames.buffered <= 1 + 8 + (1 << 20) + 300
    except ProtocolError:
        assert c.phase is Phase.CLOSED


def test_pong_round_trip() -> None:
    c = EngineDockConnection(Role.DOCK)
    c.feed(HELLO)
    events(c)
    c.accept()
    c.feed(encode_engine_frame(Pong()))
    assert events(c) == [Pong()]
