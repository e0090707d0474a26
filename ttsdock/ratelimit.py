"""Rate limit for peer-mistake WARN lines: at most one per key per interval.

Rule: this file reads no clock; ``now`` is passed in. The number of events
suppressed since the last line is returned so the next line can report it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

MAX_KEYS = 4096  # bounded: the oldest keys are forgotten


class RateLimit:
    __slots__ = ("_keys", "interval")

    def __init__(self, interval: float = 1.0) -> None:
        self.interval = interval
        self._keys: OrderedDict[Hashable, tuple[float, int]] = OrderedDict()

    def allow(self, key: Hashable, now: float) -> tuple[bool, int]:
        """``(True, suppressed)`` when a line may be logged now, else ``(False, 0)``."""
        last = self._keys.get(key)
        if last is not None and now - last[0] < self.interval:
            self._keys[key] = (last[0], last[1] + 1)
            return False, 0
        suppressed = last[1] if last is not None else 0
        self._keys[key] = (now, 0)
        self._keys.move_to_end(key)
        if len(self._keys) > MAX_KEYS:
            self._keys.popitem(last=False)
        return True, suppressed
