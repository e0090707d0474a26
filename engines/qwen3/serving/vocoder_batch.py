"""``VocoderBatcher``: one vocoder run for the chunks of concurrent utterances.

Rule 1: windows of the same length (steady chunks with full left context all
have ``left_context + chunk_frames`` frames) that arrive together are decoded
as one ``[B, T, 16]`` run; each caller gets its own waveform back. Rule 2: a
caller never waits for company it will not get: the first caller of a group
(the leader) waits at most ``gather_s``, and not at all when no other
utterance is active (``active()``); a failed run fails every caller of its group.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from engines.qwen3.serving.vocoder import FloatArray, IntArray, Vocoder

#: Longest a leader waits for other utterances' windows (seconds).
GATHER_S = 0.003


@dataclass
class _Group:
    windows: list[IntArray] = field(default_factory=list)
    results: list[FloatArray] | None = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)
    closed: bool = False


class VocoderBatcher:
    """Batches concurrent ``run(window)`` calls of equal window length."""

    def __init__(
        self,
        vocoder: Vocoder,
        *,
        active: Callable[[], int] = lambda: 1,
        gather_s: float = GATHER_S,
    ) -> None:
        self.vocoder = vocoder
        self.active = active
        self.gather_s = gather_s
        self._cond = threading.Condition()
        self._open: dict[int, _Group] = {}
        self.runs = 0
        self.windows = 0

    def run(self, window: IntArray) -> FloatArray:
        """Decode one checked window ``[T, 16]`` -> ``T * 1920`` samples (maybe batched)."""
        t = int(window.shape[0])
        with self._cond:
            group = self._open.get(t)
            if group is None or group.closed:
                group = _Group()
                self._open[t] = group
            group.windows.append(window)
            index = len(group.windows) - 1
            leader = index == 0
            self._cond.notify_all()
            if leader:
                others = max(0, self.active() - 1)
                if others:
                    self._cond.wait_for(lambda: len(group.windows) > others, self.gather_s)
                group.closed = True
                if self._open.get(t) is group:
                    del self._open[t]
        if leader:
            try:
                group.results = self.vocoder.run_batch(np.stack(group.windows))
                with self._cond:
                    self.runs += 1
                    self.windows += len(group.windows)
            except BaseException as exc:
                group.error = exc
            finally:
                group.done.set()
        else:
            group.done.wait()
        if group.error is not None:
            raise group.error
        assert group.results is not None
        return group.results[index]
