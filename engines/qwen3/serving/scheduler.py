"""``BatchScheduler``: one thread per engine that runs every active utterance as one batch.

Rule 1: each iteration is (a) drop cancelled rows, (b) admit waiting utterances
into free batch rows, most urgent first, (c) at most one prefill chunk of one
newcomer, (d) one batched frame step for every row whose prefill is done, (e)
hand each row its frame, or finish it (EOS, frame cap). So a newcomer joins
at the frame boundary after its prefill, a finished or cancelled row leaves at
once (barge-in frees the row within one frame), and a prefill delays the
others by at most one chunk. Rule 2: this file knows no models or sampling:
``FrameBatch`` does the maths; callers see a ``FrameStream`` per utterance.

Admission is deadline-aware: beyond ``max_batch`` utterances wait, and when a
row frees, the waiting utterance whose call's playback has the least audio
ahead (``urgency()``, seconds; lower is more urgent) goes first, ties in
arrival order. Waits are counted and timed (``stats``).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import structlog
import torch

from engines.qwen3.model.cuda_graphs import GraphSteps
from engines.qwen3.model.frame_batch import PREFILL_CHUNK, BatchRow, FrameBatch
from engines.qwen3.model.sampling import RowSampling
from engines.qwen3.serving.prefill_render import PreparedPrompt
from engines.runtime.synth import SynthesisCancelled

log = structlog.get_logger(__name__)
#: How often a waiting consumer re-checks its cancel token (seconds).
CANCEL_POLL_S = 0.02
#: Idle scheduler wake-up (seconds); it is woken at once by submit/cancel.
IDLE_WAIT_S = 0.5

Frame = npt.NDArray[np.int64]


class _End:
    """Queue sentinel: the utterance ended normally."""


@dataclass
class Utterance:
    """One submitted request as the scheduler tracks it."""

    name: str
    prep: PreparedPrompt
    sampling: RowSampling
    seed: int | None
    max_frames: int
    cancel: Callable[[], bool] | None = None
    urgency: Callable[[], float] | None = None
    submitted: float = field(default_factory=time.perf_counter)
    out: queue.SimpleQueue[Frame | _End | BaseException] = field(default_factory=queue.SimpleQueue)
    timings: dict[str, float] = field(
        default_factory=lambda: {
            "queue": 0.0,
            "prefill": 0.0,
            "talker": 0.0,
            "code_predictor": 0.0,
            "frames": 0.0,
        }
    )
    abandoned: threading.Event = field(default_factory=threading.Event)
    row: int | None = None  # its batch row while admitted
    order: int = 0

    def is_cancelled(self) -> bool:
        if self.abandoned.is_set():
            return True
        try:
            return bool(self.cancel is not None and self.cancel())
        except Exception:
            return True

    def ahead_s(self) -> float:
        if self.urgency is None:
            return 0.0
        try:
            return float(self.urgency())
        except Exception:
            return 0.0


class FrameStream(Iterator[Frame]):
    """The frames of one utterance, as the scheduler makes them (blocking iterator).

    Raises ``SynthesisCancelled`` when the cancel token fires (the row has then
    left, or leaves at the next frame boundary) and re-raises a failure of the
    row. ``close()`` (or dropping the generator) abandons the utterance.
    """

    def __init__(
        self,
        utt: Utterance,
        scheduler: BatchScheduler,
        on_end: Callable[[dict[str, float]], None] | None = None,
    ) -> None:
        self.utt = utt
        self._scheduler = scheduler
        self._on_end = on_end
        self._done = False

    @property
    def timings(self) -> dict[str, float]:
        return self.utt.timings

    def __iter__(self) -> FrameStream:
        return self

    def __next__(self) -> Frame:
        if self._done:
            raise StopIteration
        u = self.utt
        while True:
            try:
                item = u.out.get(timeout=CANCEL_POLL_S)
            except queue.Empty:
                if u.is_cancelled():
                    self.close()
                    raise SynthesisCancelled() from None
                continue
            if isinstance(item, _End):
                self._end()
                raise StopIteration
            if isinstance(item, BaseException):
                self._end()
                raise item
            return item

    def _end(self) -> None:
        self._done = True
        if self._on_end is not None:
            cb, self._on_end = self._on_end, None
            cb(self.utt.timings)

    def close(self) -> None:
        if not self._done:
            self._end()
            self.utt.abandoned.set()
            self._scheduler.wake()

    def __del__(self) -> None:
        self.close()


class BatchScheduler:
    """Drives one ``FrameBatch`` from its own thread (started on first submit)."""

    def __init__(
        self,
        batch: FrameBatch,
        *,
        graphs: GraphSteps | None = None,
        prefill_chunk: int = PREFILL_CHUNK,
        device: torch.device | None = None,
    ) -> None:
        self.batch = batch
        self.graphs = graphs
        self.prefill_chunk = max(1, prefill_chunk)
        self.device = device or batch.model.device
        self._cond = threading.Condition()
        self._waiting: list[Utterance] = []
        self._prefilling: list[Utterance] = []
        self._active: dict[int, Utterance] = {}
        self._thread: threading.Thread | None = None
        self._closed = False
        self._order = 0
        self._counters = {
            "steps": 0.0,
            "rows_stepped": 0.0,
            "batch_size_last": 0.0,
            "batch_size_max": 0.0,
            "admitted": 0.0,
            "queued": 0.0,
            "queue_wait_ms_last": 0.0,
            "queue_wait_ms_max": 0.0,
            "prefill_chunks": 0.0,
            "cancelled": 0.0,
            "failed": 0.0,
            "graph_steps": 0.0,
        }

    # -- caller side ------------------------------------------------------------------------

    def submit(
        self, utt: Utterance, on_end: Callable[[dict[str, float]], None] | None = None
    ) -> FrameStream:
        """Queue ``utt`` (already checked and rendered); frames arrive on the stream."""
        with self._cond:
            if self._closed:
                raise RuntimeError("qwen3 scheduler is closed")
            self._order += 1
            utt.order = self._order
            if self.batch.free_row() is None or self._waiting:
                self._counters["queued"] += 1
            self._waiting.append(utt)
            self._ensure_thread()
            self._cond.notify_all()
        return FrameStream(utt, self, on_end)

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=5.0)

    def stats(self) -> dict[str, float]:
        with self._cond:
            out = dict(self._counters)
            out["active"] = float(len(self._active))
            out["prefilling"] = float(len(self._prefilling))
            out["waiting"] = float(len(self._waiting))
            out["max_batch"] = float(self.batch.max_batch)
            steps = out["steps"]
            out["batch_size_mean"] = out["rows_stepped"] / steps if steps else 0.0
            if self.graphs is not None:
                out["graphs_captured"] = float(self.graphs.captured)
                out["graph_capture_failures"] = float(self.graphs.failed)
        return out

    # -- scheduler thread -------------------------------------------------------------------

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="qwen3-batch", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        with torch.inference_mode():
            while True:
                with self._cond:
                    if self._closed:
                        self._fail_all(RuntimeError("qwen3 scheduler closed"))
                        return
                    self._drop_cancelled()
                    self._admit()
                    if not (self._prefilling or self._active):
                        self._cond.wait(IDLE_WAIT_S)
                        continue
                try:
                    self._iteration()
                except Exception as exc:  # a failed step costs its rows, not the engine
                    log.exception("batch_step_failed", engine="qwen3")
                    with self._cond:
                        self._fail_all(exc)

    def _iteration(self) -> None:
        # With rows decoding, one batched prefill chunk (every newcomer, up to
        # ``prefill_chunk`` rows each) per frame step, so the others wait at most one
        # chunk; with none decoding, pending prefills run to the end (nobody to delay).
        while self._prefilling:
            todo = list(self._prefilling)
            batch_rows = [u.row for u in todo]
            t0 = time.perf_counter()
            try:
                assert all(b is not None for b in batch_rows)
                done = set(
                    self.batch.prefill([b for b in batch_rows if b is not None], self.prefill_chunk)
                )
            except Exception as exc:
                with self._cond:
                    for utt in todo:
                        self._finish(utt, exc)
                break
            ms = (time.perf_counter() - t0) * 1e3
            self._counters["prefill_chunks"] += 1
            with self._cond:
                for utt in todo:
                    utt.timings["prefill"] += ms
                    if utt.row in done:
                        self._prefilling.remove(utt)
                        self._active[utt.row] = utt
            if self._active:
                break
        if self._active:
            self._step()

    def _step(self) -> None:
        fb = self.batch
        n = fb.active_span()
        if n == 0:
            return
        t0 = time.perf_counter()
        shape, top = fb.prepare_step(n)
        graphed = self.graphs is not None and self.graphs.run(n, shape)
        if graphed:
            codes = fb.codes[:n].cpu().numpy().copy()
            t1 = t2 = time.perf_counter()
        else:
            fb.frame_codes(n, shape, None)
            if self.device.type != "cuda":
                t1 = time.perf_counter()
            fb.talker_step(n, top)
            codes = fb.codes[:n].cpu().numpy().copy()
            t2 = time.perf_counter()
            if self.device.type == "cuda":
                t1 = t0 + (t2 - t0) * 0.5  # no sync between the halves on a GPU
        rows = len(self._active)
        c = self._counters
        c["steps"] += 1
        c["rows_stepped"] += rows
        c["batch_size_last"] = float(rows)
        c["batch_size_max"] = max(c["batch_size_max"], float(rows))
        if graphed:
            c["graph_steps"] += 1
        eos = fb.eos
        with self._cond:
            for b, utt in list(self._active.items()):
                tm = utt.timings
                tm["code_predictor"] += (t1 - t0) * 1e3
                tm["talker"] += (t2 - t1) * 1e3
                row = fb.rows[b]
                assert row is not None
                frame = codes[b]
                if frame[0] == eos:
                    self._finish(utt, None)
                    continue
                row.frames += 1
                tm["frames"] = float(row.frames)
                utt.out.put(frame.copy())
                if row.frames >= row.max_frames:
                    self._finish(utt, None)

    # -- bookkeeping (under the lock) -------------------------------------------------------

    def _drop_cancelled(self) -> None:
        for utt in [*self._waiting, *self._prefilling, *self._active.values()]:
            if utt.is_cancelled():
                self._counters["cancelled"] += 1
                if utt in self._waiting:
                    self._waiting.remove(utt)
                self._finish(utt, SynthesisCancelled())

    def _admit(self) -> None:
        fb = self.batch
        while self._waiting:
            b = fb.free_row()
            if b is None:
                return
            utt = min(self._waiting, key=lambda u: (u.ahead_s(), u.order))
            self._waiting.remove(utt)
            wait_ms = (time.perf_counter() - utt.submitted) * 1e3
            utt.timings["queue"] = wait_ms
            c = self._counters
            c["admitted"] += 1
            c["queue_wait_ms_last"] = wait_ms
            c["queue_wait_ms_max"] = max(c["queue_wait_ms_max"], wait_ms)
            gen = torch.Generator(device=fb.model.device)
            if utt.seed is not None:
                gen.manual_seed(int(utt.seed))
            else:
                gen.seed()
            fb.occupy(b, BatchRow(utt.prep, utt.sampling, gen, utt.max_frames))
            utt.row = b
            self._prefilling.append(utt)

    def _finish(self, utt: Utterance, error: BaseException | None) -> None:
        if utt.row is not None:
            self.batch.release(utt.row)
            self._active.pop(utt.row, None)
            if utt in self._prefilling:
                self._prefilling.remove(utt)
            utt.row = None
        if error is not None and not isinstance(error, SynthesisCancelled):
            self._counters["failed"] += 1
        utt.out.put(error if error is not None else _End())

    def _fail_all(self, exc: BaseException) -> None:
        for utt in [*self._waiting, *self._prefilling, *self._active.values()]:
            self._finish(utt, exc)
        self._waiting.clear()
