"""Packet: the data-frame body (docs/wire.md#packet): u32 BE call_id + u32 BE payload_size
+ payload."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from protocol_helpers import packets

from protocol import MAX_PAYLOAD, Packet, ProtocolError, decode_packet, encode_packet
from protocol.packet import PACKET_HEADER_SIZE, encode_packet_header

# call_id 7, "Hallo Welt." (11 bytes), as docs/wire.md#packet lays it out.
HALLO = b"\x00\x00\x00\x07" + b"\x00\x00\x00\x0b" + b"Hallo Welt."


def test_constants_match_wire_md() -> None:
    assert MAX_PAYLOAD == 1_048_576
    assert PACKET_HEADER_SIZE == 8


def test_encode_golden() -> None:
    assert encode_packet(Packet(7, b"Hallo Welt.")) == HALLO


def test_decode_golden() -> None:
    assert decode_packet(HALLO) == Packet(7, b"Hallo Welt.")


@pytest.mark.parametrize(
    ("wire", "packet"),
    [
        (b"\x00\x00\x00\x01\x00\x00\x00\x00", Packet(1, b"")),
        (b"\xff\xff\xff\xff\x00\x00\x00\x01\x00", Packet(0xFFFFFFFF, b"\x00")),
        (b"\x12\x34\x56\x78\x00\x00\x00\x03" + "ä!".encode(), Packet(0x12345678, "ä!".encode())),
        (b"\x00\x00\x01\x00\x00\x00\x00\x02\x0d\x0a", Packet(256, b"\r\n")),
    ],
)
def test_golden_both_ways(wire: bytes, packet: Packet) -> None:
    assert encode_packet(packet) == wire
    assert decode_packet(wire) == packet
    assert decode_packet(bytearray(wire)) == packet
    assert decode_packet(memoryview(wire)) == packet


def test_decoded_payload_is_bytes_not_a_view() -> None:
    buf = bytearray(HALLO)
    p = decode_packet(buf)
    buf[8:] = b"XXXXXXXXXXX"
    assert p.payload == b"Hallo Welt."
    assert type(p.payload) is bytes


def test_max_payload_accepted() -> None:
    payload = b"\xab" * MAX_PAYLOAD
    wire = b"\x00\x00\x00\x09\x00\x10\x00\x00" + payload
    assert encode_packet(Packet(9, payload)) == wire
    assert decode_packet(wire) == Packet(9, payload)


@pytest.mark.parametrize(
    ("wire", "reason"),
    [
        (b"", "short_packet"),
        (b"\x00\x00\x00\x01\x00\x00\x00", "short_packet"),
        (b"\x00\x00\x00\x00\x00\x00\x00\x00", "bad_call_id"),
        (b"\x00\x00\x00\x00\x00\x00\x00\x01x", "bad_call_id"),
        (b"\x00\x00\x00\x01\x00\x10\x00\x01", "payload_too_large"),  # 1 MiB + 1, rejected first
        (b"\x00\x00\x00\x01\xff\xff\xff\xff", "payload_too_large"),
        (b"\x00\x00\x00\x01\x00\x00\x00\x02x", "packet_size_mismatch"),  # short body
        (b"\x00\x00\x00\x01\x00\x00\x00\x00x", "packet_size_mismatch"),  # trailing byte
        (b"\x00\x00\x00\x01\x00\x00\x00\x01xy", "packet_size_mismatch"),
    ],
)
def test_decode_rejects(wire: bytes, reason: str) -> None:
    with pytest.raises(ProtocolError) as info:
        decode_packet(wire)
    assert info.value.reason == reason
    assert reason in str(info.value)


@pytest.mark.parametrize("call_id", [0, -1, 0x1_0000_0000, 2**40])
def test_constructor_rejects_bad_call_id(call_id: int) -> None:
    with pytest.raises(ProtocolError) as info:
        Packet(call_id, b"x")
    assert info.value.reason == "bad_call_id"


def test_constructor_rejects_oversize_payload() -> None:
    with pytest.raises(ProtocolError) as info:
        Packet(1, bytes(MAX_PAYLOAD + 1))
    assert info.value.reason == "payload_too_large"


def test_encode_packet_header() -> None:
    assert encode_packet_header(7, 11) == HALLO[:8]
    assert encode_packet_header(0xFFFFFFFF, MAX_PAYLOAD) == b"\xff\xff\xff\xff\x00\x10\x00\x00"
    with pytest.raises(ProtocolError):
        encode_packet_header(0, 1)
    with pytest.raises(ProtocolError):
        encode_packet_header(1, MAX_PAYLOAD + 1)


def test_packet_is_frozen() -> None:
    p = Packet(1, b"a")
    with pytest.raises(AttributeError):
        p.call_id = 2  # type: ignore[misc]


@given(packets)
def test_roundtrip(packet: Packet) -> None:
    wire = encode_packet(packet)
    assert len(wire) == 8 + len(packet.payload)
    assert int.from_bytes(wire[:4], "big") == packet.call_id
    assert int.from_bytes(wire[4:8], "big") == len(packet.payload)
    assert decode_packet(wire) == packet


@given(st.binary(max_size=64))
def test_arbitrary_bytes_only_protocol_error(data: bytes) -> None:
    try:
        p = decode_packet(data)
    except ProtocolError:
        return
    assert encode_packet(p) == data
