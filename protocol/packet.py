"""Packet: the body of a pipeline data frame and of an engine 0x01 frame (docs/wire.md#packet).

Rule 1: a Packet is ``u32 BE call_id`` (never 0) + ``u32 BE payload_size``
(<= 1 MiB) + payload, and the announced size must match what is there.
Rule 2: this file does not know which socket, direction or framing carried it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from protocol.errors import ProtocolError

PACKET_HEADER = struct.Struct(">II")
PACKET_HEADER_SIZE = PACKET_HEADER.size  # 8
MAX_PAYLOAD = 1_048_576  # docs/wire.md#packet: payload_size <= 1 MiB


@dataclass(frozen=True, slots=True)
class Packet:
    """One data packet: text from LLaMA, or audio from an engine."""

    call_id: int
    payload: bytes

    def __post_init__(self) -> None:
        check_packet_header(self.call_id, len(self.payload))


def check_packet_header(call_id: int, size: int) -> None:
    """Raise ``ProtocolError`` unless ``call_id``/``size`` may appear in a Packet header."""
    if call_id == 0:
        raise ProtocolError("bad_call_id", "call_id 0 is reserved")
    if not 0 < call_id <= 0xFFFFFFFF:
        raise ProtocolError("bad_call_id", f"call_id {call_id} does not fit in u32")
    if size > MAX_PAYLOAD:
        raise ProtocolError("payload_too_large", f"{size} > {MAX_PAYLOAD}")


def encode_packet_header(call_id: int, size: int) -> bytes:
    check_packet_header(call_id, size)
    return PACKET_HEADER.pack(call_id, size)


def encode_packet(packet: Packet) -> bytes:
    return PACKET_HEADER.pack(packet.call_id, len(packet.payload)) + packet.payload


def decode_packet(body: bytes | bytearray | memoryview) -> Packet:
    """Decode a complete Packet body (e.g. one pipeline data frame)."""
    if len(body) < PACKET_HEADER_SIZE:
        raise ProtocolError("short_packet", f"{len(body)} bytes < 8-byte header")
    call_id, size = PACKET_HEADER.unpack_from(body, 0)
    check_packet_header(call_id, size)
    if size != len(body) - PACKET_HEADER_SIZE:
        raise ProtocolError("packet_size_mismatch", f"header says {size}, body has {len(body) - 8}")
    return Packet(call_id, bytes(body[PACKET_HEADER_SIZE:]))
