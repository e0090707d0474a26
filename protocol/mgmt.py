"""Management messages (docs/wire.md#mgmt-messages, #engine-frames).

Rule 1: a management message is one type byte plus that type's payload:
CALL_END / SPEECH_ACTIVE / SPEECH_IDLE carry ``u32 BE call_id``; PING / PONG
carry nothing; CUSTOM carries ``u16 BE length`` + UTF-8 bytes.
Rule 2: this file does not know whether the message travels in a
length-prefixed pipeline frame or after an 0x02 tag on the engine dock; the
two framings only differ in how the end of the message is found, and in the
CUSTOM bound (pipeline: the u16 range; engine dock: 4096 bytes).
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from protocol.errors import ProtocolError

_U32 = struct.Struct(">I")
_U16 = struct.Struct(">H")

MAX_CUSTOM_PIPELINE = 0xFFFF  # u16 length on pipeline mgmt frames
MAX_CUSTOM_ENGINE = 4096  # docs/wire.md#engine-frames: CUSTOM on the engine dock is <= 4096 bytes


class MgmtType(enum.IntEnum):
    CALL_END = 1
    SPEECH_ACTIVE = 2
    SPEECH_IDLE = 3
    PING = 4
    PONG = 5
    CUSTOM = 10


@dataclass(frozen=True, slots=True)
class CallEnd:
    call_id: int


@dataclass(frozen=True, slots=True)
class SpeechActive:
    """The caller started speaking: barge-in for that call."""

    call_id: int


@dataclass(frozen=True, slots=True)
class SpeechIdle:
    """The caller stopped speaking."""

    call_id: int


@dataclass(frozen=True, slots=True)
class Ping:
    pass


@dataclass(frozen=True, slots=True)
class Pong:
    pass


@dataclass(frozen=True, slots=True)
class Custom:
    """A CUSTOM request or reply; ``data`` is the raw (UTF-8) payload, kept byte-exact."""

    data: bytes

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")

    @classmethod
    def of(cls, text: str) -> Custom:
        return cls(text.encode("utf-8"))


MgmtMessage = CallEnd | SpeechActive | SpeechIdle | Ping | Pong | Custom
CallMessage = CallEnd | SpeechActive | SpeechIdle

PING = Ping()
PONG = Pong()
SHUTDOWN = Custom(b"SHUTDOWN")
FLUSH_TTS = Custom(b"FLUSH_TTS")

_CALL_TYPES: dict[int, type[CallEnd] | type[SpeechActive] | type[SpeechIdle]] = {
    MgmtType.CALL_END: CallEnd,
    MgmtType.SPEECH_ACTIVE: SpeechActive,
    MgmtType.SPEECH_IDLE: SpeechIdle,
}
_TYPE_OF: dict[type, MgmtType] = {
    CallEnd: MgmtType.CALL_END,
    SpeechActive: MgmtType.SPEECH_ACTIVE,
    SpeechIdle: MgmtType.SPEECH_IDLE,
    Ping: MgmtType.PING,
    Pong: MgmtType.PONG,
    Custom: MgmtType.CUSTOM,
}


def _check_call_id(call_id: int) -> None:
    if not 0 < call_id <= 0xFFFFFFFF:
        raise ProtocolError("bad_call_id", f"call_id {call_id} out of range")


def encode_mgmt(msg: MgmtMessage, *, max_custom: int = MAX_CUSTOM_PIPELINE) -> bytes:
    """Type byte + payload, identical for both framings."""
    kind = _TYPE_OF[type(msg)]
    if isinstance(msg, CallEnd | SpeechActive | SpeechIdle):
        _check_call_id(msg.call_id)
        return bytes((kind,)) + _U32.pack(msg.call_id)
    if isinstance(msg, Custom):
        if len(msg.data) > max_custom:
            raise ProtocolError("custom_too_long", f"{len(msg.data)} > {max_custom}")
        return bytes((kind,)) + _U16.pack(len(msg.data)) + msg.data
    return bytes((kind,))


def mgmt_payload_size(kind: int, head: bytes | bytearray | memoryview, max_custom: int) -> int:
    """How many payload bytes follow the type byte, given at least the first 2 payload bytes
    for CUSTOM (``head``). Raises ``ProtocolError`` for an unknown type or an oversize CUSTOM.

    Returns -1 when ``head`` is too short to know yet (CUSTOM only).
    """
    if kind in _CALL_TYPES:
        return 4
    if kind in (MgmtType.PING, MgmtType.PONG):
        return 0
    if kind == MgmtType.CUSTOM:
        if len(head) < 2:
            return -1
        (length,) = _U16.unpack_from(head, 0)
        if length > max_custom:
            raise ProtocolError("custom_too_long", f"{length} > {max_custom}")
        return 2 + length
    raise ProtocolError("unknown_mgmt_type", f"type {kind}")


def decode_mgmt_payload(kind: int, payload: bytes | bytearray | memoryview) -> MgmtMessage:
    """Build the message for type ``kind`` from exactly its payload bytes."""
    call_type = _CALL_TYPES.get(kind)
    if call_type is not None:
        if len(payload) != 4:
            raise ProtocolError("bad_mgmt_length", f"type {kind} needs 4 bytes, got {len(payload)}")
        (call_id,) = _U32.unpack_from(payload, 0)
        _check_call_id(call_id)
        return call_type(call_id)
    if kind == MgmtType.PING:
        if len(payload):
            raise ProtocolError("bad_mgmt_length", "PING carries no payload")
        return PING
    if kind == MgmtType.PONG:
        if len(payload):
            raise ProtocolError("bad_mgmt_length", "PONG carries no payload")
        return PONG
    if kind == MgmtType.CUSTOM:
        if len(payload) < 2:
            raise ProtocolError("bad_mgmt_length", "CUSTOM without u16 length")
        (length,) = _U16.unpack_from(payload, 0)
        if length != len(payload) - 2:
            raise ProtocolError(
                "bad_mgmt_length", f"CUSTOM says {length} bytes, has {len(payload) - 2}"
            )
        return Custom(bytes(payload[2:]))
    raise ProtocolError("unknown_mgmt_type", f"type {kind}")


def decode_mgmt(body: bytes | bytearray | memoryview) -> MgmtMessage:
    """Decode a complete pipeline mgmt frame body (type byte + payload)."""
    if not body:
        raise ProtocolError("empty_mgmt", "mgmt frame without a type byte")
    return decode_mgmt_payload(body[0], memoryview(body)[1:])
