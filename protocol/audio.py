"""Audio payload carried in Packets from engine to dock to OAP (docs/wire.md#audio-payload).

Rule 1: ``i32`` sample rate in host order (little-endian on every supported
host), ``u64 BIG-endian`` t_engine_out_us, then at most 4800 float32 LE samples.
Rule 2: this file does not decode PCM or read clocks; the engine stamps the
time, the dock only checks the header.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from protocol.errors import ProtocolError

AUDIO_SAMPLE_RATE = 24000
AUDIO_HEADER_SIZE = 12
MAX_SAMPLES_PER_PACKET = 4800  # 200 ms at 24 kHz
MAX_AUDIO_PAYLOAD = AUDIO_HEADER_SIZE + 4 * MAX_SAMPLES_PER_PACKET
_RATE = struct.Struct("<i")
_T_US = struct.Struct(">Q")


@dataclass(frozen=True, slots=True)
class AudioHeader:
    sample_rate: int
    t_engine_out_us: int


def encode_audio_header(t_engine_out_us: int, sample_rate: int = AUDIO_SAMPLE_RATE) -> bytes:
    return _RATE.pack(sample_rate) + _T_US.pack(t_engine_out_us & 0xFFFFFFFFFFFFFFFF)


def decode_audio_header(payload: bytes | bytearray | memoryview) -> AudioHeader:
    if len(payload) < AUDIO_HEADER_SIZE:
        raise ProtocolError("short_audio", f"{len(payload)} < 12-byte header")
    (rate,) = _RATE.unpack_from(payload, 0)
    (t_us,) = _T_US.unpack_from(payload, 4)
    return AudioHeader(rate, t_us)


def inspect_audio_payload(payload: bytes | bytearray | memoryview) -> tuple[AudioHeader, int]:
    """Header and sample count of an audio payload, without touching its PCM and without
    the 4800-sample limit (the dock forwards oversize packets, as the reference does, and
    only counts them). Raises ``ProtocolError`` on a short header, a sample rate other
    than 24 kHz, or PCM that is not whole float32 samples."""
    header = decode_audio_header(payload)
    if header.sample_rate != AUDIO_SAMPLE_RATE:
        raise ProtocolError("bad_sample_rate", f"{header.sample_rate}")
    pcm = len(payload) - AUDIO_HEADER_SIZE
    if pcm % 4:
        raise ProtocolError("ragged_pcm", f"{pcm} PCM bytes is not whole float32 samples")
    return header, pcm // 4


def check_audio_payload(payload: bytes | bytearray | memoryview) -> AudioHeader:
    """Validate an engine audio payload without touching its PCM. Raises ``ProtocolError``."""
    header, samples = inspect_audio_payload(payload)
    if samples > MAX_SAMPLES_PER_PACKET:
        raise ProtocolError("too_many_samples", f"{samples} > {MAX_SAMPLES_PER_PACKET}")
    return header


def audio_t_us(payload: bytes | bytearray | memoryview) -> int:
    """Fast path for hop latency: the big-endian timestamp at bytes 4..12."""
    if len(payload) < AUDIO_HEADER_SIZE:
        raise ProtocolError("short_audio", f"{len(payload)} < 12-byte header")
    return int(_T_US.unpack_from(payload, 4)[0])
