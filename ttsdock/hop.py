"""The audio hop: engine audio Packets to OAP data, as bytes (PCM never decoded).

Rule 1: everything that decides what becomes of one audio Packet lives here: collected
for OAP (one ``writelines`` per engine read), queued while OAP data is down, or dropped
(and why); the back-pressure state (whether the active engine's socket must not be read
because OAP's write buffer is above its high-water mark); the per-reason counters and
the hop latency.
Rule 2: this file reads no clock and knows no sockets: the shell passes ``now`` and
reports OAP's connection and write-buffer events; every method returns what the shell
must do (``Write`` these bytes to OAP, ``PAUSE_ENGINE`` / ``RESUME_ENGINE`` reading).

Loss rule: the active engine's audio is never dropped while OAP data is connected: when
OAP's transport passes its high-water mark the shell reports ``oap_write_paused``, the
hop answers ``PAUSE_ENGINE`` and TCP carries the pressure back to the engine, as the
reference's blocking writes do. Memory per engine stays bounded by the high-water mark
plus one socket read. Drops remain only where nobody can play the audio: frames of a
replaced engine (``stale_engine``), audio while OAP data is down beyond the queue bounds
(``oap_down``, ``oap_queue_stale``), the queue flushed on a swap (``oap_queue_flushed``),
and payloads whose audio header is malformed (``bad_audio``).

Counting rule: ``audio_frames_out`` / ``audio_bytes_out`` count what was handed to OAP's
transport, once, when it is handed over; bytes are payload bytes (12-byte audio header +
PCM), the same measure as ``audio_bytes_in`` whatever the framing or encryption.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from protocol.audio import MAX_SAMPLES_PER_PACKET, audio_t_us, inspect_audio_payload
from protocol.errors import ProtocolError
from protocol.framing import IV_SIZE, LENGTH, TAG_SIZE
from protocol.packet import PACKET_HEADER
from ttsdock.stats import Stats

_PLAIN_HDR = struct.Struct(">III")  # frame length, call_id, payload_size


@dataclass(frozen=True, slots=True)
class Write:
    """Write ``parts`` to OAP data with one ``writelines``."""

    parts: list[bytes]


@dataclass(frozen=True, slots=True)
class PauseEngine:
    """Stop reading the active engine's socket (OAP's write buffer is above high water)."""


@dataclass(frozen=True, slots=True)
class ResumeEngine:
    """Read the active engine's socket again."""


@dataclass(frozen=True, slots=True)
class Dropped:
    """One audio Packet dropped; the shell logs it (rate-limited WARN)."""

    call_id: int
    reason: str
    detail: str = ""


PAUSE_ENGINE = PauseEngine()
RESUME_ENGINE = ResumeEngine()
HopAction = Write | PauseEngine | ResumeEngine


class AudioHop:
    __slots__ = (
        "_batch",
        "_batch_bytes",
        "_batch_frames",
        "engine_paused",
        "oap_up",
        "pending",
        "pending_bytes",
        "queue_bytes",
        "queue_seconds",
        "seal",
        "stats",
    )

    def __init__(
        self,
        stats: Stats,
        seal: Callable[[bytes], bytes] | None,
        queue_bytes: int,
        queue_seconds: float,
    ) -> None:
        self.stats = stats
        self.seal = seal  # AES-GCM body sealing towards OAP, or None (plain)
        self.queue_bytes = queue_bytes  # wire bytes queued while OAP data is down, at most
        self.queue_seconds = queue_seconds  # queued audio older than this is stale
        self.oap_up = False
        self.engine_paused = False  # the active engine's reading is paused by us
        # collected during one engine read: wire parts, their frames and payload bytes
        self._batch: list[bytes] = []
        self._batch_frames = 0
        self._batch_bytes = 0
        # while OAP data is down: (queued at, payload bytes, wire bytes), oldest first
        self.pending: deque[tuple[float, int, bytes]] = deque()
        self.pending_bytes = 0  # wire bytes in ``pending``

    # ------------------------------------------------------------------ engine side
    def audio(self, call_id: int, payload: bytes, current: bool, now: float) -> Dropped | None:
        """One audio Packet read from an engine (``current``: of the active generation)."""
        stats = self.stats
        n = len(payload)
        stats.audio_frames_in += 1
        stats.audio_bytes_in += n
        if not current:
            stats.drops["stale_engine"] += 1
            return Dropped(call_id, "stale_engine")
        try:
            _, samples = inspect_audio_payload(payload)
        except ProtocolError as exc:
            stats.drops["bad_audio"] += 1
            return Dropped(call_id, "bad_audio", f"{exc.reason}: {exc.detail}")
        if samples > MAX_SAMPLES_PER_PACKET:
            stats.audio_oversize += 1  # forwarded all the same, as the reference does
        if self.seal is None:
            parts = [_PLAIN_HDR.pack(n + 8, call_id, n), payload]
        else:
            sealed = self.seal(PACKET_HEADER.pack(call_id, n) + payload)
            parts = [LENGTH.pack(len(sealed)), sealed]
        if self.oap_up:
            self._batch += parts
            self._batch_frames += 1
            self._batch_bytes += n
            hop = int(now * 1e6) - audio_t_us(payload)
            if hop >= 0:
                stats.add_hop(hop)
            return None
        return self._queue(call_id, n, b"".join(parts), now)

    def end_of_read(self, oap_writable: bool, now: float) -> Write | None:
        """The engine read is done: what was collected goes to OAP in one write. When OAP's
        transport closed within this read, the frames are queued instead (never lost
        silently, never counted twice)."""
        if not self._batch_frames:
            return None
        batch, frames, nbytes = self._batch, self._batch_frames, self._batch_bytes
        self._batch, self._batch_frames, self._batch_bytes = [], 0, 0
        if oap_writable:
            self.stats.audio_frames_out += frames
            self.stats.audio_bytes_out += nbytes
            return Write(batch)
        # OAP went away during this read: re-queue the frames as if it had been down
        self.oap_up = False
        for i in range(0, len(batch), 2):
            wire = batch[i] + batch[i + 1]
            self._queue(0, _payload_size(wire, self.seal is not None), wire, now)
        return None

    def _queue(self, call_id: int, n: int, wire: bytes, now: float) -> Dropped | None:
        if self.pending_bytes + len(wire) > self.queue_bytes:
            self.stats.drops["oap_down"] += 1
            return Dropped(call_id, "oap_down")
        self.pending.append((now, n, wire))
        self.pending_bytes += len(wire)
        return None

    # ------------------------------------------------------------------ OAP side
    def oap_connected(self, now: float) -> list[HopAction]:
        """OAP data is (back) up: send the queue, unless stale (``queue_seconds``)."""
        self.oap_up = True
        limit = now - self.queue_seconds
        parts: list[bytes] = []
        stats = self.stats
        while self.pending:
            ts, n, wire = self.pending.popleft()
            self.pending_bytes -= len(wire)
            if ts < limit:
                stats.drops["oap_queue_stale"] += 1
                continue
            parts.append(wire)
            stats.audio_frames_out += 1
            stats.audio_bytes_out += n
        return [Write(parts)] if parts else []

    def oap_disconnected(self) -> list[HopAction]:
        """OAP data is gone: audio queues (bounded) from now on; the engine reads again."""
        self.oap_up = False
        return self._resume()

    def oap_write_paused(self) -> list[HopAction]:
        """OAP's write buffer passed the high-water mark."""
        if self.engine_paused or not self.oap_up:
            return []
        self.engine_paused = True
        self.stats.engine_read_pauses += 1
        return [PAUSE_ENGINE]

    def oap_write_resumed(self) -> list[HopAction]:
        """OAP's write buffer fell below the low-water mark."""
        return self._resume()

    def _resume(self) -> list[HopAction]:
        if not self.engine_paused:
            return []
        self.engine_paused = False
        return [RESUME_ENGINE]

    def flush(self) -> int:
        """The audio queued for OAP belongs to an engine that is gone (swap, engine left):
        drop it (counted ``oap_queue_flushed``). Returns the number of frames dropped."""
        n = len(self.pending)
        if n:
            self.stats.drops["oap_queue_flushed"] += n
        self.pending.clear()
        self.pending_bytes = 0
        return n


def _payload_size(wire: bytes, sealed: bool) -> int:
    """Payload bytes of one wire frame: length(4) [+ IV + tag] + packet header(8)."""
    overhead = LENGTH.size + PACKET_HEADER.size + (IV_SIZE + TAG_SIZE if sealed else 0)
    return len(wire) - overhead
