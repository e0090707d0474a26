"""``FrameGenerator``: text -> 16-code frames at 12.5 Hz (talker + code predictor).

Per frame (as the official ``qwen_tts`` generate loop): talker logits -> repetition
penalty over the codebook-0 history -> EOS blocked for the first two frames -> ids
2048..3071 suppressed except EOS -> temperature/top-k/top-p (or argmax) -> 15 code-predictor steps
on a fresh 17-position cache -> next talker input = sum of the 16 code
embeddings + the next trailing text row (or ``tts_pad``).

Every request, alone or not, runs through the engine's one ``BatchScheduler``
(``scheduler``): all active utterances share each talker and predictor step
(``frame_batch``), on CUDA as captured graphs per batch-size bucket
(``cuda_graphs``). Request checks live in ``request_checks``, prompt rendering in
``prefill_render``, sampling in ``model.sampling``. The
vocoder is not part of this module: ``iter_frames`` yields int64 ``[16]``
frames as they are made, ``generate_codes`` returns them stacked,
``generate_batch`` runs many requests together.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import structlog
import torch

from engines.qwen3.errors import Qwen3TtsError, RequestError
from engines.qwen3.model.config import ModelMetadata
from engines.qwen3.model.cuda_graphs import GraphSteps
from engines.qwen3.model.frame_batch import PREFILL_CHUNK, FrameBatch
from engines.qwen3.model.sampling import RowSampling
from engines.qwen3.model.tts_model import TtsModel
from engines.qwen3.modes import PresetSpeaker, QtsMode
from engines.qwen3.serving.prefill_layout import PromptLayout
from engines.qwen3.serving.prefill_render import PreparedPrompt, PromptRenderer
from engines.qwen3.serving.request import ModeSynthesizeRequest, VoiceClonePrompt
from engines.qwen3.serving.request_checks import RequestChecks
from engines.qwen3.serving.scheduler import BatchScheduler, FrameStream, Utterance
from engines.qwen3.weights.gguf_loader import GgufBundle, load_weights, read_metadata
from engines.qwen3.weights.text_tokenizer import TextTokenizer

if TYPE_CHECKING:
    from engines.qwen3.weights.paths import ModeModelPaths

__all__ = [
    "BatchOptions",
    "BatchResult",
    "FrameGenerator",
    "ModeSynthesizeRequest",
    "PreparedPrompt",
    "PresetSpeaker",
    "QtsMode",
    "VoiceClonePrompt",
]

log = structlog.get_logger(__name__)
#: Talker widths up to this run single-threaded unless ``num_threads`` says otherwise:
#: for tiny (test) models, intra-op threads cost far more than they save.
SMALL_MODEL_WIDTH = 256
Tensor = torch.Tensor
_FLUSH_DENORMAL_SET = False


def _flush_denormals() -> None:
    global _FLUSH_DENORMAL_SET
    if not _FLUSH_DENORMAL_SET:
        torch.set_flush_denormal(True)
        _FLUSH_DENORMAL_SET = True


@dataclass(frozen=True)
class BatchOptions:
    """Size of the static batch: rows, context per row (prompt + frames), prefill chunk."""

    max_batch: int = 4
    max_context: int = 2560
    prefill_chunk: int = PREFILL_CHUNK
    cuda_graphs: bool = True

    @classmethod
    def for_device(cls, device: torch.device) -> BatchOptions:
        """Defaults: 32 rows x 4096 positions on CUDA, 4 x 2560 on the CPU (KV memory)."""
        graphs = os.environ.get("TTSDOCK_QWEN3_CUDA_GRAPHS", "1") not in ("0", "false", "no")
        if device.type == "cuda":
            return cls(max_batch=32, max_context=4096, cuda_graphs=graphs)
        return cls(cuda_graphs=False)

    def check(self) -> None:
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {self.max_batch}")
        if self.max_context < 16:
            raise ValueError(f"max_context must be >= 16, got {self.max_context}")
        if self.prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1, got {self.prefill_chunk}")


@dataclass
class BatchResult:
    """One request of ``generate_batch``: its codes, or the error that stopped it."""

    name: str
    codes: npt.NDArray[np.int64] | None
    timings: dict[str, float]
    error: str | None = None


class FrameGenerator:
    """One loaded Qwen3-TTS checkpoint (talker, code predictor, tokenizer) for one mode."""

    def __init__(
        self,
        model: TtsModel,
        tokenizer: TextTokenizer,
        mode: QtsMode,
        *,
        source: str = "",
        batching: BatchOptions | None = None,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.mode: QtsMode = mode
        self.meta: ModelMetadata = model.meta
        self.source = source
        self.checks = RequestChecks(self.meta, mode)
        self.renderer = PromptRenderer(self.checks, tokenizer, model)
        #: Per-stage milliseconds of the last finished ``iter_frames``/``generate_codes``.
        self.timings: dict[str, float] = {}
        self.batching = batching or BatchOptions.for_device(model.device)
        self.batching.check()
        tc = self.meta.talker
        self._eos = self.meta.codec.eos
        sup = torch.zeros(tc.vocab_size, dtype=torch.float32, device=model.device)
        sup[max(0, tc.vocab_size - 1024) :] = float("-inf")
        sup[self._eos] = 0.0
        #: Codebook-0 suppression (ids 2048.. except EOS); the batch reads it every step.
        self.suppress = sup
        self._lock = threading.Lock()
        self._scheduler: BatchScheduler | None = None

    # -- loading ----------------------------------------------------------------------------

    @classmethod
    def load_mode(
        cls,
        paths: ModeModelPaths,
        mode: QtsMode | str,
        *,
        device: str = "cpu",
        dtype: str = "float32",
        num_threads: int | None = None,
        batching: BatchOptions | None = None,
    ) -> FrameGenerator:
        """Load the talker, code predictor and tokenizer GGUFs named by ``paths`` for ``mode``.

        When the talker metadata names a model type (``qwen3-tts.tts_model_type``) it must
        match ``mode``; without it the explicit ``mode`` applies. ``num_threads`` sets
        ``torch.set_num_threads`` (process-wide); by default tiny models use 1 thread and
        real ones keep torch's default. ``device`` is ``cpu``, ``cuda[:N]`` or ``auto``;
        ``dtype`` is ``float32``, ``float16`` or ``bfloat16``; ``batching`` sizes the
        static batch (default ``BatchOptions.for_device``).
        """
        m = QtsMode.parse(mode)
        _flush_denormals()
        t0 = time.perf_counter()
        bundle = GgufBundle(Path(paths.talker_gguf), Path(paths.code_predictor_gguf))
        meta = read_metadata(bundle)
        if num_threads is None and meta.talker.hidden_size <= SMALL_MODEL_WIDTH:
            num_threads = 1  # tiny models: intra-op threads only add overhead
        if num_threads:
            torch.set_num_threads(num_threads)
        if meta.model_type is not None and meta.model_type != m.model_type:
            raise Qwen3TtsError(
                f"{bundle.talker.path}: checkpoint is {meta.model_type} "
                f"(qwen3-tts.tts_model_type) but mode {m.as_str()} was requested"
            )
        weights = load_weights(bundle, meta)
        tokenizer = TextTokenizer.from_gguf(Path(paths.tokenizer_gguf))
        model = TtsModel(weights, device=device, dtype=dtype)
        eng = cls(model, tokenizer, m, source=bundle.describe, batching=batching)
        log.info(
            "model_loaded",
            engine="qwen3",
            mode=m.as_str(),
            files=bundle.describe,
            talker_width=meta.talker.hidden_size,
            predictor_width=meta.predictor.hidden_size,
            projection=model.has_projection,
            speakers=len(meta.speakers),
            device=str(model.device),
            dtype=str(model.dtype).removeprefix("torch."),
            ms=round((time.perf_counter() - t0) * 1e3),
        )
        return eng

    @classmethod
    def from_model_dir_for_mode(
        cls, model_dir: str | os.PathLike[str], mode: QtsMode | str, **kw: Any
    ) -> FrameGenerator:
        """Resolve the files of ``mode`` in ``model_dir`` (``ModeModelPaths``) and load them."""
        from engines.qwen3.weights.paths import ModeModelPaths

        size = kw.pop("size", None)
        paths = ModeModelPaths.from_model_dir(model_dir, QtsMode.parse(mode), size=size)
        return cls.load_mode(paths, mode, **kw)

    def close(self) -> None:
        """Stop the batch scheduler (memory maps close with the objects)."""
        with self._lock:
            if self._scheduler is not None:
                self._scheduler.close()
                self._scheduler = None

    # -- model facts (``request_checks``) ----------------------------------------------------

    def preset_speakers(self) -> list[PresetSpeaker]:
        """Presets whose codec id the checkpoint metadata defines."""
        return self.checks.preset_speakers()

    def preset_speaker_id(self, speaker: PresetSpeaker | str) -> int:
        return self.checks.preset_speaker_id(speaker)

    def languages(self) -> list[str]:
        return self.checks.languages()

    @property
    def instruct_supported(self) -> bool:
        return self.checks.instruct_supported

    def check_request(self, req: ModeSynthesizeRequest) -> None:
        """``req.validate()`` plus the checks that need the loaded checkpoint."""
        self.checks.check(req)

    def build_layout(self, req: ModeSynthesizeRequest) -> PromptLayout:
        """The symbolic prefill for ``req`` (checks it first)."""
        return self.renderer.layout(req)

    def prepare(self, req: ModeSynthesizeRequest) -> PreparedPrompt:
        """Check ``req`` and render its talker input rows and trailing text rows."""
        return self.renderer.render(req)

    # -- generation -------------------------------------------------------------------------

    @property
    def scheduler(self) -> BatchScheduler:
        """The engine's one batch scheduler (its static cache is allocated on first use)."""
        with self._lock:
            if self._scheduler is None:
                o = self.batching
                batch = FrameBatch(
                    self.model,
                    max_batch=o.max_batch,
                    max_context=o.max_context,
                    eos=self._eos,
                    suppress=self.suppress,
                )
                graphs = None
                if o.cuda_graphs and self.model.device.type == "cuda":
                    graphs = GraphSteps(batch)
                self._scheduler = BatchScheduler(
                    batch, graphs=graphs, prefill_chunk=o.prefill_chunk
                )
            return self._scheduler

    def submit(
        self,
        req: ModeSynthesizeRequest,
        *,
        cancel: Callable[[], bool] | None = None,
        urgency: Callable[[], float] | None = None,
        name: str = "",
        on_end: Callable[[dict[str, float]], None] | None = None,
    ) -> FrameStream:
        """Check and render ``req`` (in the caller's thread), queue it; frames stream back.

        ``cancel`` is polled by the scheduler before every frame step and by the stream
        while it waits: when it returns True the row leaves and the stream raises
        ``SynthesisCancelled``. ``urgency`` returns the seconds of audio the listener
        still has buffered for this call (lower goes first when the batch is full).
        ``on_end`` gets the utterance's timings when its stream ends (any way).
        """
        label = f"request {name!r}" if name else "request"
        with torch.inference_mode():
            prep = self.prepare(req)
        o = self.batching
        need = int(prep.rows.shape[0]) + req.max_frames
        if need > o.max_context:
            raise RequestError(
                f"{label}: prompt of {prep.rows.shape[0]} rows + max_frames {req.max_frames} "
                f"= {need} positions does not fit the KV cache context of {o.max_context} "
                "(raise --max-context or lower max_frames)"
            )
        utt = Utterance(
            name=label,
            prep=prep,
            sampling=RowSampling.of(req),
            seed=req.seed,
            max_frames=req.max_frames,
            cancel=cancel,
            urgency=urgency,
        )
        return self.scheduler.submit(utt, on_end=on_end)

    def iter_frames(
        self, req: ModeSynthesizeRequest, *, cancel: Callable[[], bool] | None = None
    ) -> FrameStream:
        """Yield one int64 ``[16]`` frame at a time until EOS or ``req.max_frames``.

        The request shares every frame step with whatever else is active. ``cancel``
        as in ``submit`` (the stream raises ``SynthesisCancelled``). When the stream
        ends, ``self.timings`` holds its per-stage milliseconds (queue, prefill,
        talker, code_predictor; a batched step's time counts for each of its rows).
        """

        def ended(timings: dict[str, float]) -> None:
            self.timings = dict(timings)

        return self.submit(req, cancel=cancel, on_end=ended)

    def generate_codes(
        self, req: ModeSynthesizeRequest, *, cancel: Callable[[], bool] | None = None
    ) -> tuple[npt.NDArray[np.int64], dict[str, float]]:
        """All frames ``[T, 16]`` (int64) and the per-stage timings in ms."""
        stream = self.submit(req, cancel=cancel)
        frames = list(stream)
        n = self.meta.talker.num_code_groups
        codes = np.stack(frames) if frames else np.zeros((0, n), dtype=np.int64)
        self.timings = dict(stream.timings)
        return codes, dict(stream.timings)

    def generate_batch(
        self, reqs: Sequence[tuple[str, ModeSynthesizeRequest]]
    ) -> list[BatchResult]:
        """Run named requests together through the scheduler; one result per request.

        A request that fails its checks, does not fit the cache, or exceeds the
        batch (more than ``max_batch`` requests) gets an error naming it and the
        reason; the others still complete.
        """
        out: list[BatchResult] = []
        streams: list[tuple[int, FrameStream]] = []
        cap = self.batching.max_batch
        for i, (name, req) in enumerate(reqs):
            label = f"request {name!r}"
            if len(streams) >= cap:
                msg = (
                    f"{label}: the batch already holds max_batch={cap} requests (raise --max-batch)"
                )
                out.append(BatchResult(name, None, {}, msg))
                continue
            try:
                streams.append((i, self.submit(req, name=name)))
                out.append(BatchResult(name, None, {}))
            except (RequestError, ValueError) as exc:
                msg = str(exc)
                out.append(BatchResult(name, None, {}, msg if label in msg else f"{label}: {msg}"))
        n = self.meta.talker.num_code_groups
        for i, stream in streams:
            res = out[i]
            try:
                frames = list(stream)
                res.codes = np.stack(frames) if frames else np.zeros((0, n), dtype=np.int64)
            except Exception as exc:
                res.error = f"request {res.name!r}: {exc}"
            res.timings = dict(stream.timings)
        return out

    def batch_stats(self) -> dict[str, float]:
        """The scheduler's counters (batch size, queue waits, ...); empty before first use."""
        s = self._scheduler
        return s.stats() if s is not None else {}
