"""Text held per call while no engine is docked (docs/wire.md#holding-text).

Rule 1: everything that decides whether a text packet may wait for an engine,
and when it is given up, lives here: per call at most ``max_packets`` packets
and ``max_bytes`` payload bytes, each packet at most ``max_age`` seconds, at most
``max_calls`` calls and ``max_total_bytes`` over all calls; whatever does not fit
is refused: the newest packet is dropped, never an older one, so what is kept is
always in arrival order (a later, smaller packet of the same call may still fit
after a refusal; every refusal is returned to the caller, which counts and logs it).
Rule 2: this file reads no clock and knows no sockets: ``now`` is passed in, and
every discard is returned to the caller, which counts and logs it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

HOLD_PACKETS = 64
HOLD_BYTES = 1 << 20
HOLD_SECONDS = 10.0  # the reference's wait for an engine (docs/wire.md#holding-text)
HOLD_CALLS = 1024
HOLD_TOTAL_BYTES = 64 << 20  # all calls together


@dataclass(frozen=True, slots=True)
class Discard:
    """Held text given up: ``reason`` is one of ``hold_full``, ``hold_calls``,
    ``hold_total``, ``hold_expired``, ``call_ended``, ``barge_in``."""

    call_id: int
    reason: str
    packets: int
    nbytes: int


@dataclass(slots=True)
class _Held:
    items: deque[tuple[float, bytes]]
    nbytes: int = 0


class HoldBuffer:
    __slots__ = (
        "_calls",
        "max_age",
        "max_bytes",
        "max_calls",
        "max_packets",
        "max_total_bytes",
        "total_bytes",
    )

    def __init__(
        self,
        max_packets: int = HOLD_PACKETS,
        max_bytes: int = HOLD_BYTES,
        max_age: float = HOLD_SECONDS,
        max_calls: int = HOLD_CALLS,
        max_total_bytes: int = HOLD_TOTAL_BYTES,
    ) -> None:
        if min(max_packets, max_bytes, max_age, max_calls, max_total_bytes) < 0:
            raise ValueError("hold limits must not be negative")
        self.max_total_bytes = max_total_bytes
        self.max_packets = max_packets
        self.max_bytes = max_bytes
        self.max_age = max_age
        self.max_calls = max_calls
        self._calls: dict[int, _Held] = {}  # insertion order = order of first held text
        self.total_bytes = 0

    def __len__(self) -> int:
        return sum(len(h.items) for h in self._calls.values())

    def calls(self) -> dict[int, tuple[int, int]]:
        """call_id -> (packets, bytes) currently held."""
        return {cid: (len(h.items), h.nbytes) for cid, h in self._calls.items()}

    def oldest(self) -> float | None:
        """Arrival time of the oldest held packet (for the next expiry sweep)."""
        times = [h.items[0][0] for h in self._calls.values() if h.items]
        return min(times) if times else None

    def hold(self, call_id: int, payload: bytes, now: float) -> Discard | None:
        """Keep ``payload`` for ``call_id``; returns a ``Discard`` when it does not fit."""
        held = self._calls.get(call_id)
        if held is None:
            if len(self._calls) >= self.max_calls:
                return Discard(call_id, "hold_calls", 1, len(payload))
            held = _Held(deque())
        if len(held.items) >= self.max_packets or held.nbytes + len(payload) > self.max_bytes:
            return Discard(call_id, "hold_full", 1, len(payload))
        if self.total_bytes + len(payload) > self.max_total_bytes:
            return Discard(call_id, "hold_total", 1, len(payload))
        self._calls[call_id] = held
        held.items.append((now, payload))
        held.nbytes += len(payload)
        self.total_bytes += len(payload)
        return None

    def has(self, call_id: int) -> bool:
        return call_id in self._calls

    def discard(self, call_id: int, reason: str = "call_ended") -> Discard | None:
        held = self._calls.pop(call_id, None)
        if held is None:
            return None
        self.total_bytes -= held.nbytes
        return Discard(call_id, reason, len(held.items), held.nbytes)

    def expire(self, now: float) -> list[Discard]:
        """Give up every packet held longer than ``max_age``. Linear in what is dropped
        plus the number of held calls (packets of a call are in arrival order)."""
        out: list[Discard] = []
        limit = now - self.max_age
        for cid in list(self._calls):
            held = self._calls[cid]
            n = nb = 0
            while held.items and held.items[0][0] <= limit:
                _, payload = held.items.popleft()
                n += 1
                nb += len(payload)
            if n:
                held.nbytes -= nb
                self.total_bytes -= nb
                out.append(Discard(cid, "hold_expired", n, nb))
            if not held.items:
                del self._calls[cid]
        return out

    def drain(self) -> Iterator[tuple[int, bytes]]:
        """Yield and forget everything held, per call in arrival order, calls in the order
        their first text arrived."""
        calls, self._calls = self._calls, {}
        self.total_bytes = 0
        for cid, held in calls.items():
            for _, payload in held.items:
                yield cid, payload
