"""The Qwen3-TTS 12 Hz vocoder (speech-tokenizer decoder) in ONNX Runtime.

Contract (the official 12 Hz codec decoder's): codes int64 with values 0..2047, one row of
16 codebooks per frame at 12.5 Hz, to float32 audio of exactly ``T*1920``
samples at 24 kHz in [-1, 1]. Exports differ in layout, so everything is read
from the session: the code input is ``[B,16,T]`` or ``[B,T,16]`` (the static 16
axis tells which), the audio output is ``[B,1,S]``, ``[B,S]`` or flat, and an
optional int64 ``lengths [B]`` output gives the valid sample count.

``StreamingDecoder`` decodes small chunks as frames arrive, each with up to
``left_context`` earlier frames prepended (25 is near-exact for the real
decoder) whose samples are dropped; ICL reference codes can seed that context.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final, Literal

import numpy as np
import numpy.typing as npt
import structlog

log = structlog.get_logger(__name__)

SAMPLE_RATE: Final[int] = 24000
SAMPLES_PER_FRAME: Final[int] = 1920
NUM_CODEBOOKS: Final[int] = 16
CODEBOOK_SIZE: Final[int] = 2048

Layout = Literal["BQT", "BTQ"]  # [B,16,T] or [B,T,16]
FloatArray = npt.NDArray[np.float32]
IntArray = npt.NDArray[np.int64]


class VocoderError(Exception):
    """The vocoder file is missing, corrupt, or its graph does not follow the decoder contract."""


def _is_int(d: object) -> bool:
    return isinstance(d, int) and not isinstance(d, bool)


def _check_codes(codes: npt.ArrayLike) -> IntArray:
    arr = np.asarray(codes)
    if arr.ndim == 1 and arr.shape[0] == NUM_CODEBOOKS:
        arr = arr.reshape(1, NUM_CODEBOOKS)
    if arr.ndim != 2 or arr.shape[1] != NUM_CODEBOOKS:
        raise ValueError(f"codes must be shaped [frames, {NUM_CODEBOOKS}], got {list(arr.shape)}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"codes must be integers, got dtype {arr.dtype}")
    out = arr.astype(np.int64, copy=False)
    if out.size:
        lo, hi = int(out.min()), int(out.max())
        if lo < 0 or hi >= CODEBOOK_SIZE:
            raise ValueError(f"codes must be in 0..{CODEBOOK_SIZE - 1}, got values {lo}..{hi}")
    return out


class Vocoder:
    """An ONNX Runtime session for the decoder, with its I/O layout read from the graph."""

    sample_rate: Final[int] = SAMPLE_RATE
    samples_per_frame: Final[int] = SAMPLES_PER_FRAME

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        device: str = "cpu",
        threads: int | None = None,
        layout: Layout | None = None,
        providers: Sequence[str] | None = None,
    ) -> None:
        import onnxruntime as ort

        self.path = Path(path)
        if not self.path.exists():
            raise VocoderError(f"vocoder ONNX {str(self.path)!r}: missing (no such file)")
        if self.path.is_dir():
            raise VocoderError(f"vocoder ONNX {str(self.path)!r}: is a directory, expected a file")
        if self.path.stat().st_size == 0:
            raise VocoderError(f"vocoder ONNX {str(self.path)!r}: is empty (0 bytes)")
        if device not in ("cpu", "cuda"):
            raise VocoderError(f"vocoder device must be 'cpu' or 'cuda', got {device!r}")

        opts = ort.SessionOptions()
        if threads is not None:
            if threads < 1:
                raise VocoderError(f"vocoder threads must be >= 1, got {threads}")
            opts.intra_op_num_threads = threads
            opts.inter_op_num_threads = 1
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        available = ort.get_available_providers()
        if providers is None:
            wanted = ["CPUExecutionProvider"]
            if device == "cuda":
                if "CUDAExecutionProvider" in available:
                    wanted = ["CUDAExecutionProvider", "CPUExecutionProvider"]
                else:
                    log.warning(
                        "vocoder_cuda_unavailable", path=str(self.path), providers=available
                    )
            providers = wanted
        try:
            self._sess = ort.InferenceSession(
                str(self.path), sess_options=opts, providers=list(providers)
            )
        except Exception as exc:  # onnxruntime raises its own exception types
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise VocoderError(
                f"vocoder ONNX {str(self.path)!r}: cannot be loaded (corrupt or not ONNX): {first}"
            ) from exc
        self.providers: list[str] = list(self._sess.get_providers())
        self._inspect(layout)
        self._lock = threading.Lock()
        self.calls = 0
        self.total_ms = 0.0

    # -- contract -------------------------------------------------------------------------

    def _inspect(self, layout: Layout | None) -> None:
        where = f"vocoder ONNX {str(self.path)!r}"
        inputs = self._sess.get_inputs()
        if len(inputs) != 1:
            names = ", ".join(f"{i.name}{i.shape}" for i in inputs)
            raise VocoderError(
                f"{where}: expected one input (codes [B,16,T] or [B,T,16]), got {len(inputs)}: "
                f"{names} (stateful decoder graphs are not supported)"
            )
        inp = inputs[0]
        if inp.type not in ("tensor(int64)", "tensor(int32)"):
            raise VocoderError(f"{where}: input {inp.name!r} must be int64 codes, got {inp.type}")
        shape = list(inp.shape)
        if len(shape) != 3:
            raise VocoderError(
                f"{where}: input {inp.name!r} must have rank 3 ([B,16,T] or [B,T,16]), "
                f"got shape {shape}"
            )
        if layout is None:
            if shape[1] == NUM_CODEBOOKS and shape[2] != NUM_CODEBOOKS:
                layout = "BQT"
            elif shape[2] == NUM_CODEBOOKS and shape[1] != NUM_CODEBOOKS:
                layout = "BTQ"
            else:
                raise VocoderError(
                    f"{where}: cannot tell the code layout from input shape {shape}; "
                    "expected a static 16 on axis 1 ([B,16,T]) or axis 2 ([B,T,16])"
                )
        elif layout not in ("BQT", "BTQ"):
            raise VocoderError(f"vocoder layout must be 'BQT' or 'BTQ', got {layout!r}")
        self.layout: Layout = layout
        self.input_name: str = inp.name
        self._input_dtype = np.int32 if inp.type == "tensor(int32)" else np.int64

        audio = None
        lengths = None
        for o in self._sess.get_outputs():
            if o.type in ("tensor(float)", "tensor(float16)") and audio is None:
                audio = o
            elif o.type in ("tensor(int64)", "tensor(int32)") and lengths is None:
                lengths = o
        if audio is None:
            outs = ", ".join(f"{o.name}:{o.type}" for o in self._sess.get_outputs())
            raise VocoderError(f"{where}: no float audio output (outputs: {outs})")
        ashape = list(audio.shape)
        if len(ashape) not in (1, 2, 3):
            raise VocoderError(
                f"{where}: audio output {audio.name!r} must be [B,1,S], [B,S] or [S], got {ashape}"
            )
        if len(ashape) == 3 and _is_int(ashape[1]) and ashape[1] != 1:
            raise VocoderError(
                f"{where}: audio output {audio.name!r} has {ashape[1]} channels, expected mono"
            )
        self.audio_output: str = audio.name
        self.audio_rank: int = len(ashape)
        self.lengths_output: str | None = lengths.name if lengths is not None else None
        self._outputs = [self.audio_output] + ([self.lengths_output] if lengths else [])

    def describe(self) -> str:
        return (
            f"{self.path.name} layout={self.layout} audio={self.audio_output}(rank "
            f"{self.audio_rank}) lengths={self.lengths_output} providers={self.providers}"
        )

    # -- decoding -------------------------------------------------------------------------

    def _run(self, codes: IntArray) -> FloatArray:
        """Run the graph on checked codes ``[T,16]`` (T >= 1); return exactly T*1920 samples."""
        return self.run_batch(codes[None])[0]

    def run_batch(self, codes: IntArray) -> list[FloatArray]:
        """Run the graph once on checked codes ``[B,T,16]``; B waveforms of T*1920 samples."""
        import time

        b, t = codes.shape[0], codes.shape[1]
        feed = codes if self.layout == "BTQ" else codes.transpose(0, 2, 1)
        feed = np.ascontiguousarray(feed, dtype=self._input_dtype)
        t0 = time.perf_counter()
        try:
            outs: list[Any] = self._sess.run(self._outputs, {self.input_name: feed})
        except Exception as exc:
            raise VocoderError(f"vocoder run failed on {b} x {t} frames: {exc}") from exc
        dt = (time.perf_counter() - t0) * 1000.0
        with self._lock:
            self.calls += 1
            self.total_ms += dt
        audio = np.asarray(outs[0])
        if self.audio_rank == 3 or audio.ndim == 3:
            if audio.ndim != 3 or audio.shape[1] != 1 or audio.shape[0] != b:
                raise VocoderError(f"vocoder returned audio shaped {list(audio.shape)}")
            wavs = audio[:, 0]
        elif audio.ndim == 2 and audio.shape[0] == b:
            wavs = audio
        elif b == 1:
            wavs = audio.reshape(1, -1)
        else:
            raise VocoderError(f"vocoder returned audio shaped {list(audio.shape)} for {b} rows")
        lengths = np.asarray(outs[1]).reshape(-1) if self.lengths_output is not None else None
        want = t * SAMPLES_PER_FRAME
        out: list[FloatArray] = []
        for i in range(b):
            wav = wavs[i]
            if lengths is not None:
                n = int(lengths[i] if lengths.shape[0] > i else lengths[0])
                if n < 0 or n > wav.shape[0]:
                    raise VocoderError(f"vocoder lengths output {n} outside 0..{wav.shape[0]}")
                wav = wav[:n]
            if wav.shape[0] != want:
                raise VocoderError(
                    f"vocoder returned {wav.shape[0]} samples for {t} frames, expected {want} "
                    f"({SAMPLES_PER_FRAME} per frame)"
                )
            clipped = np.clip(wav.astype(np.float32, copy=False), -1.0, 1.0)
            out.append(np.ascontiguousarray(clipped, dtype=np.float32))
        return out

    def decode(
        self,
        codes: npt.ArrayLike,
        *,
        chunk_frames: int | None = 300,
        left_context: int = 25,
    ) -> FloatArray:
        """Decode codes ``[T,16]`` to float32 audio of exactly ``T*1920`` samples in [-1, 1].

        Long inputs are decoded in windows of ``chunk_frames`` new frames with
        ``left_context`` frames before each (the official ``chunked_decode``);
        ``chunk_frames=None`` decodes everything in one run.
        """
        arr = _check_codes(codes)
        t = arr.shape[0]
        if t == 0:
            return np.zeros(0, dtype=np.float32)
        if chunk_frames is None or t <= chunk_frames:
            return self._run(arr)
        if chunk_frames < 1 or left_context < 0:
            raise ValueError("chunk_frames must be >= 1 and left_context >= 0")
        parts: list[FloatArray] = []
        for start in range(0, t, chunk_frames):
            ctx = min(left_context, start)
            wav = self._run(arr[start - ctx : start + chunk_frames])
            parts.append(wav[ctx * SAMPLES_PER_FRAME :])
        return np.concatenate(parts)

    def streaming(
        self,
        *,
        chunk_frames: int = 4,
        left_context: int = 25,
        first_chunk_frames: int | None = None,
        ref_codes: npt.ArrayLike | None = None,
        ramp: Sequence[int] | None = None,
    ) -> StreamingDecoder:
        return StreamingDecoder(
            self,
            chunk_frames=chunk_frames,
            left_context=left_context,
            first_chunk_frames=first_chunk_frames,
            ref_codes=ref_codes,
            ramp=ramp,
        )

    def close(self) -> None:
        self._sess = None


class StreamingDecoder:
    """Incremental decode: ``push`` frames, get audio every ``chunk_frames`` frames, ``flush``.

    Each chunk is decoded together with up to ``left_context`` earlier frames
    (or ICL reference codes, for the first chunks); the context's samples are
    dropped, so the concatenated output has exactly ``frames*1920`` samples.
    ``first_chunk_frames`` (default ``chunk_frames``) lets the first audio leave earlier;
    ``ramp`` (for example ``[1, 2]`` before chunks of 4) sets the sizes of the first
    chunks instead, so the first audio leaves after one frame and later chunks grow.
    ``runner`` (default ``vocoder._run``) decodes one window; a ``VocoderBatcher``
    there batches the windows of concurrent utterances.
    """

    def __init__(
        self,
        vocoder: Vocoder,
        *,
        chunk_frames: int = 4,
        left_context: int = 25,
        first_chunk_frames: int | None = None,
        ref_codes: npt.ArrayLike | None = None,
        ramp: Sequence[int] | None = None,
        runner: Callable[[IntArray], FloatArray] | None = None,
    ) -> None:
        if chunk_frames < 1:
            raise ValueError(f"chunk_frames must be >= 1, got {chunk_frames}")
        if left_context < 0:
            raise ValueError(f"left_context must be >= 0, got {left_context}")
        first = chunk_frames if first_chunk_frames is None else first_chunk_frames
        if first < 1:
            raise ValueError(f"first_chunk_frames must be >= 1, got {first}")
        self.ramp = [int(n) for n in ramp] if ramp else [first]
        if any(n < 1 for n in self.ramp):
            raise ValueError(f"ramp chunk sizes must be >= 1, got {list(self.ramp)}")
        self.vocoder = vocoder
        self._runner = runner or vocoder._run  # e.g. a ``VocoderBatcher.run`` shared by calls
        self.chunk_frames = chunk_frames
        self.first_chunk_frames = self.ramp[0]
        self.left_context = left_context
        ctx = (
            _check_codes(ref_codes)
            if ref_codes is not None
            else np.zeros((0, NUM_CODEBOOKS), np.int64)
        )
        self._context: IntArray = ctx[ctx.shape[0] - min(left_context, ctx.shape[0]) :].copy()
        self._pending: list[IntArray] = []
        self.frames_in = 0
        self.samples_out = 0
        self.chunks_out = 0

    def push(self, frame: npt.ArrayLike) -> FloatArray | None:
        """Add one frame (16 codes); return new audio when a chunk completes, else None."""
        row = _check_codes(frame)
        if row.shape[0] != 1:
            raise ValueError(f"push takes one frame of {NUM_CODEBOOKS} codes")
        self._pending.append(row)
        self.frames_in += 1
        i = self.chunks_out
        need = self.ramp[i] if i < len(self.ramp) else self.chunk_frames
        if len(self._pending) >= need:
            return self._decode_pending()
        return None

    def flush(self) -> FloatArray:
        """Decode what is pending (possibly nothing) and return it."""
        if not self._pending:
            return np.zeros(0, dtype=np.float32)
        return self._decode_pending()

    @property
    def pending_frames(self) -> int:
        return len(self._pending)

    def _decode_pending(self) -> FloatArray:
        new = np.concatenate(self._pending, axis=0)
        self._pending = []
        ctx = self._context
        window = np.concatenate([ctx, new], axis=0) if ctx.shape[0] else new
        wav = self._runner(window)[ctx.shape[0] * SAMPLES_PER_FRAME :]
        keep = min(self.left_context, window.shape[0])
        self._context = window[window.shape[0] - keep :].copy()
        self.samples_out += wav.shape[0]
        self.chunks_out += 1
        return wav
