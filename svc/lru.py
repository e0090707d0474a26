"""Ended-call memory: the most recent ``capacity`` call ids, oldest forgotten first.

Rule: bounded (docs/wire.md#call-control asks the dock and the engines to remember at
least the last 1000 ended call ids, so that late text or speech events of an ended call
are dropped); adding an id again makes it the most recent. No clock, no I/O.
"""

from __future__ import annotations

from collections import OrderedDict


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
