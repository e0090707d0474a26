"""The QTS GGUF contract (this project's format, written by ``qwen3-convert``): read
talker / code-predictor / tokenizer GGUF files.

Files are read with ``gguf.GGUFReader`` (memory-mapped). Tensors are routed by
name prefix (``talker.*``, ``code_pred.*``), so one bundled file and split
files load alike; metadata is looked up in the talker file first for talker
keys and in the predictor file first for predictor keys. Any tensor may be
F32, F16, BF16, Q8_0 or a K-quant: ``gguf.quants.dequantize`` turns it into
float32, and the (huge) text embedding is gathered row by row instead.

Every problem raises ``GgufError`` naming the file and the reason.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import numpy.typing as npt

from engines.qwen3.errors import GgufError
from engines.qwen3.model.config import (
    CodecIds,
    CodePredictorConfig,
    LayerWeights,
    ModelMetadata,
    TalkerConfig,
    TextIds,
    TtsWeights,
)
from engines.qwen3.modes import model_type_or_none, size_or_none
from engines.qwen3.weights import gguf_keys as keys

F32Array = npt.NDArray[np.float32]

ARCH = "qwen3-tts"
NS = keys.NS
TALKER_NS = keys.TALKER_NS
PRED_NAMESPACES = keys.PRED_NAMESPACES

LAYER_SUFFIXES = (
    "attn_norm",
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_output",
    "attn_q_norm",
    "attn_k_norm",
    "ffn_norm",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
)

#: Accepted names of the optional talker->predictor projection, in lookup order.
PROJECTION_PREFIXES = (
    "code_pred.small_to_mtp_projection",
    "talker.code_predictor.small_to_mtp_projection",
    "small_to_mtp_projection",
    "code_pred.mtp_proj",
    "code_pred.small_to_mtp",
)

#: Real 12 Hz codec control ids (the official checkpoint's ``config.json``) and text
#: ids; used when the metadata lacks them.
DEFAULT_CODEC_IDS = {f"{k.field}_id": k.default for k in keys.CODEC.keys}
DEFAULT_TEXT_IDS = {f"{k.field}_id": k.default for k in keys.TEXT.keys}

_FLOAT_TYPES = (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16)


# -- files and tensors ------------------------------------------------------------------------


class TensorRef:
    """One tensor of one GGUF file; dequantised on demand."""

    __slots__ = ("_t", "name", "path")

    def __init__(self, path: Path, tensor: Any) -> None:
        self.path = path
        self.name: str = tensor.name
        self._t = tensor

    @property
    def ggml_shape(self) -> tuple[int, ...]:
        """GGML ``ne`` order, innermost first (a torch Linear [out, in] is ``(in, out)``)."""
        return tuple(int(x) for x in self._t.shape)

    @property
    def shape(self) -> tuple[int, ...]:
        """numpy/torch order."""
        return tuple(reversed(self.ggml_shape))

    @property
    def type_name(self) -> str:
        return str(self._t.tensor_type.name)

    def _dequantize(self, data: Any) -> F32Array:
        qtype = self._t.tensor_type
        try:
            if qtype in _FLOAT_TYPES:
                out = np.asarray(data, dtype=np.float32)
            else:
                out = gguf.quants.dequantize(np.asarray(data), qtype)
        except NotImplementedError as exc:
            raise GgufError(
                self.path,
                f"tensor {self.name!r} has type {self.type_name}, which cannot be dequantized "
                f"(supported: F32, F16, BF16, Q4_0..Q8_0, Q2_K..Q6_K)",
            ) from exc
        except (ValueError, TypeError) as exc:
            raise GgufError(self.path, f"tensor {self.name!r}: bad data ({exc})") from exc
        out = np.ascontiguousarray(out, dtype=np.float32)
        return out if out.flags.writeable else out.copy()

    def numpy(self) -> F32Array:
        """The whole tensor as float32 in numpy/torch order."""
        out = self._dequantize(self._t.data)
        return out.reshape(self.shape)

    def rows(self, ids: Sequence[int] | npt.NDArray[np.int64]) -> F32Array:
        """Rows ``ids`` of a 2-D tensor (e.g. an embedding) without dequantising the rest."""
        idx = np.asarray(ids, dtype=np.int64).reshape(-1)
        n_rows = self.shape[0]
        if idx.size and (idx.min() < 0 or idx.max() >= n_rows):
            raise GgufError(
                self.path, f"row id out of range for tensor {self.name!r} with {n_rows} rows"
            )
        out = self._dequantize(self._t.data[idx])
        return out.reshape(idx.size, self.shape[-1])


class _Reader(gguf.GGUFReader):
    """``GGUFReader`` with a fast path for string arrays (151k tokens and merges).

    The stock reader creates two numpy views per string through a generic
    helper (~5 s for a Qwen2 vocabulary); this builds the same parts with
    plain slicing. Only little-endian files on little-endian hosts take the
    fast path; everything else is the stock code.
    """

    def _get_field_parts(
        self, orig_offs: int, raw_type: int
    ) -> tuple[int, list[npt.NDArray[Any]], list[int], list[gguf.GGUFValueType]]:
        if (
            raw_type != gguf.GGUFValueType.ARRAY
            or self.byte_order != "I"
            or sys.byteorder != "little"
        ):
            return super()._get_field_parts(orig_offs, raw_type)
        plain = self.__dict__.get("_plain")
        if plain is None:
            plain = np.asarray(self.data).view(np.ndarray)  # no memmap subclass per slice
            self.__dict__["_plain"] = plain
        itype = plain[orig_offs : orig_offs + 4].view(np.uint32)
        alen = plain[orig_offs + 4 : orig_offs + 12].view(np.uint64)
        sub = gguf.GGUFValueType(int(itype[0]))
        n = int(alen[0])
        offs = orig_offs + 12
        parts: list[npt.NDArray[Any]] = [itype, alen]
        idxs: list[int] = []
        if sub == gguf.GGUFValueType.STRING:
            buf = memoryview(plain)  # type: ignore[arg-type]
            unpack = struct.unpack_from
            for _ in range(n):
                (slen,) = unpack("<Q", buf, offs)
                parts.append(plain[offs : offs + 8].view(np.uint64))
                parts.append(plain[offs + 8 : offs + 8 + slen])
                idxs.append(len(parts) - 1)
                offs += 8 + slen
        elif (nptype := self.gguf_scalar_to_np.get(sub)) is not None:
            size = np.dtype(nptype).itemsize
            arr = plain[offs : offs + n * size].view(nptype)
            parts.extend(arr[i : i + 1] for i in range(n))
            idxs = list(range(2, 2 + n))
            offs += n * size
        else:
            return super()._get_field_parts(orig_offs, raw_type)
        if offs > plain.shape[0]:
            raise ValueError("array metadata extends past the end of the file")
        return offs - orig_offs, parts, idxs, [gguf.GGUFValueType.ARRAY, sub]


class GgufFile:
    """One opened GGUF file: its metadata fields and tensors."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        p = self.path
        if not p.exists():
            raise GgufError(p, "file not found")
        if p.is_dir():
            raise GgufError(p, "is a directory, expected a GGUF file")
        size = p.stat().st_size
        if size < 24:
            raise GgufError(p, f"too small to be a GGUF file ({size} bytes; truncated?)")
        with p.open("rb") as fh:
            magic = fh.read(4)
        if magic != b"GGUF":
            raise GgufError(p, f"not a GGUF file (magic {magic!r}, expected b'GGUF')")
        try:
            self.reader = _Reader(p, "r")
        except ValueError as exc:
            msg = str(exc)
            if "GGMLQuantizationType" in msg or "is not a valid" in msg:
                raise GgufError(
                    p, f"unknown tensor type (unsupported quantization?): {msg}"
                ) from exc
            raise GgufError(p, f"cannot parse GGUF (truncated or corrupt?): {msg}") from exc
        except (OSError, KeyError, IndexError, EOFError) as exc:
            raise GgufError(p, f"cannot parse GGUF (truncated or corrupt?): {exc}") from exc
        self.fields: dict[str, Any] = dict(self.reader.fields)
        self.tensors: dict[str, TensorRef] = {}
        for t in self.reader.tensors:
            end = int(t.data_offset) + int(t.n_bytes)
            if end > size:
                raise GgufError(
                    p, f"tensor {t.name!r} extends past the end of the file (truncated?)"
                )
            self.tensors[t.name] = TensorRef(p, t)

    def get(self, key: str) -> Any:
        """A metadata value as a Python object (str/int/float/bool/list), or None."""
        f = self.fields.get(key)
        if f is None:
            return None
        try:
            return f.contents()
        except Exception as exc:  # malformed field
            raise GgufError(self.path, f"metadata {key!r} cannot be read: {exc}") from exc

    def get_str(self, key: str) -> str | None:
        v = self.get(key)
        return v if isinstance(v, str) else None

    def keys_with_prefix(self, prefix: str) -> list[str]:
        return [k for k in self.fields if k.startswith(prefix)]


_OPEN_CACHE: dict[tuple[str, int, int], GgufFile] = {}


def open_gguf(path: str | Path) -> GgufFile:
    """Open (or reuse an already opened, unchanged) GGUF file."""
    p = Path(path)
    try:
        st = p.stat()
        key = (str(p.resolve()), st.st_mtime_ns, st.st_size)
    except OSError:
        return GgufFile(p)  # raises the clear error
    cached = _OPEN_CACHE.get(key)
    if cached is None:
        cached = GgufFile(p)
        if len(_OPEN_CACHE) > 16:
            _OPEN_CACHE.clear()
        _OPEN_CACHE[key] = cached
    return cached


class GgufBundle:
    """The talker and code-predictor files seen as one model (they may be the same file)."""

    def __init__(self, talker: str | Path | GgufFile, predictor: str | Path | GgufFile) -> None:
        self.talker = talker if isinstance(talker, GgufFile) else open_gguf(talker)
        if isinstance(predictor, GgufFile):
            self.predictor = predictor
        elif Path(predictor) == self.talker.path:
            self.predictor = self.talker
        else:
            self.predictor = open_gguf(predictor)
        self.files: list[GgufFile] = [self.talker]
        if self.predictor is not self.talker:
            self.files.append(self.predictor)
        self.tensors: dict[str, TensorRef] = {}
        # Route by prefix: talker.* prefers the talker file, everything else the predictor file.
        for name, ref in self.predictor.tensors.items():
            self.tensors[name] = ref
        for name, ref in self.talker.tensors.items():
            if name.startswith("talker.") or name not in self.tensors:
                self.tensors[name] = ref

    @property
    def describe(self) -> str:
        return " + ".join(str(f.path) for f in self.files)

    def get(self, key: str, *, prefer_predictor: bool = False) -> Any:
        order = list(reversed(self.files)) if prefer_predictor else self.files
        for f in order:
            v = f.get(key)
            if v is not None:
                return v
        return None

    def keys_with_prefix(self, prefix: str) -> list[str]:
        seen: list[str] = []
        for f in self.files:
            for k in f.keys_with_prefix(prefix):
                if k not in seen:
                    seen.append(k)
        return seen

    def tensor(self, name: str) -> TensorRef | None:
        return self.tensors.get(name)

    def require(self, name: str, *, role: str = "talker") -> TensorRef:
        t = self.tensors.get(name)
        if t is None:
            where = self.talker.path if role == "talker" else self.predictor.path
            raise GgufError(where, f"required tensor {name!r} is missing")
        return t


# -- metadata ---------------------------------------------------------------------------------


def _as_int(path: Path, key: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise GgufError(path, f"metadata {key!r} must be a number, got {v!r}")
    if isinstance(v, float) and not v.is_integer():
        raise GgufError(path, f"metadata {key!r} must be an integer, got {v!r}")
    return int(v)


class _Facts:
    """Tensor shapes and names of a bundle, for metadata derivations (``gguf_keys``)."""

    def __init__(self, b: GgufBundle) -> None:
        self.b = b

    def ggml_shape(self, name: str) -> tuple[int, ...] | None:
        t = self.b.tensor(name)
        return t.ggml_shape if t is not None else None

    def names(self) -> Sequence[str]:
        return list(self.b.tensors)


def read_metadata(bundle: GgufBundle) -> ModelMetadata:
    """Parse the QTS metadata of a talker/predictor pair (no tensor data is touched).

    Scalars come from the one key table of ``gguf_keys`` (which the converter writes
    from); the language, speaker and dialect key families are read here.
    """
    b = bundle
    tpath, ppath = b.talker.path, b.predictor.path

    def tget(*keys: str) -> Any:
        for k in keys:
            v = b.get(k)
            if v is not None:
                return v
        return None

    def lookup(key: str, prefer_predictor: bool) -> Any:
        return b.get(key, prefer_predictor=prefer_predictor)

    facts = _Facts(b)
    done: dict[str, dict[str, Any]] = {}
    for group in (keys.TALKER, keys.PREDICTOR, keys.CODEC, keys.TEXT):
        try:
            done[group.name] = keys.read_group(group, lookup, facts, done)
        except keys.MetaError as exc:
            raise GgufError(ppath if exc.predictor else tpath, exc.reason) from None
    talker = TalkerConfig(**done["talker"])
    predictor = CodePredictorConfig(**done["predictor"])
    codec = CodecIds(**done["codec"])
    text = TextIds(**done["text"])

    languages = _named_ints(b, keys.LANGUAGE_PREFIX, tpath)
    if not languages:
        languages = _paired_arrays(b, NS + "codec.language_names", NS + "codec.language_ids", tpath)
    speakers = _named_ints(b, keys.SPEAKER_PREFIX, tpath)
    dialects: dict[str, str] = {}
    for key in b.keys_with_prefix(keys.DIALECT_PREFIX):
        name = key[len(keys.DIALECT_PREFIX) :].lower()
        v = b.get(key)
        if isinstance(v, str) and v and v.lower() != "false":
            dialects[name] = v.lower()
        elif v is False or v == "" or (isinstance(v, str) and v.lower() == "false"):
            continue
        else:
            raise GgufError(tpath, f"metadata {key!r} must be a dialect name or false, got {v!r}")
    if not speakers:
        speakers = _paired_arrays(b, NS + "codec.speaker_names", NS + "codec.speaker_ids", tpath)
        names = b.get(NS + "codec.speaker_names")
        dia = b.get(NS + "codec.speaker_dialects")
        if isinstance(names, list) and isinstance(dia, list) and len(dia) == len(names):
            for n, d in zip(names, dia, strict=True):
                if isinstance(d, str) and d:
                    dialects[str(n).lower()] = d.lower()
    for name, sid in speakers.items():
        if not 0 <= sid < talker.vocab_size:
            raise GgufError(
                tpath,
                f"preset speaker {name!r} has codec id {sid}, outside the codec vocabulary "
                f"[0, {talker.vocab_size})",
            )
    for lang, lid in languages.items():
        if not 0 <= lid < talker.vocab_size:
            raise GgufError(tpath, f"language {lang!r} has codec id {lid} outside the vocabulary")
    for name, dialect in dialects.items():
        if dialect not in languages:
            raise GgufError(
                tpath,
                f"speaker {name!r} has dialect {dialect!r} but no "
                f"{TALKER_NS}codec_language_id.{dialect} entry",
            )

    mtype = tget(*keys.MODEL_TYPE_KEYS)
    msize = tget(*keys.MODEL_SIZE_KEYS)
    model_type = None
    if isinstance(mtype, str) and mtype:
        model_type = model_type_or_none(mtype.strip().lower().replace("-", "_"))
        if model_type is None:
            raise GgufError(
                tpath, f"unknown {NS}tts_model_type {mtype!r} (base, custom_voice, voice_design)"
            )
    model_size = None
    if isinstance(msize, str) and msize:
        model_size = size_or_none(msize.strip().lower())
        if model_size is None:
            raise GgufError(tpath, f"unknown {NS}tts_model_size {msize!r} (0.6b or 1.7b)")
    return ModelMetadata(
        talker=talker,
        predictor=predictor,
        codec=codec,
        text=text,
        languages=languages,
        speakers=speakers,
        dialects=dialects,
        model_type=model_type,
        model_size=model_size,
    )


def _named_ints(b: GgufBundle, prefix: str, path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    for key in b.keys_with_prefix(prefix):
        v = b.get(key)
        if isinstance(v, list) and len(v) == 1:  # tolerate a one-element array
            v = v[0]
        out[key[len(prefix) :].lower()] = _as_int(path, key, v)
    return out


def _paired_arrays(b: GgufBundle, names_key: str, ids_key: str, path: Path) -> dict[str, int]:
    names, ids = b.get(names_key), b.get(ids_key)
    if names is None or ids is None:
        return {}
    if not isinstance(names, list) or not isinstance(ids, list) or len(names) != len(ids):
        raise GgufError(path, f"metadata {names_key!r} and {ids_key!r} must be equal-length arrays")
    return {str(n).lower(): _as_int(path, ids_key, i) for n, i in zip(names, ids, strict=True)}


# -- weights ----------------------------------------------------------------------------------


def _load(t: TensorRef, ggml_shape: Sequence[int], what: str) -> F32Array:
    if tuple(t.ggml_shape) != tuple(ggml_shape):
        raise GgufError(
            t.path,
            f"tensor {t.name!r} ({what}) has GGML shape {list(t.ggml_shape)}, "
            f"expected {list(ggml_shape)}",
        )
    return t.numpy()


def _load_layers(
    b: GgufBundle,
    prefix: str,
    role: str,
    n_layers: int,
    width: int,
    n_heads: int,
    n_kv: int,
    head_dim: int,
    ffn: int,
) -> list[LayerWeights]:
    layers = []
    qd, kd = n_heads * head_dim, n_kv * head_dim
    shapes = {
        "attn_norm": [width],
        "attn_q": [width, qd],
        "attn_k": [width, kd],
        "attn_v": [width, kd],
        "attn_output": [qd, width],
        "attn_q_norm": [head_dim],
        "attn_k_norm": [head_dim],
        "ffn_norm": [width],
        "ffn_gate": [width, ffn],
        "ffn_up": [width, ffn],
        "ffn_down": [ffn, width],
    }
    for i in range(n_layers):
        w = {
            s: _load(
                b.require(f"{prefix}.blk.{i}.{s}.weight", role=role), shapes[s], f"{role} layer {i}"
            )
            for s in LAYER_SUFFIXES
        }
        layers.append(
            LayerWeights(
                attn_norm=w["attn_norm"],
                q=w["attn_q"],
                k=w["attn_k"],
                v=w["attn_v"],
                o=w["attn_output"],
                q_norm=w["attn_q_norm"],
                k_norm=w["attn_k_norm"],
                ffn_norm=w["ffn_norm"],
                gate=w["ffn_gate"],
                up=w["ffn_up"],
                down=w["ffn_down"],
            )
        )
    return layers


def find_projection(b: GgufBundle) -> tuple[TensorRef | None, TensorRef | None]:
    """The optional talker->predictor projection weight and bias (any accepted prefix)."""
    w = bias = None
    for prefix in PROJECTION_PREFIXES:
        w = w or b.tensor(prefix + ".weight")
        bias = bias or b.tensor(prefix + ".bias")
    return w, bias


def check_projection(
    meta: ModelMetadata, w: TensorRef | None, bias: TensorRef | None, where: Path
) -> None:
    """Shape rules of the QTS GGUF contract: GGML [talker_width, predictor_width] and
    [predictor_width]."""
    tw, pw = meta.talker.hidden_size, meta.predictor.hidden_size
    if tw != pw and (w is None or bias is None):
        missing = (
            "weight and bias" if w is None and bias is None else ("weight" if w is None else "bias")
        )
        raise GgufError(
            where,
            f"talker width {tw} differs from predictor width {pw}, so the projection "
            f"code_pred.small_to_mtp_projection.{{weight,bias}} is required; {missing} missing",
        )
    if (w is None) != (bias is None):
        present = w if w is not None else bias
        assert present is not None
        raise GgufError(
            present.path,
            f"projection tensor {present.name!r} has no matching "
            f"{'bias' if bias is None else 'weight'}",
        )
    if w is not None and bias is not None:
        if w.ggml_shape != (tw, pw):
            raise GgufError(
                w.path,
                f"projection weight {w.name!r} has GGML shape {list(w.ggml_shape)}, expected "
                f"[{tw}, {pw}] (talker width, predictor width)",
            )
        if bias.ggml_shape != (pw,):
            raise GgufError(
                bias.path,
                f"projection bias {bias.name!r} has GGML shape {list(bias.ggml_shape)}, "
                f"expected [{pw}] (predictor width)",
            )


def load_weights(bundle: GgufBundle, meta: ModelMetadata | None = None) -> TtsWeights:
    """Load and shape-check every tensor the model needs (dequantised to float32)."""
    b = bundle
    meta = meta or read_metadata(b)
    tc, pc = meta.talker, meta.predictor
    h = tc.hidden_size
    text_embd = b.require("talker.text_embd.weight")
    if text_embd.ggml_shape != (tc.text_hidden_size, tc.text_vocab_size):
        raise GgufError(
            text_embd.path,
            f"tensor 'talker.text_embd.weight' has GGML shape {list(text_embd.ggml_shape)}, "
            f"expected [{tc.text_hidden_size}, {tc.text_vocab_size}]",
        )
    th = tc.text_hidden_size
    n_groups = tc.num_code_groups - 1
    proj_w, proj_b = find_projection(b)
    check_projection(meta, proj_w, proj_b, b.predictor.path)
    return TtsWeights(
        meta=meta,
        text_embd=text_embd,
        text_fc1_w=_load(b.require("talker.text_proj.fc1.weight"), [th, th], "text projection"),
        text_fc1_b=_load(b.require("talker.text_proj.fc1.bias"), [th], "text projection"),
        text_fc2_w=_load(b.require("talker.text_proj.fc2.weight"), [th, h], "text projection"),
        text_fc2_b=_load(b.require("talker.text_proj.fc2.bias"), [h], "text projection"),
        codec_embd=_load(
            b.require("talker.codec_embd.weight"), [h, tc.vocab_size], "codec embedding"
        ),
        codec_head=_load(b.require("talker.codec_head.weight"), [h, tc.vocab_size], "codec head"),
        talker_norm=_load(b.require("talker.output_norm.weight"), [h], "talker output norm"),
        talker_layers=_load_layers(
            b,
            "talker",
            "talker",
            tc.n_layers,
            h,
            tc.n_attention_heads,
            tc.n_key_value_heads,
            tc.head_dim,
            tc.intermediate_size,
        ),
        cp_embd=[
            _load(
                b.require(f"code_pred.codec_embd.{i}.weight", role="predictor"),
                [h, pc.vocab_size],
                "predictor codec embedding (talker width)",
            )
            for i in range(n_groups)
        ],
        cp_heads=[
            _load(
                b.require(f"code_pred.lm_head.{i}.weight", role="predictor"),
                [pc.hidden_size, pc.vocab_size],
                "predictor head",
            )
            for i in range(n_groups)
        ],
        cp_norm=_load(
            b.require("code_pred.output_norm.weight", role="predictor"),
            [pc.hidden_size],
            "predictor norm",
        ),
        cp_layers=_load_layers(
            b,
            "code_pred",
            "predictor",
            pc.n_layers,
            pc.hidden_size,
            pc.n_attention_heads,
            pc.n_key_value_heads,
            pc.head_dim,
            pc.intermediate_size,
        ),
        proj_w=proj_w.numpy() if proj_w is not None else None,
        proj_b=proj_b.numpy() if proj_b is not None else None,
    )


def tokenizer_fields(path: str | Path) -> GgufFile:
    """Open the tokenizer GGUF (which may be the talker or a bundled file)."""
    return open_gguf(path)
