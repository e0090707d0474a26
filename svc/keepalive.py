"""The silence rule of a link that must hear from its peer: the dock's PONG deadline for a
docked engine (docs/wire.md#keepalive: > 600 ms without a PONG clears the engine slot)
and the engine client's dock-silence rule (no frame for 1 s: the dock is gone).

Rule 1: silence counts only time during which this side could have read the peer. Not
counted: time this side's own loop was stalled (a check that woke late: host overloaded,
VM paused; ``Ticks``) and time this side paused reading the peer (the dock's
back-pressure from OAP, see ``ttsdock.hop``): the peer's frames sit unread then, through
no fault of the peer. A deadline seen at one check only counts if it still holds at the
next check: the loop has polled its sockets in between, so a frame that was already there
counts.
Rule 2: this file reads no clock and knows no sockets; ``now`` is passed in.
"""

from __future__ import annotations


class Ticks:
    """How late each run of a periodic check woke (``interval`` apart)."""

    __slots__ = ("interval", "last", "slack")

    def __init__(self, now: float, interval: float, slack: float) -> None:
        self.interval = interval
        self.slack = slack  # lateness up to this is jitter, not a stall
        self.last = now

    def late(self, now: float) -> float:
        """The check runs at ``now``: how late it woke when that is over ``slack`` (this
        side was stalled for that long), else 0.0."""
        late = now - self.last - self.interval
        self.last = now
        return late if late > self.slack else 0.0


class Keepalive:
    """The silence deadline of one link (Rule 1)."""

    __slots__ = ("credit", "last_pong", "overdue", "paused_since", "timeout")

    def __init__(self, now: float, timeout: float) -> None:
        self.timeout = timeout
        self.last_pong = now
        self.credit = 0.0  # seconds since ``last_pong`` that do not count as silence
        self.paused_since: float | None = None  # reading paused by this side since then
        self.overdue = False  # the deadline had passed at the previous tick

    def pong(self, now: float) -> None:
        """The peer was heard at ``now`` (a PONG; for the engine client any frame)."""
        self.last_pong = now
        self.credit = 0.0
        self.overdue = False
        if self.paused_since is not None:
            self.paused_since = now

    def stalled(self, late: float) -> None:
        """This side's own loop was not running for ``late`` seconds (``Ticks.late``)."""
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
        """One check; ``True``: the peer is gone (the dock clears the engine slot)."""
        if self.silent_for(now) <= self.timeout or self.paused_since is not None:
            self.overdue = False
            return False
        if self.overdue:
            return True
        self.overdue = True
        return False
