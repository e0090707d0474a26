"""Voice-clone prompts (Base checkpoints): from a reference WAV to ``PROMPT.npz`` and back.

``make_prompt`` does what the official ``create_voice_clone_prompt`` does,
with the ONNX files ``qwen3-convert`` writes (or the torch modules of an
official checkpoint): the WAV is read (PCM 8/16/24/32-bit or IEEE float,
any channel count, mixed to mono), resampled to 24 kHz, checked (empty or
under ``MIN_SECONDS``: an error; over ``MAX_SECONDS``: trimmed with a
warning), the x-vector is the speaker encoder's output on its log-mel
features, and, unless x-vector only, the reference codes ``[R,16]`` are the
codec encoder's output on the audio zero-padded to a multiple of 1920 samples.

The prompt file (numpy ``.npz``, no pickles) holds ``format`` (``FORMAT``),
``model_size`` (``0.6b``/``1.7b``), ``x_vector`` float32 ``[hidden]``,
``x_vector_only``, ``ref_text``, ``ref_codes`` int64 ``[R,16]`` (ICL only),
``source`` and ``seconds``. ``load_prompt`` refuses a prompt made for another
model size, with the reason.
"""

from __future__ import annotations

import io
import struct
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

SAMPLE_RATE = 24000
HOP = 1920
MIN_SECONDS = 1.0
MAX_SECONDS = 30.0
FORMAT = "ttsdock-qwen3-clone-prompt/1"
SIZES = ("0.6b", "1.7b")
#: The talker width (= x-vector width) of each released size.
SIZE_WIDTH = {"0.6b": 1024, "1.7b": 2048}

FloatArray = npt.NDArray[np.float32]
IntArray = npt.NDArray[np.int64]


class ClonePromptError(Exception):
    """A reference recording or a prompt file that cannot be used; the message says why."""


class ClonePromptWarning(UserWarning):
    """Something was changed to make the prompt (e.g. a long reference trimmed)."""


# -- WAV input ----------------------------------------------------------------------------------


def read_wav(path: str | Path) -> tuple[FloatArray, int]:
    """Mono float32 samples and the sample rate of a RIFF/WAVE file."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise ClonePromptError(f"reference {str(p)!r}: cannot be read: {exc.strerror}") from exc
    return parse_wav(data, name=str(p))


def parse_wav(data: bytes, *, name: str = "<bytes>") -> tuple[FloatArray, int]:
    where = f"reference {name!r}"
    if len(data) < 12 or data[:4] not in (b"RIFF", b"RF64") or data[8:12] != b"WAVE":
        raise ClonePromptError(f"{where}: not a WAV file (unreadable format; expected RIFF/WAVE)")
    f = io.BytesIO(data)
    f.seek(12)
    fmt: tuple[int, int, int, int] | None = None
    pcm: bytes | None = None
    while True:
        head = f.read(8)
        if len(head) < 8:
            break
        cid, size = head[:4], struct.unpack("<I", head[4:])[0]
        body = f.read(size)
        if size % 2:
            f.read(1)
        if cid == b"fmt ":
            if len(body) < 16:
                raise ClonePromptError(f"{where}: truncated fmt chunk")
            tag, channels, rate, _, _, bits = struct.unpack("<HHIIHH", body[:16])
            if tag == 0xFFFE and len(body) >= 26:  # WAVE_FORMAT_EXTENSIBLE: the sub-format
                tag = struct.unpack("<H", body[24:26])[0]
            fmt = (tag, channels, rate, bits)
        elif cid == b"data":
            pcm = body
            break
    if fmt is None:
        raise ClonePromptError(f"{where}: no fmt chunk (unreadable format)")
    if pcm is None:
        raise ClonePromptError(f"{where}: no data chunk (empty recording)")
    tag, channels, rate, bits = fmt
    if channels < 1 or rate < 1000:
        raise ClonePromptError(f"{where}: bad header ({channels} channels, {rate} Hz)")
    width = bits // 8
    frame = width * channels
    n = len(pcm) // frame if frame else 0
    raw = pcm[: n * frame]
    if tag == 1 and bits in (8, 16, 24, 32):
        if bits == 8:
            x = (np.frombuffer(raw, np.uint8).astype(np.float32) - 128.0) / 128.0
        elif bits == 24:
            b = np.frombuffer(raw, np.uint8).reshape(-1, 3).astype(np.int32)
            v = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)
            v = np.where(v >= 1 << 23, v - (1 << 24), v)
            x = v.astype(np.float32) / float(1 << 23)
        else:
            dt = np.dtype("<i2") if bits == 16 else np.dtype("<i4")
            x = np.frombuffer(raw, dt).astype(np.float32) / float(1 << (bits - 1))
    elif tag == 3 and bits in (32, 64):
        x = np.frombuffer(raw, "<f4" if bits == 32 else "<f8").astype(np.float32)
    else:
        raise ClonePromptError(
            f"{where}: unsupported WAV encoding (format tag {tag}, {bits} bits); "
            "use PCM 8/16/24/32-bit or IEEE float"
        )
    x = x.reshape(-1, channels).mean(axis=1) if channels > 1 else x
    return np.ascontiguousarray(x, dtype=np.float32), int(rate)


def resample(audio: npt.ArrayLike, rate: int, target: int = SAMPLE_RATE) -> FloatArray:
    """Band-limited (Kaiser-windowed sinc) resampling from ``rate`` to ``target`` Hz.

    Polyphase: with ``target/rate = L/M`` in lowest terms, output ``n`` sits at input
    position ``n*M/L``, whose fractional part takes only ``L`` values, so the filter taps
    are tabulated once per phase.
    """
    import math

    x = np.asarray(audio, dtype=np.float64).reshape(-1)
    if rate == target or x.size == 0:
        return x.astype(np.float32)
    g = math.gcd(int(rate), int(target))
    up, down = target // g, rate // g
    ratio = target / rate
    cutoff = min(1.0, ratio) * 0.97  # of the lower Nyquist frequency, a little headroom
    reach = int(np.ceil(32 / min(1.0, ratio)))  # 32 taps per side at the lower rate
    beta = 8.0
    ks = np.arange(-reach + 1, reach + 1)
    frac = np.arange(up) * down % up / up  # fractional input position of each phase
    d = frac[:, None] - ks[None, :]  # [phase, tap]: distance in input samples
    arg = np.clip(1.0 - (d / reach) ** 2, 0.0, 1.0)
    table = cutoff * np.sinc(cutoff * d) * np.i0(beta * np.sqrt(arg)) / np.i0(beta)
    table[np.abs(d) >= reach] = 0.0
    n_out = round(x.size * ratio)
    pos = np.arange(n_out, dtype=np.int64) * down
    base, phase = pos // up, pos % up
    padded = np.pad(x, (reach, reach + 1))
    out = np.zeros(n_out)
    for j, k in enumerate(ks):
        out += table[phase, j] * padded[base + k + reach]
    return out.astype(np.float32)


def prepare_reference(audio: npt.ArrayLike, rate: int, *, name: str = "reference") -> FloatArray:
    """Resampled to 24 kHz and checked; over ``MAX_SECONDS`` it is trimmed with a warning."""
    x = np.asarray(audio, dtype=np.float32).reshape(-1)
    if x.size == 0:
        raise ClonePromptError(f"{name}: the recording is empty (0 samples)")
    if not np.all(np.isfinite(x)):
        raise ClonePromptError(f"{name}: the recording has NaN or infinite samples")
    y = resample(x, rate)
    secs = y.size / SAMPLE_RATE
    if secs < MIN_SECONDS:
        raise ClonePromptError(
            f"{name}: the recording is {secs:.2f} s long; a voice clone needs at least "
            f"{MIN_SECONDS:.0f} s (3-15 s of clear speech work best)"
        )
    if float(np.max(np.abs(y))) < 1e-4:
        raise ClonePromptError(f"{name}: the recording is silent")
    if secs > MAX_SECONDS:
        warnings.warn(
            f"{name}: the recording is {secs:.1f} s long; only the first {MAX_SECONDS:.0f} s "
            "are used",
            ClonePromptWarning,
            stacklevel=2,
        )
        y = y[: int(MAX_SECONDS * SAMPLE_RATE)]
    return np.clip(y, -1.0, 1.0).astype(np.float32)


# -- the prompt -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClonePrompt:
    model_size: str
    x_vector: FloatArray
    ref_codes: IntArray | None = None
    ref_text: str | None = None
    source: str = ""
    seconds: float = 0.0

    @property
    def icl(self) -> bool:
        return self.ref_codes is not None

    def save(self, path: str | Path) -> Path:
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        arrays: dict[str, np.ndarray] = {
            "format": np.array(FORMAT),
            "model_size": np.array(self.model_size),
            "x_vector": np.asarray(self.x_vector, np.float32).reshape(-1),
            "x_vector_only": np.array(not self.icl),
            "ref_text": np.array(self.ref_text or ""),
            "source": np.array(self.source),
            "seconds": np.array(self.seconds, np.float64),
        }
        if self.ref_codes is not None:
            arrays["ref_codes"] = np.asarray(self.ref_codes, np.int64)
        with out.open("wb") as fh:
            np.savez(fh, **arrays)  # type: ignore[arg-type]
        return out


def load_prompt(
    path: str | Path, *, model_size: str | None = None, width: int | None = None
) -> ClonePrompt:
    """Read and check a prompt file; ``model_size``, ``width``: the engine's (mismatch refused)."""
    p = Path(path)
    where = f"clone prompt {str(p)!r}"
    try:
        with np.load(p, allow_pickle=False) as z:
            d = {k: z[k] for k in z.files}
    except FileNotFoundError:
        raise ClonePromptError(f"{where}: no such file") from None
    except (OSError, ValueError) as exc:
        raise ClonePromptError(f"{where}: not a prompt file (.npz): {exc}") from exc
    if str(d.get("format", "")) != FORMAT:
        raise ClonePromptError(f"{where}: not a ttsdock clone prompt (format {FORMAT} expected)")
    for key in ("model_size", "x_vector", "x_vector_only"):
        if key not in d:
            raise ClonePromptError(f"{where}: missing {key!r}")
    size = str(d["model_size"])
    vec = np.asarray(d["x_vector"], np.float32).reshape(-1)
    if vec.size == 0 or not np.all(np.isfinite(vec)):
        raise ClonePromptError(f"{where}: the x-vector is empty or not finite")
    if model_size is not None and size != model_size:
        raise ClonePromptError(
            f"{where}: made for the {size} model (x-vector of {vec.size}), but this engine runs "
            f"the {model_size} model; make the prompt again with that checkpoint"
        )
    if width is not None and vec.size != width:
        raise ClonePromptError(
            f"{where}: its x-vector has {vec.size} values, the model's talker width is {width} "
            f"(prompt made for {size}); make the prompt again with this checkpoint"
        )
    codes = None
    text = str(d.get("ref_text", "")) or None
    if not bool(d["x_vector_only"]):
        if "ref_codes" not in d:
            raise ClonePromptError(f"{where}: an ICL prompt without ref_codes")
        codes = np.asarray(d["ref_codes"])
        if codes.ndim != 2 or codes.shape[1] != 16 or codes.shape[0] < 1:
            raise ClonePromptError(f"{where}: ref_codes must be [frames, 16]")
        if not np.issubdtype(codes.dtype, np.integer) or codes.min() < 0 or codes.max() > 2047:
            raise ClonePromptError(f"{where}: ref_codes must be integers in 0..2047")
        if not text:
            raise ClonePromptError(f"{where}: an ICL prompt needs its reference text")
        codes = codes.astype(np.int64)
    return ClonePrompt(
        model_size=size,
        x_vector=vec,
        ref_codes=codes,
        ref_text=text,
        source=str(d.get("source", "")),
        seconds=float(d.get("seconds", 0.0)),
    )


XVectorFn = Callable[[FloatArray], FloatArray]  # log-mel [frames,128] -> [hidden]
CodesFn = Callable[[FloatArray], IntArray]  # audio [S] (S % 1920 == 0) -> [S/1920, 16]


def make_prompt(
    audio: FloatArray,
    *,
    model_size: str,
    x_vector: XVectorFn,
    codes: CodesFn | None,
    ref_text: str | None,
    source: str = "",
) -> ClonePrompt:
    """A prompt from prepared 24 kHz audio (``prepare_reference``); no ``codes``: x-vector only."""
    from engines.qwen3.conversion.speaker_encoder import log_mel

    if model_size not in SIZES:
        raise ClonePromptError(f"unknown model size {model_size!r}; expected 0.6b or 1.7b")
    if codes is not None and not (ref_text and ref_text.strip()):
        raise ClonePromptError(
            "ICL voice cloning needs --ref-text (the transcript of the reference); "
            "give it, or use --x-vector-only"
        )
    vec = np.asarray(x_vector(log_mel(audio)), np.float32).reshape(-1)
    ref = None
    if codes is not None:
        n = -(-audio.size // HOP) * HOP
        ref = np.asarray(codes(np.pad(audio, (0, n - audio.size))), np.int64)
        if ref.shape != (n // HOP, 16):
            raise ClonePromptError(f"codec encoder returned codes {list(ref.shape)}")
    return ClonePrompt(
        model_size=model_size,
        x_vector=vec,
        ref_codes=ref,
        ref_text=ref_text.strip() if (ref is not None and ref_text) else None,
        source=source,
        seconds=round(audio.size / SAMPLE_RATE, 3),
    )
