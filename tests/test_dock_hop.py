"""The audio hop core (``ttsdock.hop``) without sockets: every counter, plain and encrypted."""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.audio import encode_audio_header
from protocol.framing import FrameCipher, FrameDecoder, NeedData
from protocol.packet import Packet, decode_packet
from ttsdock.hop import PAUSE_ENGINE, RESUME_ENGINE, AudioHop, Dropped, Write
from ttsdock.stats import Stats

KEY = os.urandom(32)
T0 = 1000.0  # seconds (monotonic), passed in: the core reads no clock


def payload(samples: int = 480, t_s: float = T0) -> bytes:
    return encode_audio_header(int(t_s * 1e6)) + b"\x00\x00\x80\x3e" * samples


def make(encrypted: bool, queue_bytes: int = 1 << 20) -> tuple[AudioHop, FrameCipher | None]:
    cipher = FrameCipher(KEY) if encrypted else None
    hop = AudioHop(Stats(), cipher.seal if cipher else None, queue_bytes, queue_seconds=1.0)
    return hop, cipher


def decode(parts: list[bytes], cipher: FrameCipher | None) -> list[Packet]:
    dec = FrameDecoder()
    dec.feed(b"".join(parts))
    out = []
    while not isinstance(body := dec.next_body(), NeedData):
        out.append(decode_packet(cipher.open(body) if cipher else body))
    return out


both = pytest.mark.parametrize("encrypted", [False, True], ids=["plain", "encrypted"])


@both
def test_forward_counts_payload_bytes_once(encrypted: bool) -> None:
    hop, cipher = make(encrypted)
    hop.oap_connected(T0)
    p1, p2 = payload(480), payload(4800)
    assert hop.audio(3, p1, True, T0 + 0.001) is None
    assert hop.audio(4, p2, True, T0 + 0.002) is None
    assert hop.stats.audio_frames_out == 0  # counted when handed to OAP, not before
    w = hop.end_of_read(True, T0 + 0.002)
    assert isinstance(w, Write)
    assert decode(w.parts, cipher) == [Packet(3, p1), Packet(4, p2)]
    s = hop.stats
    assert (s.audio_frames_in, s.audio_frames_out) == (2, 2)
    # payload bytes both ways, whatever the framing (was len(frame) - 12: +28 encrypted)
    assert s.audio_bytes_in == s.audio_bytes_out == len(p1) + len(p2)
    assert sum(s.drops.values()) == 0
    assert hop.end_of_read(True, T0) is None  # nothing collected since


@both
def test_hop_latency_recorded(encrypted: bool) -> None:
    hop, _ = make(encrypted)
    hop.oap_connected(T0)
    hop.audio(3, payload(t_s=T0), True, T0 + 0.000250)
    hop.audio(3, payload(t_s=T0 + 5), True, T0)  # stamp in the future: not a sample
    assert list(hop.stats.hop_us) == [250]
    assert hop.stats.hop_count == 1 and hop.stats.hop_max_us == 250


@both
def test_stale_engine_dropped_once(encrypted: bool) -> None:
    hop, _ = make(encrypted)
    hop.oap_connected(T0)
    assert hop.audio(3, payload(), False, T0) == Dropped(3, "stale_engine")
    assert hop.end_of_read(True, T0) is None
    s = hop.stats
    assert (s.audio_frames_in, s.audio_frames_out, s.drops["stale_engine"]) == (1, 0, 1)


@pytest.mark.parametrize(
    "bad",
    [b"short", encode_audio_header(1, 16000) + b"\0" * 4, encode_audio_header(1) + b"\0" * 5],
    ids=["short_header", "bad_rate", "ragged"],
)
def test_bad_audio_dropped(bad: bytes) -> None:
    hop, _ = make(False)
    hop.oap_connected(T0)
    d = hop.audio(3, bad, True, T0)
    assert d is not None and d.reason == "bad_audio"
    assert hop.stats.drops["bad_audio"] == 1 and hop.end_of_read(True, T0) is None


@both
def test_oversize_forwarded_and_counted(encrypted: bool) -> None:
    hop, cipher = make(encrypted)
    hop.oap_connected(T0)
    big = payload(4801)
    assert hop.audio(3, big, True, T0) is None
    w = hop.end_of_read(True, T0)
    assert w is not None and decode(w.parts, cipher) == [Packet(3, big)]
    assert hop.stats.audio_oversize == 1 and hop.stats.audio_frames_out == 1


@both
def test_queued_while_oap_down_then_sent_once(encrypted: bool) -> None:
    hop, cipher = make(encrypted)
    p = payload()
    assert hop.audio(3, p, True, T0) is None
    assert hop.end_of_read(False, T0) is None
    assert len(hop.pending) == 1 and hop.pending_bytes > len(p)
    assert hop.stats.audio_frames_out == 0
    (w,) = hop.oap_connected(T0 + 0.5)
    assert isinstance(w, Write) and decode(w.parts, cipher) == [Packet(3, p)]
    s = hop.stats
    assert (s.audio_frames_out, s.audio_bytes_out) == (1, len(p))
    assert hop.pending_bytes == 0 and sum(s.drops.values()) == 0


@both
def test_oap_closed_within_a_read_requeues_not_double_counts(encrypted: bool) -> None:
    hop, cipher = make(encrypted)
    hop.oap_connected(T0)
    p = payload(4800)
    hop.audio(3, p, True, T0)
    hop.audio(4, p, True, T0)
    assert hop.end_of_read(False, T0) is None  # the transport closed during this read
    s = hop.stats
    assert s.audio_frames_out == 0 and sum(s.drops.values()) == 0 and len(hop.pending) == 2
    (w,) = hop.oap_connected(T0 + 0.1)
    assert isinstance(w, Write) and decode(w.parts, cipher) == [Packet(3, p), Packet(4, p)]
    assert (s.audio_frames_out, s.audio_bytes_out) == (2, 2 * len(p))


@both
def test_queue_bounds_drop_counted(encrypted: bool) -> None:
    hop, _ = make(encrypted, queue_bytes=3 * 2000)
    p = payload(480)  # ~1.9 KB on the wire
    results = [hop.audio(3, p, True, T0) for _ in range(4)]
    assert results[:3] == [None] * 3 and results[3] == Dropped(3, "oap_down")
    assert hop.stats.drops["oap_down"] == 1
    # stale after queue_seconds: dropped at reconnect, counted
    assert hop.oap_connected(T0 + 1.5) == []
    assert hop.stats.drops["oap_queue_stale"] == 3 and hop.stats.audio_frames_out == 0


def test_flush_drops_queue_counted() -> None:
    hop, _ = make(False)
    for _ in range(3):
        hop.audio(3, payload(), True, T0)
    assert hop.flush() == 3
    assert hop.stats.drops["oap_queue_flushed"] == 3 and hop.pending_bytes == 0
    assert hop.oap_connected(T0) == []


def test_back_pressure_state() -> None:
    hop, _ = make(False)
    assert hop.oap_write_paused() == []  # OAP not up: nothing to pause for
    hop.oap_connected(T0)
    assert hop.oap_write_paused() == [PAUSE_ENGINE]
    assert hop.oap_write_paused() == []  # already paused
    assert hop.engine_paused and hop.stats.engine_read_pauses == 1
    assert hop.oap_write_resumed() == [RESUME_ENGINE]
    assert hop.oap_write_resumed() == []
    assert hop.oap_write_paused() == [PAUSE_ENGINE]
    # OAP lost while paused: the engine is read again (its audio queues, bounded)
    assert hop.oap_disconnected() == [RESUME_ENGINE]
    assert not hop.engine_paused and hop.stats.engine_read_pauses == 2


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 4801), st.booleans()), max_size=40))
def test_every_frame_accounted_for(ops: list[tuple[bool, int, bool]]) -> None:
    """frames in = frames out + drops + still queued, whatever happens to OAP."""
    hop, _ = make(True, queue_bytes=60_000)
    now = T0
    for current, samples, oap_ok in ops:
        now += 0.01
        if oap_ok and not hop.oap_up:
            hop.oap_connected(now)
        hop.audio(7, payload(samples, now), current, now)
        hop.end_of_read(oap_ok, now)
        if not oap_ok:
            hop.oap_disconnected()
    s = hop.stats
    assert s.audio_frames_in == s.audio_frames_out + sum(s.drops.values()) + len(hop.pending)
    assert s.audio_bytes_out <= s.audio_bytes_in
