"""CUDA graphs of ``FrameBatch.step_body``, one per batch-size bucket, with an eager fallback.

Rule 1: a graph replays exactly ``step_body`` (the one frame step) over rows
``0..bucket-1`` with whole-cache attention lengths, so graph and eager steps
give the same codes. Rule 2: capture is an optimisation: any failure (CUDA
out of memory included) logs a warning and falls back, never fails a call.

Buckets are powers of two (1, 2, 4, ... up to ``max_batch``); a step over
``n`` active rows replays the smallest bucket ``>= n`` (the rows above ``n``
are padding). A bucket whose capture fails is dropped with every larger one,
so the batch keeps running on the smaller captured buckets and eagerly above.
Graphs are keyed by the bucket and the step's ``StepShape`` (Gumbel candidate
counts, top-p in use).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import structlog
import torch

from engines.qwen3.model.frame_batch import FrameBatch, StepShape

log = structlog.get_logger(__name__)


class Replayable(Protocol):
    def replay(self) -> None: ...


def bucket_sizes(max_batch: int) -> list[int]:
    """1, 2, 4, ... and ``max_batch`` itself when it is not a power of two."""
    out = []
    b = 1
    while b < max_batch:
        out.append(b)
        b *= 2
    out.append(max_batch)
    return out


def capture(fn: Callable[[], None]) -> Replayable:
    """Warm ``fn`` up on a side stream, then record it as a CUDA graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    # thread_local: callers render prompts on the GPU from their own threads meanwhile
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        fn()
    return graph


class GraphSteps:
    """Captured frame steps of one ``FrameBatch``; ``run`` replays one or returns False."""

    def __init__(
        self,
        batch: FrameBatch,
        *,
        capture_fn: Callable[[Callable[[], None]], Replayable] = capture,
        max_graphs: int = 16,
    ) -> None:
        self.batch = batch
        self.buckets = bucket_sizes(batch.max_batch)
        self._capture = capture_fn
        self._graphs: dict[tuple[int, StepShape], Replayable] = {}
        self.max_graphs = max_graphs
        self.enabled = True
        self.captured = 0
        self.failed = 0

    def bucket_for(self, n: int) -> int | None:
        for b in self.buckets:
            if b >= n:
                return b
        return None

    def run(self, n: int, shape: StepShape) -> bool:
        """Replay the step over rows ``0..n-1`` (noise and text rows already filled)."""
        if not self.enabled:
            return False
        b = self.bucket_for(n)
        if b is None:
            return False
        key = (b, shape)
        graph = self._graphs.get(key)
        if graph is None:
            graph = self._capture_bucket(key)
            if graph is None:
                return False
        graph.replay()
        return True

    def _capture_bucket(self, key: tuple[int, StepShape]) -> Replayable | None:
        b, shape = key
        fb = self.batch
        length, cp_length = fb.cache.length, fb.cp_cache.length

        def body() -> None:
            fb.step_body(b, shape, length, cp_length)

        # The warm-up runs write only to padding rows' scratch positions and to the
        # per-frame buffers that every real step overwrites; save and restore the rest.
        saved = _snapshot(fb, b)
        try:
            graph = self._capture(body)
        except Exception as exc:  # torch.cuda.OutOfMemoryError included
            self.failed += 1
            _restore(fb, b, saved)
            dropped = [x for x in self.buckets if x >= b]
            self.buckets = [x for x in self.buckets if x < b]
            log.warning(
                "cuda_graph_capture_failed",
                engine="qwen3",
                bucket=b,
                dropped_buckets=dropped,
                oom=isinstance(exc, torch.cuda.OutOfMemoryError),
                error=repr(exc)[:300],
            )
            if isinstance(exc, torch.cuda.OutOfMemoryError):
                torch.cuda.empty_cache()
            elif not self.buckets:
                self.enabled = False
            return None
        _restore(fb, b, saved)
        while len(self._graphs) >= self.max_graphs:
            self._graphs.pop(next(iter(self._graphs)))
        self._graphs[key] = graph
        self.captured += 1
        log.info("cuda_graph_captured", engine="qwen3", bucket=b, shape=str(shape))
        return graph


def _snapshot(fb: FrameBatch, n: int) -> list[torch.Tensor]:
    """Per-row state a warm-up/capture run would advance (h, pos, history, frame count)."""
    return [t[:n].clone() for t in (fb.h, fb.pos, fb.seen, fb.frame_i)]


def _restore(fb: FrameBatch, n: int, saved: list[torch.Tensor]) -> None:
    for t, s in zip((fb.h, fb.pos, fb.seen, fb.frame_i), saved, strict=True):
        t[:n].copy_(s)
