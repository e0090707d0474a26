"""Engine dock frame stream after ``OK`` (docs/wire.md#engine-frames), both directions.

Rule 1: ``0x01`` + Packet (8-byte header + payload) or ``0x02`` + mgmt type
byte + that type's payload; there is no length prefix, so the decoder must
know every type's size; any other tag, or an unknown mgmt type, is fatal.
Rule 2: this file does not know which side it runs on: the dock and every
engine use the same encoder and decoder.
"""

from __future__ import annotations

import struct

from protocol.errors import ProtocolError
from protocol.framing import NEED_DATA, NeedData, ReceiveBuffer
from protocol.mgmt import (
    MAX_CUSTOM_ENGINE,
    MgmtMessage,
    decode_mgmt_payload,
    encode_mgmt,
    mgmt_payload_size,
)
from protocol.packet import MAX_PAYLOAD, PACKET_HEADER, Packet, check_packet_header

TAG_PACKET = 0x01
TAG_MGMT = 0x02
_PKT_HDR = struct.Struct(">BII")  # tag, call_id, payload_size

EngineEvent = Packet | MgmtMessage


def encode_engine_packet_header(call_id: int, size: int) -> bytes:
    """``0x01`` + Packet header: write it followed by ``size`` payload bytes (no copy)."""
    check_packet_header(call_id, size)
    return _PKT_HDR.pack(TAG_PACKET, call_id, size)


def encode_engine_frame(event: EngineEvent) -> bytes:
    if isinstance(event, Packet):
        return _PKT_HDR.pack(TAG_PACKET, event.call_id, len(event.payload)) + event.payload
    return bytes((TAG_MGMT,)) + encode_mgmt(event, max_custom=MAX_CUSTOM_ENGINE)


class EngineFrameDecoder(ReceiveBuffer):
    """Incremental decoder for the tagged stream: ``feed``, then ``next_event`` until NEED_DATA.

    Bounded: it never buffers more than one maximal frame (1 + 8 + 1 MiB) plus
    what one ``feed`` brought (see ``ReceiveBuffer``).
    """

    __slots__ = ()

    def next_event(self) -> EngineEvent | NeedData:
        buf, pos = self._buf, self._pos
        avail = len(buf) - pos
        if avail < 1:
            return NEED_DATA
        tag = buf[pos]
        if tag == TAG_PACKET:
            if avail < 9:
                return NEED_DATA
            call_id, size = PACKET_HEADER.unpack_from(buf, pos + 1)
            if call_id == 0:
                raise ProtocolError("bad_call_id", "call_id 0 is reserved")
            if size > MAX_PAYLOAD:
                raise ProtocolError("payload_too_large", f"{size} > {MAX_PAYLOAD}")
            end = pos + 9 + size
            if len(buf) < end:
                return NEED_DATA
            payload = bytes(buf[pos + 9 : end])
            self._pos = end
            return Packet(call_id, payload)
        if tag == TAG_MGMT:
            if avail < 2:
                return NEED_DATA
            kind = buf[pos + 1]
            # Slices copy (<= 4098 bytes): a memoryview of ``_buf`` kept alive by a raised
            # error's traceback would make the next ``feed`` fail with BufferError.
            n = mgmt_payload_size(kind, buf[pos + 2 : pos + 4], MAX_CUSTOM_ENGINE)
            if n < 0 or avail < 2 + n:
                return NEED_DATA
            msg = decode_mgmt_payload(kind, buf[pos + 2 : pos + 2 + n])
            self._pos = pos + 2 + n
            return msg
        raise ProtocolError("unknown_tag", f"tag 0x{tag:02x}")
