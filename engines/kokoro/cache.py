"""LRU cache of whole-utterance audio, bounded in bytes (prompts repeat on a phone line).

Rule 1: keys are plain tuples (model, voice, speed, front-end options, normalised
text); ``get`` returns a new read-only float32 array.
Rule 2: thread-safe; one entry bigger than the bound is never stored.

Entries are kept as 16-bit codes scaled to the entry's own peak (2 bytes a sample,
half of float32): the error is at least 90 dB below the peak, a quiet utterance
included, far finer than a telephone codec resolves. The bound counts those
bytes, so ``--prompt-cache-mb`` is the memory the cache can take; a
soak with texts that never repeat fills it to the bound and no further.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from engines.runtime.synth import FloatArray

_FULL = 32767.0


@dataclass(frozen=True)
class _Entry:
    codes: npt.NDArray[np.int16]
    scale: float  # sample = code * scale

    @classmethod
    def encode(cls, audio: FloatArray) -> _Entry:
        x = np.asarray(audio, dtype=np.float32)
        finite = np.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)
        peak = float(np.max(np.abs(finite))) if finite.size else 0.0
        scale = peak / _FULL if peak > 0 else 1.0
        codes = np.clip(np.rint(finite / scale), -_FULL, _FULL).astype(np.int16)
        return cls(codes, scale)

    def decode(self) -> FloatArray:
        out = (self.codes.astype(np.float32) * np.float32(self.scale)).astype(np.float32)
        out.setflags(write=False)
        return out

    @property
    def nbytes(self) -> int:
        return int(self.codes.nbytes)


class AudioCache:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max(0, int(max_bytes))
        self._items: OrderedDict[Hashable, _Entry] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable) -> FloatArray | None:
        with self._lock:
            entry = self._items.get(key)
            if entry is None:
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
        return entry.decode()

    def put(self, key: Hashable, audio: FloatArray) -> None:
        if len(audio) == 0 or 2 * len(audio) > self.max_bytes:
            return
        entry = _Entry.encode(audio)
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= old.nbytes
            self._items[key] = entry
            self._bytes += entry.nbytes
            while self._bytes > self.max_bytes and self._items:
                _, evicted = self._items.popitem(last=False)
                self._bytes -= evicted.nbytes

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._items)
