"""Ended-call memory: the most recent ``capacity`` call ids, oldest forgotten first.

Rule: bounded (docs/wire.md#call-control asks the dock and the engines to remember at
least the last 1000 ended call ids, so that late text or speech events of an ended call
are dropped); adding an id again makes it the most recent. No clock, no I/O.
"""

from __future__ import annotations

from collections import OrderedDict

#: The least number of ended call ids a stage must remember (docs/wire.md#call-control).
ENDED_CALLS_MIN = 1000
#: How many ended call ids the dock and the engines remember: four times the contract's
#: minimum, so that a late text or speech event is still recognised as belonging to an
#: ended call after 4096 other calls have ended (minutes of churn on a busy stage), at a
#: cost under 1 MB per process. The dock's ``--ended-calls`` defaults to it.
ENDED_CALLS = 4096


class EndedCalls:
    __slots__ = ("_ids", "capacity")

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._ids: OrderedDict[int, None] = OrderedDict()

    def add(self, call_id: int) -> None:
        ids = self._ids
        ids[call_id] = None
        ids.move_to_end(call_id)
        if len(ids) > self.capacity:
            ids.popitem(last=False)

    def discard(self, call_id: int) -> None:
        self._ids.pop(call_id, None)

    def __contains__(self, call_id: object) -> bool:
        return call_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)
