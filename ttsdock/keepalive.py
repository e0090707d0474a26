"""The PONG deadline of one docked engine (docs/wire.md#keepalive: > 600 ms without a PONG
clears the slot).

Rule 1: silence counts only time during which the dock could have read a PONG. Not counted:
time the dock's own loop was stalled (a keepalive tick that woke late: host overloaded, VM
paused) and time the dock itself paused reading this engine (back-pressure from OAP, see
``ttsdock.hop``): the engine's PONGs sit unread behind its audio then, through no fault of
the engine. A deadline seen at one tick only counts if it still holds at the next tick: the
loop has polled its sockets in between, so a PONG that was already there counts.
Rule 2: this file reads no clock and knows no sockets; ``now`` is passed in.
"""

from __future__ import annotations

PONG_TIMEOUT = 0.6  # docs/wire.md#keepalive: > 600 ms without a PONG clears the slot


class Keepalive:
    __slots__ = ("credit", "last_pong", "overdue", "paused_since", "timeout")

    def __init__(self, now: float, timeout: float = PONG_TIMEOUT) -> None:
        self.timeout = timeout
        self.last_pong = now
        self.credit = 0.0  # seconds since ``last_pong`` that do not count as silence
        self.paused_since: float | None = None  # reading paused by the dock since then
        self.overdue = False  # the deadline had passed at the previous tick

    def pong(self, now: float) -> None:
        self.last_pong = now
        self.credit = 0.0
        self.overdue = False
        if self.paused_since is not None:
            self.paused_since = now

    def stalled(self, late: float) -> None:
        """The dock's own loop was not running for ``late`` seconds."""
        self.credit += late

    def pause(self, now: float) -> None:
        if self.paused_since is None:
            self.paused_since = now

    def resume(self, now: float) -> None:
        if self.paused_since is not None:
            self.credit += max(0.0, now - self.paused_since)
            self.paused_since = None

    @property
    def paused(self) -> bool:
        return self.paused_since is not None

    def silent_for(self, now: float) -> float:
        """Seconds without a PONG that count (see Rule 1)."""
        paused = now - self.paused_since if self.paused_since is not None else 0.0
        return now - self.last_pong - self.credit - paused

    def tick(self, now: float) -> bool:
        """One keepalive tick; ``True``: the engine is dead (clear the slot)."""
        if self.silent_for(now) <= self.timeout or self.paused_since is not None:
            self.overdue = False
            return False
        if self.overdue:
            return True
        self.overdue = True
        return False
