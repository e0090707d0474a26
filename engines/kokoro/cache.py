"""LRU cache of whole-utterance audio, bounded in bytes (prompts repeat on a phone line).

Rule 1: keys are plain tuples (model, voice, speed, front-end options, normalised
text); values are immutable float32 arrays.
Rule 2: thread-safe; one entry bigger than the bound is never stored.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable

import numpy as np

from engines.runtime.synth import FloatArray


class AudioCache:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max(0, int(max_bytes))
        self._items: OrderedDict[Hashable, FloatArray] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable) -> FloatArray | None:
        with self._lock:
            audio = self._items.get(key)
            if audio is None:
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return audio

    def put(self, key: Hashable, audio: FloatArray) -> None:
        size = int(audio.nbytes)
        if size == 0 or size > self.max_bytes:
            return
        frozen = np.array(audio, dtype=np.float32, copy=True)
        frozen.setflags(write=False)
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= int(old.nbytes)
            self._items[key] = frozen
            self._bytes += size
            while self._bytes > self.max_bytes and self._items:
                _, evicted = self._items.popitem(last=False)
                self._bytes -= int(evicted.nbytes)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._items)
