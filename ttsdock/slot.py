"""The engine slot: last connect wins (docs/wire.md#engine-slot).

Rule 1: everything that decides which engine is active, and which generation a
frame must carry to be accepted, lives here; transitions are the table below.
Rule 2: this file does not know about sockets, timers or OAP: the I/O layer
calls ``dock`` / ``leave`` and performs what the returned values say (send
SHUTDOWN to ``replaced``, FLUSH_TTS to OAP when ``flush`` is true).

States: ``empty`` (no engine), ``active`` (one engine, nothing draining),
``swapping`` (a newer engine is active while replaced ones still drain, for at
most the 2 s grace). Generations only grow; a frame whose connection carries a
generation other than ``generation`` of the active engine is stale.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field
from typing import Generic, TypeVar

H = TypeVar("H")

HISTORY = 16  # recently replaced/left engines shown by the ENGINES command


class SlotError(RuntimeError):
    """A transition missing from the table: a bug in the caller, never a peer mistake."""


class SlotState(enum.Enum):
    EMPTY = "empty"
    ACTIVE = "active"
    SWAPPING = "swapping"


class SlotEvent(enum.Enum):
    DOCK = "dock"  # an engine passed HELLO
    LEAVE = "leave"  # the active engine disconnected or timed out
    DRAINED = "drained"  # the last replaced engine is gone


TRANSITIONS: dict[SlotState, dict[SlotEvent, SlotState]] = {
    SlotState.EMPTY: {SlotEvent.DOCK: SlotState.ACTIVE, SlotEvent.DRAINED: SlotState.EMPTY},
    SlotState.ACTIVE: {
        SlotEvent.DOCK: SlotState.SWAPPING,
        SlotEvent.LEAVE: SlotState.EMPTY,
        # an engine replaced before an earlier engine left may finish draining later
        SlotEvent.DRAINED: SlotState.ACTIVE,
    },
    SlotState.SWAPPING: {
        SlotEvent.DOCK: SlotState.SWAPPING,
        SlotEvent.LEAVE: SlotState.EMPTY,
        SlotEvent.DRAINED: SlotState.ACTIVE,
    },
}


@dataclass(slots=True)
class EngineRecord(Generic[H]):
    """One docked engine as the slot sees it."""

    generation: int
    name: str
    handle: H
    docked_at: float
    left_at: float | None = None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class DockResult(Generic[H]):
    generation: int
    replaced: EngineRecord[H] | None  # send CUSTOM SHUTDOWN; force-close after the grace


@dataclass(slots=True)
class Slot(Generic[H]):
    state: SlotState = SlotState.EMPTY
    generation: int = 0  # generation of the active engine (0: none ever)
    active: EngineRecord[H] | None = None
    draining: dict[int, EngineRecord[H]] = field(default_factory=dict)
    history: deque[EngineRecord[H]] = field(default_factory=lambda: deque(maxlen=HISTORY))
    swaps: int = 0
    _next_gen: int = 1

    def _apply(self, event: SlotEvent) -> None:
        try:
            self.state = TRANSITIONS[self.state][event]
        except KeyError:
            raise SlotError(f"no transition for {event.value} in {self.state.value}") from None

    def dock(self, name: str, handle: H, now: float) -> DockResult[H]:
        """An engine passed HELLO: it becomes active at once (last connect wins)."""
        gen = self._next_gen
        self._next_gen += 1
        replaced = self.active
        if replaced is not None:
            replaced.left_at = now
            replaced.reason = "replaced"
            self.draining[replaced.generation] = replaced
            self.history.append(replaced)
            self.swaps += 1
        self._apply(SlotEvent.DOCK)
        self.active = EngineRecord(gen, name, handle, now)
        self.generation = gen
        return DockResult(gen, replaced)

    def is_current(self, generation: int) -> bool:
        return self.active is not None and generation == self.generation

    def leave(self, generation: int, now: float, reason: str) -> bool:
        """The connection of ``generation`` is gone (closed, crashed, timed out, force-closed).
        Returns ``True`` when it was the active engine: the slot is now empty and OAP must
        get FLUSH_TTS."""
        if self.active is not None and generation == self.generation:
            rec = self.active
            rec.left_at, rec.reason = now, reason
            self.history.append(rec)
            self.active = None
            self._apply(SlotEvent.LEAVE)
            return True
        if self.draining.pop(generation, None) is not None and not self.draining:
            self._apply(SlotEvent.DRAINED)
        return False

    @property
    def active_name(self) -> str | None:
        return self.active.name if self.active is not None else None
