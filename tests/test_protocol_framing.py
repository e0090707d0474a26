"""Pipeline framing (docs/wire.md#frames): u32 BE length N + N body bytes, N <= 1 MiB + 256.

Golden frames for every body the pipeline carries: data Packets and every mgmt type.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from protocol_helpers import (
    drain_frames,
    feed_all,
    held_bytes,
    mgmt_messages,
    one_byte_at_a_time,
    packets,
    splits,
)

from protocol import (
    MAX_FRAME_BODY,
    NEED_DATA,
    CallEnd,
    Custom,
    FrameDecoder,
    MgmtMessage,
    NeedData,
    Packet,
    Ping,
    Pong,
    ProtocolError,
    SpeechActive,
    SpeechIdle,
    decode_mgmt,
    decode_packet,
    encode_frame,
    encode_mgmt,
    encode_packet,
)
from protocol.mgmt import MAX_CUSTOM_PIPELINE

# Whole pipeline frames (length prefix included), by hand from docs/wire.md#frames.
DATA_FRAME = b"\x00\x00\x00\x13" + b"\x00\x00\x00\x07\x00\x00\x00\x0b" + b"Hallo Welt."
MGMT_FRAMES: list[tuple[bytes, MgmtMessage]] = [
    (b"\x00\x00\x00\x05\x01\x00\x00\x00\x2a", CallEnd(42)),
    (b"\x00\x00\x00\x05\x02\x00\x00\x00\x2a", SpeechActive(42)),
    (b"\x00\x00\x00\x05\x03\x00\x00\x00\x2a", SpeechIdle(42)),
    (b"\x00\x00\x00\x01\x04", Ping()),
    (b"\x00\x00\x00\x01\x05", Pong()),
    (b"\x00\x00\x00\x03\x0a\x00\x00", Custom(b"")),
    (b"\x00\x00\x00\x0b\x0a\x00\x08SHUTDOWN", Custom(b"SHUTDOWN")),
    (b"\x00\x00\x00\x0c\x0a\x00\x09FLUSH_TTS", Custom(b"FLUSH_TTS")),
]
MAX_FRAME = 4 + MAX_FRAME_BODY


def test_max_frame_body_matches_wire_md() -> None:
    assert MAX_FRAME_BODY == 1_048_576 + 256


def test_data_frame_golden() -> None:
    assert encode_frame(encode_packet(Packet(7, b"Hallo Welt."))) == DATA_FRAME
    dec = FrameDecoder()
    dec.feed(DATA_FRAME)
    body = dec.next_body()
    assert isinstance(body, bytes)
    assert decode_packet(body) == Packet(7, b"Hallo Welt.")
    assert dec.next_body() is NEED_DATA
    assert dec.buffered == 0


@pytest.mark.parametrize(("wire", "msg"), MGMT_FRAMES)
def test_mgmt_frame_golden(wire: bytes, msg: MgmtMessage) -> None:
    assert encode_frame(encode_mgmt(msg)) == wire
    dec = FrameDecoder()
    dec.feed(wire)
    body = dec.next_body()
    assert isinstance(body, bytes)
    assert decode_mgmt(body) == msg
    assert dec.next_body() is NEED_DATA


@pytest.mark.parametrize(
    ("body", "wire"),
    [
        (b"", b"\x00\x00\x00\x00"),
        (b"\x00", b"\x00\x00\x00\x01\x00"),
        (b"ab", b"\x00\x00\x00\x02ab"),
        (b"z" * 256, b"\x00\x00\x01\x00" + b"z" * 256),
        (b"q" * 65536, b"\x00\x01\x00\x00" + b"q" * 65536),
    ],
)
def test_length_prefix_golden(body: bytes, wire: bytes) -> None:
    assert encode_frame(body) == wire
    dec = FrameDecoder()
    dec.feed(wire)
    assert dec.next_body() == body


def test_need_data_sentinel() -> None:
    assert isinstance(NEED_DATA, NeedData)
    assert repr(NEED_DATA) == "NEED_DATA"
    dec = FrameDecoder()
    assert dec.next_body() is NEED_DATA
    dec.feed(b"")
    assert dec.next_body() is NEED_DATA
    dec.feed(b"\x00\x00\x00")
    assert dec.next_body() is NEED_DATA
    dec.feed(b"\x02a")
    assert dec.next_body() is NEED_DATA
    assert dec.buffered == 5
    dec.feed(b"b")
    assert dec.next_body() == b"ab"
    assert dec.buffered == 0


ALL_GOLDEN = DATA_FRAME + b"".join(w for w, _ in MGMT_FRAMES)
ALL_BODIES = [DATA_FRAME[4:]] + [w[4:] for w, _ in MGMT_FRAMES]


def test_many_frames_in_one_feed() -> None:
    dec = FrameDecoder()
    dec.feed(ALL_GOLDEN)
    assert dec.buffered == len(ALL_GOLDEN)
    assert drain_frames(dec) == ALL_BODIES
    assert dec.buffered == 0


def test_one_byte_at_a_time_gives_the_same_bodies() -> None:
    dec = FrameDecoder()
    got = feed_all(list(one_byte_at_a_time(ALL_GOLDEN)), dec.feed, lambda: drain_frames(dec))
    assert got == ALL_BODIES
    assert dec.buffered == 0


@pytest.mark.parametrize("cut", range(len(ALL_GOLDEN) + 1))
def test_every_two_way_split(cut: int) -> None:
    dec = FrameDecoder()
    dec.feed(ALL_GOLDEN[:cut])
    got = drain_frames(dec)
    dec.feed(ALL_GOLDEN[cut:])
    got += drain_frames(dec)
    assert got == ALL_BODIES


def test_trailing_partial_frame_is_kept() -> None:
    dec = FrameDecoder()
    dec.feed(DATA_FRAME + DATA_FRAME[:7])
    assert drain_frames(dec) == [DATA_FRAME[4:]]
    assert dec.buffered == 7
    dec.feed(DATA_FRAME[7:])
    assert drain_frames(dec) == [DATA_FRAME[4:]]


def test_max_body_accepted() -> None:
    body = b"\x5a" * MAX_FRAME_BODY
    wire = encode_frame(body)
    assert wire[:4] == b"\x00\x10\x01\x00"
    dec = FrameDecoder()
    dec.feed(wire)
    assert dec.next_body() == body


def test_oversize_length_rejected_before_body() -> None:
    dec = FrameDecoder()
    dec.feed(b"\x00\x10\x01")
    assert dec.next_body() is NEED_DATA
    dec.feed(b"\x01")  # 1 MiB + 257: only the 4 length bytes have arrived
    with pytest.raises(ProtocolError) as info:
        dec.next_body()
    assert info.value.reason == "frame_too_large"
    assert str(MAX_FRAME_BODY + 1) in str(info.value)


@pytest.mark.parametrize("length", [b"\xff\xff\xff\xff", b"\x80\x00\x00\x00", b"\x01\x00\x00\x00"])
def test_huge_lengths_rejected(length: bytes) -> None:
    dec = FrameDecoder()
    dec.feed(length)
    with pytest.raises(ProtocolError) as info:
        dec.next_body()
    assert info.value.reason == "frame_too_large"


def test_oversize_after_good_frames() -> None:
    dec = FrameDecoder()
    dec.feed(MGMT_FRAMES[3][0] + b"\xff\xff\xff\xff")
    assert dec.next_body() == b"\x04"
    with pytest.raises(ProtocolError):
        dec.next_body()


def test_encode_oversize_rejected() -> None:
    with pytest.raises(ProtocolError) as info:
        encode_frame(bytes(MAX_FRAME_BODY + 1))
    assert info.value.reason == "frame_too_large"


def test_packet_frame_bound_holds_max_packet() -> None:
    """A maximal Packet (8 + 1 MiB) fits a frame, encrypted (28 more bytes) too."""
    assert 8 + 1_048_576 + 12 + 16 <= MAX_FRAME_BODY


def test_buffer_bound_while_trickling_a_max_frame() -> None:
    wire = encode_frame(b"\x01" * MAX_FRAME_BODY) + b"\x00\x00\x00\x01\x04"
    dec = FrameDecoder()
    chunk = 65536
    bodies: list[bytes] = []
    for i in range(0, len(wire), chunk):
        piece = wire[i : i + chunk]
        dec.feed(piece)
        assert dec.buffered <= MAX_FRAME + len(piece)
        bodies += drain_frames(dec)
        assert dec.buffered < MAX_FRAME
    assert [len(b) for b in bodies] == [MAX_FRAME_BODY, 1]
    assert dec.buffered == 0


def test_consumed_bytes_are_released() -> None:
    """Memory, not just ``buffered``: consumed frames must not pile up in the buffer."""
    frame = encode_frame(b"m" * 1000)
    dec = FrameDecoder()
    for _ in range(2000):
        dec.feed(frame)
        assert drain_frames(dec) == [b"m" * 1000]
        assert held_bytes(dec) <= 2 * len(frame)
    assert held_bytes(dec) > 0  # the probe does see the buffer


@given(st.lists(st.one_of(packets, mgmt_messages(MAX_CUSTOM_PIPELINE)), max_size=8), st.data())
def test_roundtrip_events_through_frames(
    events: list[Packet | MgmtMessage], data: st.DataObject
) -> None:
    bodies = [encode_packet(e) if isinstance(e, Packet) else encode_mgmt(e) for e in events]
    wire = b"".join(encode_frame(b) for b in bodies)
    dec = FrameDecoder()
    got = feed_all(data.draw(splits(wire)), dec.feed, lambda: drain_frames(dec))
    assert got == bodies
    decoded = [
        decode_packet(b) if isinstance(e, Packet) else decode_mgmt(b)
        for e, b in zip(events, got, strict=True)
    ]
    assert decoded == events
    assert dec.buffered == 0
