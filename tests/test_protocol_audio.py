"""Audio payload (docs/wire.md#audio-payload): i32 LE sample rate, u64 BE t_engine_out_us,
<= 4800 f32 LE samples."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol import (
    AUDIO_HEADER_SIZE,
    AUDIO_SAMPLE_RATE,
    MAX_PAYLOAD,
    MAX_SAMPLES_PER_PACKET,
    AudioHeader,
    ProtocolError,
    audio_t_us,
    check_audio_payload,
    decode_audio_header,
    encode_audio_header,
)
from protocol.audio import MAX_AUDIO_PAYLOAD

RATE_LE = b"\xc0\x5d\x00\x00"  # 24000 = 0x5dc0, i32 little-endian
T_BE = b"\x01\x02\x03\x04\x05\x06\x07\x08"  # u64 big-endian
HEADER = RATE_LE + T_BE
ONE_F32 = b"\x00\x00\x80\x3f"  # 1.0
MINUS_HALF_F32 = b"\x00\x00\x00\xbf"  # -0.5


def test_constants() -> None:
    assert AUDIO_SAMPLE_RATE == 24000
    assert AUDIO_HEADER_SIZE == 12
    assert MAX_SAMPLES_PER_PACKET == 4800
    assert MAX_AUDIO_PAYLOAD == 12 + 4 * 4800 <= MAX_PAYLOAD


def test_encode_header_golden() -> None:
    assert encode_audio_header(0x0102030405060708) == HEADER
    assert encode_audio_header(0) == RATE_LE + bytes(8)
    assert encode_audio_header(1000) == RATE_LE + b"\x00\x00\x00\x00\x00\x00\x03\xe8"
    assert encode_audio_header(2**64 - 1) == RATE_LE + b"\xff" * 8
    assert encode_audio_header(5, sample_rate=16000) == b"\x80\x3e\x00\x00" + bytes(7) + b"\x05"


def test_decode_header_golden() -> None:
    assert decode_audio_header(HEADER) == AudioHeader(24000, 0x0102030405060708)
    assert decode_audio_header(HEADER + ONE_F32) == AudioHeader(24000, 0x0102030405060708)
    assert decode_audio_header(bytearray(HEADER)) == AudioHeader(24000, 0x0102030405060708)
    assert decode_audio_header(memoryview(HEADER)) == AudioHeader(24000, 0x0102030405060708)


def test_audio_t_us_golden() -> None:
    assert audio_t_us(HEADER) == 0x0102030405060708
    assert audio_t_us(HEADER + ONE_F32 + MINUS_HALF_F32) == 0x0102030405060708


def test_sample_bytes_are_f32_le() -> None:
    assert struct.pack("<2f", 1.0, -0.5) == ONE_F32 + MINUS_HALF_F32


def test_check_accepts() -> None:
    assert check_audio_payload(HEADER) == AudioHeader(24000, 0x0102030405060708)
    assert check_audio_payload(HEADER + ONE_F32 + MINUS_HALF_F32).sample_rate == 24000
    assert check_audio_payload(HEADER + ONE_F32 * 4800).t_engine_out_us == 0x0102030405060708


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"", "short_audio"),
        (HEADER[:11], "short_audio"),
        (b"\x80\x3e\x00\x00" + T_BE, "bad_sample_rate"),  # 16000
        (b"\x00\x00\x5d\xc0" + T_BE, "bad_sample_rate"),  # 24000 written big-endian
        (HEADER + b"\x00", "ragged_pcm"),
        (HEADER + ONE_F32 + b"\x00\x00\x80", "ragged_pcm"),
        (HEADER + ONE_F32 * 4801, "too_many_samples"),
    ],
)
def test_check_rejects(payload: bytes, reason: str) -> None:
    with pytest.raises(ProtocolError) as info:
        check_audio_payload(payload)
    assert info.value.reason == reason


@pytest.mark.parametrize("payload", [b"", b"\xc0\x5d", HEADER[:11]])
def test_short_payloads(payload: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_audio_header(payload)
    with pytest.raises(ProtocolError):
        audio_t_us(payload)


@given(st.integers(-(2**31), 2**31 - 1), st.integers(0, 2**64 - 1))
def test_header_roundtrip(rate: int, t_us: int) -> None:
    wire = encode_audio_header(t_us, sample_rate=rate)
    assert len(wire) == 12
    assert wire[:4] == rate.to_bytes(4, "little", signed=True)
    assert wire[4:] == t_us.to_bytes(8, "big")
    assert decode_audio_header(wire) == AudioHeader(rate, t_us)
    assert audio_t_us(wire) == t_us


@given(st.integers(0, 2**64 - 1), st.integers(0, MAX_SAMPLES_PER_PACKET))
def test_check_roundtrip(t_us: int, n: int) -> None:
    payload = encode_audio_header(t_us) + ONE_F32 * n
    assert check_audio_payload(payload) == AudioHeader(24000, t_us)


@given(st.binary(max_size=64))
def test_arbitrary_bytes_only_protocol_error(data: bytes) -> None:
    try:
        h = check_audio_payload(data)
    except ProtocolError:
        pass
    else:
        assert h.sample_rate == 24000
        assert (len(data) - 12) % 4 == 0
    try:
        audio_t_us(data)
    except ProtocolError:
        assert len(data) < 12


@given(st.integers(0, 2000).map(lambda n: HEADER + b"\x00" * n))
def test_check_with_valid_header_any_length(payload: bytes) -> None:
    try:
        check_audio_payload(payload)
    except ProtocolError as exc:
        assert exc.reason in ("ragged_pcm", "too_many_samples")
