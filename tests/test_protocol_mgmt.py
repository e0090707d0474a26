"""Mgmt messages (docs/wire.md#mgmt-messages): type byte + that type's payload.

The bodies here are the pipeline framing's frame bodies; the length-prefixed
pipeline frames and the 0x02 engine frames built from them are in
test_protocol_framing.py and test_protocol_engine_frames.py.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from protocol_helpers import mgmt_messages

from protocol import (
    FLUSH_TTS,
    PING,
    PONG,
    SHUTDOWN,
    CallEnd,
    Custom,
    MgmtMessage,
    MgmtType,
    Ping,
    Pong,
    ProtocolError,
    SpeechActive,
    SpeechIdle,
    decode_mgmt,
    encode_mgmt,
)
from protocol.mgmt import MAX_CUSTOM_ENGINE, MAX_CUSTOM_PIPELINE

# Every mgmt body of docs/wire.md#mgmt-messages, written out by hand.
GOLDEN: list[tuple[bytes, MgmtMessage]] = [
    (b"\x01\x00\x00\x00\x2a", CallEnd(42)),
    (b"\x01\xff\xff\xff\xff", CallEnd(0xFFFFFFFF)),
    (b"\x02\x01\x02\x03\x04", SpeechActive(0x01020304)),
    (b"\x02\x00\x00\x00\x01", SpeechActive(1)),
    (b"\x03\x00\x00\x00\x01", SpeechIdle(1)),
    (b"\x03\x00\x00\x30\x39", SpeechIdle(12345)),
    (b"\x04", Ping()),
    (b"\x05", Pong()),
    (b"\x0a\x00\x00", Custom(b"")),
    (b"\x0a\x00\x08SHUTDOWN", Custom(b"SHUTDOWN")),
    (b"\x0a\x00\x09FLUSH_TTS", Custom(b"FLUSH_TTS")),
    (b"\x0a\x00\x07Gr\xc3\xbc\xc3\x9fe", Custom("Grüße".encode())),
]


def test_type_values_match_wire_md() -> None:
    assert [(t.name, int(t)) for t in MgmtType] == [
        ("CALL_END", 1),
        ("SPEECH_ACTIVE", 2),
        ("SPEECH_IDLE", 3),
        ("PING", 4),
        ("PONG", 5),
        ("CUSTOM", 10),
    ]
    assert MAX_CUSTOM_ENGINE == 4096
    assert MAX_CUSTOM_PIPELINE == 0xFFFF


def test_named_singletons() -> None:
    assert PING == Ping()
    assert PONG == Pong()
    assert SHUTDOWN == Custom(b"SHUTDOWN")
    assert FLUSH_TTS == Custom(b"FLUSH_TTS")
    assert Ping() != Pong()


@pytest.mark.parametrize(("wire", "msg"), GOLDEN)
def test_encode_golden(wire: bytes, msg: MgmtMessage) -> None:
    assert encode_mgmt(msg) == wire
    assert encode_mgmt(msg, max_custom=MAX_CUSTOM_ENGINE) == wire


@pytest.mark.parametrize(("wire", "msg"), GOLDEN)
def test_decode_golden(wire: bytes, msg: MgmtMessage) -> None:
    assert decode_mgmt(wire) == msg
    assert decode_mgmt(bytearray(wire)) == msg
    assert decode_mgmt(memoryview(wire)) == msg


def test_custom_text_helpers() -> None:
    assert Custom.of("FLUSH_TTS") == FLUSH_TTS
    assert Custom.of("Grüße").data == b"Gr\xc3\xbc\xc3\x9fe"
    assert Custom.of("Grüße").text == "Grüße"
    # bytes are kept exact even when they are not UTF-8; text degrades gracefully
    bad = decode_mgmt(b"\x0a\x00\x02\xff\xfe")
    assert bad == Custom(b"\xff\xfe")
    assert isinstance(bad, Custom)
    assert bad.text == "\ufffd\ufffd"


def test_custom_decoded_data_is_bytes() -> None:
    msg = decode_mgmt(bytearray(b"\x0a\x00\x02ok"))
    assert isinstance(msg, Custom)
    assert type(msg.data) is bytes


def test_custom_pipeline_bound() -> None:
    big = Custom(b"x" * 0xFFFF)
    wire = encode_mgmt(big)
    assert wire[:3] == b"\x0a\xff\xff"
    assert decode_mgmt(wire) == big
    with pytest.raises(ProtocolError) as info:
        encode_mgmt(Custom(b"x" * 0x10000))
    assert info.value.reason == "custom_too_long"


def test_custom_engine_bound_on_encode() -> None:
    assert encode_mgmt(Custom(b"y" * 4096), max_custom=MAX_CUSTOM_ENGINE)[:3] == b"\x0a\x10\x00"
    with pytest.raises(ProtocolError) as info:
        encode_mgmt(Custom(b"y" * 4097), max_custom=MAX_CUSTOM_ENGINE)
    assert info.value.reason == "custom_too_long"


@pytest.mark.parametrize("msg", [CallEnd(0), SpeechActive(0), SpeechIdle(2**32), CallEnd(-5)])
def test_encode_rejects_bad_call_id(msg: MgmtMessage) -> None:
    with pytest.raises(ProtocolError) as info:
        encode_mgmt(msg)
    assert info.value.reason == "bad_call_id"


@pytest.mark.parametrize(
    ("wire", "reason"),
    [
        (b"", "empty_mgmt"),
        (b"\x00", "unknown_mgmt_type"),
        (b"\x06", "unknown_mgmt_type"),
        (b"\x09\x00\x00", "unknown_mgmt_type"),
        (b"\x0b", "unknown_mgmt_type"),
        (b"\xff\x00\x00\x00\x01", "unknown_mgmt_type"),
        (b"\x01", "bad_mgmt_length"),
        (b"\x01\x00\x00\x01", "bad_mgmt_length"),
        (b"\x02\x00\x00\x00\x01\x00", "bad_mgmt_length"),
        (b"\x01\x00\x00\x00\x00", "bad_call_id"),
        (b"\x02\x00\x00\x00\x00", "bad_call_id"),
        (b"\x03\x00\x00\x00\x00", "bad_call_id"),
        (b"\x04\x00", "bad_mgmt_length"),
        (b"\x05\x05", "bad_mgmt_length"),
        (b"\x0a", "bad_mgmt_length"),
        (b"\x0a\x00", "bad_mgmt_length"),
        (b"\x0a\x00\x05abc", "bad_mgmt_length"),
        (b"\x0a\x00\x01ab", "bad_mgmt_length"),
        (b"\x0a\x00\x00x", "bad_mgmt_length"),
    ],
)
def test_decode_rejects(wire: bytes, reason: str) -> None:
    with pytest.raises(ProtocolError) as info:
        decode_mgmt(wire)
    assert info.value.reason == reason


def test_unknown_type_names_the_type() -> None:
    with pytest.raises(ProtocolError, match="type 6"):
        decode_mgmt(b"\x06")


@given(mgmt_messages(max_custom=MAX_CUSTOM_PIPELINE))
def test_roundtrip(msg: MgmtMessage) -> None:
    wire = encode_mgmt(msg)
    assert (
        wire[0]
        == {
            CallEnd: 1,
            SpeechActive: 2,
            SpeechIdle: 3,
            Ping: 4,
            Pong: 5,
            Custom: 10,
        }[type(msg)]
    )
    assert decode_mgmt(wire) == msg


@given(st.binary(max_size=40))
def test_arbitrary_bytes_only_protocol_error(data: bytes) -> None:
    try:
        msg = decode_mgmt(data)
    except ProtocolError:
        return
    assert encode_mgmt(msg) == data


@given(st.sampled_from([1, 2, 3, 4, 5, 10]), st.binary(max_size=12))
def test_known_type_arbitrary_payload(kind: int, rest: bytes) -> None:
    try:
        msg = decode_mgmt(bytes([kind]) + rest)
    except ProtocolError:
        return
    assert encode_mgmt(msg) == bytes([kind]) + rest
