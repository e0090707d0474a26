"""Engine dock frames after ``OK`` (docs/wire.md#engine-frames): ``0x01`` + Packet,
``0x02`` + mgmt type + payload; no length prefix, so the decoder must know every size;
anything else is fatal."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from protocol_helpers import (
    drain_engine,
    engine_events,
    feed_all,
    held_bytes,
    one_byte_at_a_time,
    splits,
)

from protocol import (
    FLUSH_TTS,
    NEED_DATA,
    PING,
    PONG,
    SHUTDOWN,
    TAG_MGMT,
    TAG_PACKET,
    CallEnd,
    Custom,
    EngineEvent,
    EngineFrameDecoder,
    Packet,
    Ping,
    Pong,
    ProtocolError,
    SpeechActive,
    SpeechIdle,
    encode_engine_frame,
    encode_engine_packet_header,
)

# Every engine-dock frame, by hand from docs/wire.md#engine-frames.
GOLDEN: list[tuple[bytes, EngineEvent]] = [
    (b"\x01\x00\x00\x00\x07\x00\x00\x00\x0bHallo Welt.", Packet(7, b"Hallo Welt.")),
    (b"\x01\xff\xff\xff\xff\x00\x00\x00\x00", Packet(0xFFFFFFFF, b"")),
    (
        b"\x01\x00\x00\x00\x2a\x00\x00\x00\x14"
        + b"\xc0\x5d\x00\x00"  # 24000, i32 LE
        + b"\x00\x00\x00\x00\x00\x00\x03\xe8"  # t = 1000 us, u64 BE
        + b"\x00\x00\x80\x3f\x00\x00\x00\xbf",  # 1.0, -0.5 as f32 LE
        Packet(42, bytes.fromhex("c05d000000000000000003e80000803f000000bf")),
    ),
    (b"\x02\x01\x00\x00\x00\x2a", CallEnd(42)),
    (b"\x02\x02\x00\x00\x00\x2a", SpeechActive(42)),
    (b"\x02\x03\x00\x00\x00\x2a", SpeechIdle(42)),
    (b"\x02\x04", Ping()),
    (b"\x02\x05", Pong()),
    (b"\x02\x0a\x00\x00", Custom(b"")),
    (b"\x02\x0a\x00\x08SHUTDOWN", Custom(b"SHUTDOWN")),
    (b"\x02\x0a\x00\x09FLUSH_TTS", Custom(b"FLUSH_TTS")),
]
STREAM = b"".join(w for w, _ in GOLDEN)
EVENTS = [e for _, e in GOLDEN]
MAX_ENGINE_FRAME = 1 + 8 + 1_048_576


def test_tags() -> None:
    assert (TAG_PACKET, TAG_MGMT) == (0x01, 0x02)


@pytest.mark.parametrize(("wire", "event"), GOLDEN)
def test_encode_golden(wire: bytes, event: EngineEvent) -> None:
    assert encode_engine_frame(event) == wire


@pytest.mark.parametrize(("wire", "event"), GOLDEN)
def test_decode_golden(wire: bytes, event: EngineEvent) -> None:
    dec = EngineFrameDecoder()
    dec.feed(wire)
    assert dec.next_event() == event
    assert dec.next_event() is NEED_DATA
    assert dec.buffered == 0


def test_named_messages_on_the_engine_dock() -> None:
    assert encode_engine_frame(SHUTDOWN) == b"\x02\x0a\x00\x08SHUTDOWN"
    assert encode_engine_frame(FLUSH_TTS) == b"\x02\x0a\x00\x09FLUSH_TTS"
    assert encode_engine_frame(PING) == b"\x02\x04"
    assert encode_engine_frame(PONG) == b"\x02\x05"


def test_packet_header_for_zero_copy_writes() -> None:
    assert encode_engine_packet_header(7, 11) == b"\x01\x00\x00\x00\x07\x00\x00\x00\x0b"
    assert encode_engine_packet_header(7, 11) + b"Hallo Welt." == GOLDEN[0][0]
    with pytest.raises(ProtocolError):
        encode_engine_packet_header(0, 1)
    with pytest.raises(ProtocolError):
        encode_engine_packet_header(1, 1_048_577)


def test_many_frames_in_one_feed() -> None:
    dec = EngineFrameDecoder()
    dec.feed(STREAM)
    assert drain_engine(dec) == EVENTS
    assert dec.buffered == 0


def test_one_byte_at_a_time() -> None:
    dec = EngineFrameDecoder()
    got = feed_all(list(one_byte_at_a_time(STREAM)), dec.feed, lambda: drain_engine(dec))
    assert got == EVENTS
    assert dec.buffered == 0


@pytest.mark.parametrize("cut", range(len(STREAM) + 1))
def test_every_two_way_split(cut: int) -> None:
    dec = EngineFrameDecoder()
    dec.feed(STREAM[:cut])
    got = drain_engine(dec)
    dec.feed(STREAM[cut:])
    got += drain_engine(dec)
    assert got == EVENTS


def test_partial_frames_need_data() -> None:
    for wire, _ in GOLDEN:
        for n in range(len(wire)):
            dec = EngineFrameDecoder()
            dec.feed(wire[:n])
            assert dec.next_event() is NEED_DATA, (wire, n)
            assert dec.buffered == n


def test_max_payload_and_max_custom_accepted() -> None:
    payload = b"\x11" * 1_048_576
    wire = b"\x01\x00\x00\x00\x01\x00\x10\x00\x00" + payload
    assert encode_engine_frame(Packet(1, payload)) == wire
    custom = b"\x02\x0a\x10\x00" + b"c" * 4096
    assert encode_engine_frame(Custom(b"c" * 4096)) == custom
    dec = EngineFrameDecoder()
    dec.feed(wire + custom)
    assert drain_engine(dec) == [Packet(1, payload), Custom(b"c" * 4096)]


def test_custom_over_4096_cannot_be_encoded() -> None:
    with pytest.raises(ProtocolError) as info:
        encode_engine_frame(Custom(b"c" * 4097))
    assert info.value.reason == "custom_too_long"


def _reason(*pieces: bytes) -> str:
    dec = EngineFrameDecoder()
    with pytest.raises(ProtocolError) as info:
        for p in pieces:
            dec.feed(p)
            drain_engine(dec)
    return info.value.reason


@pytest.mark.parametrize("tag", [0x00, 0x03, 0x04, 0x0A, 0x7F, 0xFF])
def test_unknown_tag_rejected_on_first_byte(tag: int) -> None:
    assert _reason(bytes([tag])) == "unknown_tag"
    with pytest.raises(ProtocolError, match=f"0x{tag:02x}"):
        d = EngineFrameDecoder()
        d.feed(bytes([tag]))
        d.next_event()


@pytest.mark.parametrize("kind", [0x00, 0x06, 0x07, 0x08, 0x09, 0x0B, 0xFF])
def test_unknown_mgmt_type_rejected_on_second_byte(kind: int) -> None:
    assert _reason(bytes([0x02, kind])) == "unknown_mgmt_type"


def test_call_id_zero_rejected() -> None:
    assert _reason(b"\x01\x00\x00\x00\x00\x00\x00\x00\x00") == "bad_call_id"
    # rejected on the header alone, before the announced body arrives
    assert _reason(b"\x01\x00\x00\x00\x00\x00\x00\x00\x05") == "bad_call_id"
    assert _reason(b"\x02\x01\x00\x00\x00\x00") == "bad_call_id"
    assert _reason(b"\x02\x02\x00\x00\x00\x00") == "bad_call_id"
    assert _reason(b"\x02\x03\x00\x00\x00\x00") == "bad_call_id"


def test_payload_over_1_mib_rejected_before_body() -> None:
    assert _reason(b"\x01\x00\x00\x00\x01\x00\x10\x00\x01") == "payload_too_large"
    assert _reason(b"\x01\x00\x00\x00\x01\xff\xff\xff\xff") == "payload_too_large"


def test_custom_over_4096_rejected_before_body() -> None:
    assert _reason(b"\x02\x0a\x10\x01") == "custom_too_long"
    assert _reason(b"\x02\x0a\xff\xff") == "custom_too_long"


def test_error_after_good_frames_keeps_the_good_ones() -> None:
    dec = EngineFrameDecoder()
    dec.feed(b"\x02\x04\x02\x05\x07")
    assert dec.next_event() == Ping()
    assert dec.next_event() == Pong()
    with pytest.raises(ProtocolError):
        dec.next_event()


def test_held_error_does_not_poison_the_buffer() -> None:
    """Regression: a memoryview of the buffer kept alive by the error's traceback made the
    next ``feed`` raise BufferError instead of working (or raising ProtocolError)."""
    for bad in (b"\x02\x06", b"\x02\x0a\xff\xff", b"\x02\x01\x00\x00\x00\x00"):
        dec = EngineFrameDecoder()
        dec.feed(bad)
        with pytest.raises(ProtocolError) as info:
            dec.next_event()
        assert info.value.__traceback__ is not None  # still held here
        dec.feed(b"\x02\x04")  # must not raise BufferError


def test_buffer_bound_while_trickling_a_max_packet() -> None:
    wire = encode_engine_frame(Packet(3, b"\x22" * 1_048_576)) + b"\x02\x04"
    dec = EngineFrameDecoder()
    chunk = 65536
    got: list[EngineEvent] = []
    for i in range(0, len(wire), chunk):
        piece = wire[i : i + chunk]
        dec.feed(piece)
        assert dec.buffered <= MAX_ENGINE_FRAME + len(piece)
        got += drain_engine(dec)
        assert dec.buffered < MAX_ENGINE_FRAME
    assert [type(e) for e in got] == [Packet, Ping]


def test_consumed_bytes_are_released() -> None:
    frames = encode_engine_frame(Packet(5, b"e" * 1000)) + b"\x02\x04"
    dec = EngineFrameDecoder()
    for _ in range(2000):
        dec.feed(frames)
        assert drain_engine(dec) == [Packet(5, b"e" * 1000), Ping()]
        assert held_bytes(dec) <= 2 * len(frames)
    assert held_bytes(dec) > 0


@given(st.lists(engine_events(), max_size=8), st.data())
def test_roundtrip_with_arbitrary_splits(events: list[EngineEvent], data: st.DataObject) -> None:
    wire = b"".join(encode_engine_frame(e) for e in events)
    dec = EngineFrameDecoder()
    got = feed_all(data.draw(splits(wire)), dec.feed, lambda: drain_engine(dec))
    assert got == events
    assert dec.buffered == 0


@given(engine_events())
def test_roundtrip_each(event: EngineEvent) -> None:
    wire = encode_engine_frame(event)
    assert wire[0] == (TAG_PACKET if isinstance(event, Packet) else TAG_MGMT)
    dec = EngineFrameDecoder()
    dec.feed(wire)
    assert dec.next_event() == event
    assert dec.next_event() is NEED_DATA
