"""``Qwen3TtsEngine``: text -> 16-code frames at 12.5 Hz (talker + code predictor).

Per frame (brief §3): talker logits -> repetition penalty over the codebook-0
history -> EOS blocked for the first two frames -> ids 2048..3071 suppressed
except EOS -> temperature/top-k/top-p (or argmax) -> 15 code-predictor steps
on a fresh 17-slot cache -> next talker input = sum of the 16 code
embeddings + the next trailing text row (or ``tts_pad``).

The vocoder is not part of this module: ``iter_frames`` yields int64 ``[16]``
frames as they are made, ``generate_codes`` returns them stacked.

Speed paths (all give the greedy codes of the plain torch path):
* draws are Gumbel-max on device (no probability tensor, no multinomial, no host
  sync); a frame costs one host copy (its 16 codes);
* small float32 CPU models (width <= 256) run single-row steps in numpy
  (``NumpyStep``), where per-call overhead is the whole cost;
* on CUDA the frame (code 0 + 15 predictor steps) and the talker step are captured
  as CUDA graphs (``_CudaGraphRunner``), with an eager fallback.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import structlog
import torch

from engines.qwen3.errors import Qwen3TtsError, RequestError
from engines.qwen3.gguf_model import GgufBundle, ModelMetadata, load_weights, read_metadata
from engines.qwen3.model import NumpyStep, TtsModel
from engines.qwen3.prompt import IclPrompt, PromptLayout, build_layout
from engines.qwen3.request import (
    ModeSynthesizeRequest,
    PresetSpeaker,
    QtsMode,
    VoiceClonePrompt,
)
from engines.qwen3.tokenizer import TextTokenizer
from engines.runtime.synth import SynthesisCancelled

if TYPE_CHECKING:
    from engines.qwen3.paths import ModeModelPaths

__all__ = [
    "ModeSynthesizeRequest",
    "PreparedPrompt",
    "PresetSpeaker",
    "QtsMode",
    "Qwen3TtsEngine",
    "VoiceClonePrompt",
    "measure_frames_per_second",
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


@dataclass
class PreparedPrompt:
    """A request turned into talker inputs."""

    layout: PromptLayout
    rows: Tensor  # [L, H]
    trailing: Tensor  # [N, H]
    tts_pad: Tensor  # [H]
    language_id: int | None
    instruct_used: bool


def _sample(
    logits: Tensor, temperature: float, top_k: int, top_p: float, gen: torch.Generator
) -> Tensor:
    """HF warper order: temperature, top-k, top-p, then one draw (0-d long, on device).

    The draw is Gumbel-max (``argmax(scores/T + g)``, ``g = -log(Exp(1))``), the same
    distribution as softmax + multinomial, without a host sync or a probability tensor.
    """
    scores = logits.reshape(-1).float()
    gumbel = _gumbel(1, _k(top_k, scores.shape[0]), scores.device, gen)[0]
    return _draw(scores, temperature, top_k, top_p, gumbel)


def _draw(scores: Tensor, temperature: float, top_k: int, top_p: float, gumbel: Tensor) -> Tensor:
    """One sample from float32 ``scores [V]`` with Gumbel noise ``[k]`` (k = top-k or V)."""
    idx: Tensor | None = None
    if 0 < top_k < scores.shape[0]:
        scores, idx = torch.topk(scores, top_k)  # sorted, descending
    if top_p < 1.0:
        if idx is None:
            scores, idx = torch.sort(scores, descending=True)
        probs = torch.softmax(scores / temperature, dim=-1)
        # Drop the tail whose cumulative mass (from the bottom) is <= 1 - top_p; keep >= 1.
        rev_cum = torch.flip(torch.cumsum(torch.flip(probs, (0,)), 0), (0,))
        remove = rev_cum <= (1.0 - top_p)
        remove[0] = False
        scores = scores.masked_fill(remove, float("-inf"))
    # argmax(s/T + g) == argmax(s + T*g) for T > 0
    choice = torch.argmax(torch.add(scores, gumbel, alpha=temperature))
    # index_select, not idx[choice]: a 0-d tensor index may be read back to the host
    return idx.index_select(0, choice.view(1)).view(()) if idx is not None else choice


def _k(top_k: int, n: int) -> int:
    """Candidates a draw looks at: top-k when it restricts, else the whole vocabulary."""
    return top_k if 0 < top_k < n else n


def _gumbel(rows: int, k: int, device: torch.device, gen: torch.Generator) -> Tensor:
    """``[rows, k]`` standard Gumbel noise, ``-log(Exp(1))`` (finite: Exp clamped > 0)."""
    e = torch.empty((rows, k), dtype=torch.float32, device=device).exponential_(generator=gen)
    return e.clamp_min_(1e-30).log_().neg_()


class Qwen3TtsEngine:
    """One loaded Qwen3-TTS checkpoint (talker, code predictor, tokenizer) for one mode."""

    def __init__(
        self,
        model: TtsModel,
        tokenizer: TextTokenizer,
        mode: QtsMode,
        *,
        source: str = "",
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.mode: QtsMode = mode
        self.meta: ModelMetadata = model.meta
        self.source = source
        self.timings: dict[str, float] = {}
        self._lock = threading.Lock()
        tc = self.meta.talker
        self._vocab = tc.vocab_size
        self._eos = self.meta.codec.eos
        sup = torch.zeros(tc.vocab_size, dtype=torch.float32, device=model.device)
        sup[max(0, tc.vocab_size - 1024) :] = float("-inf")
        sup[self._eos] = 0.0
        self._suppress = sup
        self._suppress_eos = sup.clone()
        self._suppress_eos[self._eos] = float("-inf")
        #: Capture the talker step and the frame (code 0 + 15 predictor steps) as CUDA
        #: graphs when the model is on a GPU (eager fallback when capture fails).
        self.cuda_graphs = model.device.type == "cuda" and os.environ.get(
            "TTSDOCK_QWEN3_CUDA_GRAPHS", "1"
        ) not in ("0", "false", "no")
        self._graphs: dict[tuple[Any, ...], _CudaGraphRunner] = {}
        #: Small float32 CPU models run the predictor's single-row steps in numpy (its
        #: per-call overhead is a third of torch's; see ``NumpyStep``).
        self._np_cp: tuple[NumpyStep, npt.NDArray[np.float32], npt.NDArray[np.float32]] | None
        self._np_cp = None
        if (
            model.device.type == "cpu"
            and model.dtype == torch.float32
            and model.cp.width <= SMALL_MODEL_WIDTH
            and os.environ.get("TTSDOCK_QWEN3_NUMPY_CP", "1") not in ("0", "false", "no")
        ):
            self._np_cp = (NumpyStep(model.cp), model.cp_heads_t.numpy(), model.cp_embd_in.numpy())
        self._np_talker: NumpyStep | None = None
        if self._np_cp is not None and model.talker.width <= SMALL_MODEL_WIDTH:
            self._np_talker = NumpyStep(model.talker)

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
    ) -> Qwen3TtsEngine:
        """Load the talker, code predictor and tokenizer GGUFs named by ``paths`` for ``mode``.

        When the talker metadata names a model type (``qwen3-tts.tts_model_type``) it must
        match ``mode``; without it the explicit ``mode`` applies. ``num_threads`` sets
        ``torch.set_num_threads`` (process-wide); by default tiny models use 1 thread and
        real ones keep torch's default. ``device`` is ``cpu``, ``cuda[:N]`` or ``auto``;
        ``dtype`` is ``float32``, ``float16`` or ``bfloat16``.
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
        eng = cls(model, tokenizer, m, source=bundle.describe)
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
    ) -> Qwen3TtsEngine:
        """Resolve the files of ``mode`` in ``model_dir`` (``ModeModelPaths``) and load them."""
        from engines.qwen3.paths import ModeModelPaths

        size = kw.pop("size", None)
        paths = ModeModelPaths.from_model_dir(model_dir, QtsMode.parse(mode), size=size)
        return cls.load_mode(paths, mode, **kw)

    def close(self) -> None:
        """Nothing to release explicitly (memory maps close with the objects)."""

    # -- model facts ------------------------------------------------------------------------

    def preset_speakers(self) -> list[PresetSpeaker]:
        """Presets whose codec id the checkpoint metadata defines."""
        return [s for s in PresetSpeaker if s.as_str() in self.meta.speakers]

    def preset_speaker_id(self, speaker: PresetSpeaker | str) -> int:
        s = PresetSpeaker.parse(speaker)
        sid = self.meta.speakers.get(s.as_str())
        if sid is None:
            have = ", ".join(sorted(self.meta.speakers)) or "none"
            raise RequestError(
                f"preset speaker {s.as_str()!r} is not in this checkpoint's metadata "
                f"(qwen3-tts.talker.spk_id.{s.as_str()}); available: {have}"
            )
        return sid

    def languages(self) -> list[str]:
        """Accepted ``language`` values: ``auto`` plus the non-dialect metadata languages."""
        return ["auto", *sorted(k for k in self.meta.languages if "dialect" not in k)]

    @property
    def instruct_supported(self) -> bool:
        if self.mode is QtsMode.VoiceDesign:
            return True
        return self.mode is QtsMode.CustomVoice and self.meta.model_size != "0.6b"

    # -- prompt -----------------------------------------------------------------------------

    def check_request(self, req: ModeSynthesizeRequest) -> None:
        """``req.validate()`` plus the checks that need the loaded checkpoint."""
        req.validate()
        if req.mode is not self.mode:
            raise RequestError(
                f"request mode {req.mode.as_str()} differs from the loaded checkpoint mode "
                f"{self.mode.as_str()}"
            )
        self._language_id(req)
        if req.speaker is not None:
            self.preset_speaker_id(req.speaker)
        vec = self._speaker_vector_array(req)
        if vec is not None and vec.shape[0] != self.meta.talker.hidden_size:
            raise RequestError(
                f"speaker embedding has {vec.shape[0]} values; this checkpoint needs "
                f"{self.meta.talker.hidden_size} (talker width)"
            )

    def _language_id(self, req: ModeSynthesizeRequest) -> int | None:
        lang = req.language.strip().lower()
        lid: int | None
        if lang == "auto":
            lid = None
        elif lang in self.meta.languages and "dialect" not in lang:
            lid = self.meta.languages[lang]
        else:
            raise RequestError(
                f"unsupported language {req.language!r}; this checkpoint supports "
                + ", ".join(self.languages())
            )
        if req.speaker is not None and lang in ("chinese", "auto"):
            dialect = self.meta.dialects.get(req.speaker.as_str())
            if dialect is not None:
                lid = self.meta.languages[dialect]
        return lid

    @staticmethod
    def _speaker_vector_array(req: ModeSynthesizeRequest) -> npt.NDArray[np.float32] | None:
        if req.speaker_embedding is not None:
            return np.asarray(req.speaker_embedding, dtype=np.float32).reshape(-1)
        vcp = req.voice_clone_prompt
        if vcp is not None and vcp.ref_spk_embedding is not None:
            return np.asarray(vcp.ref_spk_embedding, dtype=np.float32).reshape(-1)
        return None

    def build_layout(self, req: ModeSynthesizeRequest) -> PromptLayout:
        """The symbolic prefill for ``req`` (after ``check_request``)."""
        self.check_request(req)
        meta = self.meta
        instruct_ids: list[int] | None = None
        instruct = req.effective_instruct
        if instruct is not None:
            if self.instruct_supported:
                instruct_ids = self.tokenizer.encode_instruction_for_tts(instruct)
            else:
                log.warning("instruct_ignored", reason="0.6b CustomVoice has no instruction input")
        speaker_id = self.preset_speaker_id(req.speaker) if req.speaker is not None else None
        speaker_vector = False
        icl: IclPrompt | None = None
        if self.mode is QtsMode.Base:
            vcp = req.voice_clone_prompt
            speaker_vector = vcp is None or vcp.x_vector_only_mode or vcp.icl_mode
            if vcp is not None and vcp.uses_icl:
                assert vcp.ref_code is not None and vcp.ref_text is not None
                icl = IclPrompt(
                    ref_text_ids=self.tokenizer.ref_token_ids(vcp.ref_text),
                    n_ref_frames=int(np.asarray(vcp.ref_code).shape[0]),
                )
        target = self.tokenizer.encode_tts_text(req.text)
        layout = build_layout(
            codec=meta.codec,
            text=meta.text,
            target_ids=target,
            language_id=self._language_id(req),
            speaker_codec_id=speaker_id,
            speaker_vector=speaker_vector,
            instruct_ids=instruct_ids,
            icl=icl,
            non_streaming=req.non_streaming,
        )
        layout.notes["instruct_used"] = instruct_ids is not None
        return layout

    def prepare(self, req: ModeSynthesizeRequest) -> PreparedPrompt:
        """Render the layout of ``req`` into talker input rows and trailing text rows."""
        layout = self.build_layout(req)
        m = self.model
        tid = self.meta.text
        with torch.inference_mode():
            ids = sorted(
                {r.text for r in layout.rows if r.text is not None}
                | set(layout.trailing)
                | {tid.tts_pad}
            )
            where = {t: i for i, t in enumerate(ids)}
            proj = m.project_text(ids)
            rows = layout.rows
            n = len(rows)
            h = self.meta.talker.hidden_size
            text_idx = [where[r.text] if r.text is not None else -1 for r in rows]
            has_text = torch.tensor([i >= 0 for i in text_idx], device=m.device)
            text_track = proj[torch.tensor([max(i, 0) for i in text_idx], device=m.device)]
            codec_track = torch.zeros((n, h), device=m.device, dtype=m.dtype)
            has_codec = torch.zeros(n, dtype=torch.bool, device=m.device)
            cidx = [i for i, r in enumerate(rows) if r.codec is not None]
            if cidx:
                codec_track[cidx] = m.codec_rows([rows[i].codec for i in cidx])  # type: ignore[misc]
                has_codec[cidx] = True
            sidx = [i for i, r in enumerate(rows) if r.speaker]
            if sidx:
                vec = self._speaker_vector_array(req)
                if vec is None:
                    vec = np.zeros(h, dtype=np.float32)  # seed: zero-embedding fallback
                codec_track[sidx] = torch.from_numpy(vec).to(m.device, m.dtype)
                has_codec[sidx] = True
            ridx = [i for i, r in enumerate(rows) if r.ref_frame is not None]
            if ridx:
                vcp = req.voice_clone_prompt
                assert vcp is not None and vcp.ref_code is not None
                ref = torch.as_tensor(np.asarray(vcp.ref_code, dtype=np.int64), device=m.device)
                frames = m.frames_embedding(ref)
                codec_track[ridx] = frames[[rows[i].ref_frame for i in ridx]]
                has_codec[ridx] = True
            both = has_text & has_codec
            out = torch.where(has_text[:, None], text_track, codec_track)
            out[both] = text_track[both] + codec_track[both]
            trailing = proj[
                torch.tensor([where[t] for t in layout.trailing], device=m.device, dtype=torch.long)
            ]
            tts_pad = proj[where[tid.tts_pad]]
        return PreparedPrompt(
            layout=layout,
            rows=out,
            trailing=trailing,
            tts_pad=tts_pad,
            language_id=self._language_id(req),
            instruct_used=bool(layout.notes.get("instruct_used")),
        )

    # -- generation -------------------------------------------------------------------------

    def iter_frames(
        self, req: ModeSynthesizeRequest, *, cancel: Callable[[], bool] | None = None
    ) -> Iterator[npt.NDArray[np.int64]]:
        """Yield one int64 ``[16]`` frame at a time until EOS or ``req.max_frames``.

        ``cancel`` is polled before every frame; when it returns True the
        generator raises ``SynthesisCancelled``. ``self.timings`` holds the
        per-stage milliseconds (prefill, talker, code_predictor) when it ends
        (on CUDA the split between the stages is approximate: nothing waits for
        the device except the one copy of each finished frame to the host).
        """
        t_start = time.perf_counter()
        prep = self.prepare(req)
        m = self.model
        dev = m.device
        gen = torch.Generator(device=dev)
        if req.seed is not None:
            gen.manual_seed(int(req.seed))
        else:
            gen.seed()
        n_groups = self.meta.talker.num_code_groups - 1
        max_frames = req.max_frames
        timings = {"prefill": 0.0, "talker": 0.0, "code_predictor": 0.0, "frames": 0.0}
        self.timings = timings
        n_trailing = prep.trailing.shape[0]
        # On the CPU the EOS check costs nothing, so it runs before the predictor; on a GPU
        # the frame is made without waiting and the EOS check rides on the frame's copy.
        early_eos = dev.type != "cuda"
        with torch.inference_mode():
            n_rows = prep.rows.shape[0]
            graphs = self._graph_runner(req, n_rows + max_frames)
            if graphs is not None:
                yield from graphs.run(prep, req, gen, cancel, t_start)
                timings["total"] = (time.perf_counter() - t_start) * 1e3
                return
            cache = m.talker.new_cache(n_rows + max_frames)
            cp_cache = m.cp.new_cache(n_groups + 2)
            h = m.talker.forward(prep.rows, 0, cache)[-1:]
            pos = n_rows
            seen = torch.zeros(self._vocab, dtype=torch.bool, device=dev)
            frame_t = torch.empty(n_groups + 1, dtype=torch.long, device=dev)
            t_now = time.perf_counter()
            timings["prefill"] = (t_now - t_start) * 1e3
            frame_i = 0
            while frame_i < max_frames:
                if cancel is not None and cancel():
                    raise SynthesisCancelled()
                t0 = time.perf_counter()
                sup = self._suppress_eos if frame_i < 2 else self._suppress
                code0_t = self._code0(h, seen, sup, req, gen)
                if early_eos and int(code0_t) == self._eos:
                    timings["talker"] += (time.perf_counter() - t0) * 1e3
                    break
                t1 = time.perf_counter()
                timings["talker"] += (t1 - t0) * 1e3
                frame_t[0] = code0_t
                self._predict_codes(h, code0_t, cp_cache, frame_t[1:], req, req.cp_greedy, gen)
                seen.index_fill_(0, code0_t.view(1), True)
                frame = frame_t.cpu().numpy().copy()  # the frame's one host copy
                t2 = time.perf_counter()
                timings["code_predictor"] += (t2 - t1) * 1e3
                if frame[0] == self._eos:
                    break
                frame_i += 1
                timings["frames"] = float(frame_i)
                yield frame
                if frame_i >= max_frames:
                    break
                t3 = time.perf_counter()
                x = m.frame_embedding(frame_t)
                x = x + (prep.trailing[frame_i - 1] if frame_i - 1 < n_trailing else prep.tts_pad)
                if self._np_talker is not None and pos < cache.length:
                    out = self._np_talker(x.numpy(), pos, cache.kv.numpy())
                    h = torch.from_numpy(out).view(1, -1)
                else:
                    h = m.talker.forward(x.unsqueeze(0), pos, cache)
                pos += 1
                timings["talker"] += (time.perf_counter() - t3) * 1e3
        timings["total"] = (time.perf_counter() - t_start) * 1e3

    def _code0(
        self,
        h: Tensor,
        seen: Tensor,
        suppress: Tensor,
        req: ModeSynthesizeRequest,
        gen: torch.Generator | None,
        gumbel: Tensor | None = None,
    ) -> Tensor:
        """Codebook-0 id (0-d long, on device) from the talker's last normed row ``h [1, H]``.

        Repetition penalty over ``seen``, then ``suppress`` (ids 2048.. and, early, EOS),
        then argmax or a draw (``gumbel`` noise given, or made from ``gen``).
        """
        m = self.model
        logits = torch.mm(h.view(1, -1), m.codec_head_t).view(-1).float()
        p = float(req.repetition_penalty)
        if p != 1.0:
            logits = torch.where(seen, torch.where(logits > 0, logits / p, logits * p), logits)
        logits = logits + suppress
        if req.greedy:
            return torch.argmax(logits)
        if gumbel is None:
            assert gen is not None
            return _sample(logits, req.temperature, req.top_k, req.top_p, gen)
        return _draw(logits, req.temperature, req.top_k, req.top_p, gumbel)

    def _predict_codes(
        self,
        h: Tensor,
        code0: int | Tensor,
        cache: Any,
        out: Tensor,
        req: ModeSynthesizeRequest,
        greedy: bool,
        gen: torch.Generator | None,
        gumbel: Tensor | None = None,
    ) -> None:
        """The 15 code-predictor steps of one frame, written into ``out`` (no host sync).

        ``h`` is the talker's last normed row; ``code0`` the frame's codebook-0 id (an int
        or a device tensor). Sampling noise for all 15 steps is drawn once (``gumbel``
        ``[15, k]`` when given, e.g. a CUDA-graph input).
        """
        m = self.model
        if self._np_cp is not None and gumbel is None and (greedy or req.subtalker_top_p >= 1.0):
            self._predict_codes_np(h, code0, cache, out, req, greedy, gen)
            return
        cp = m.cp
        c0 = code0.view(1) if isinstance(code0, Tensor) else torch.tensor([code0], device=m.device)
        x = torch.cat((m.project_to_predictor(h.view(1, -1)), m.codec_embd_in.index_select(0, c0)))
        hid = cp.forward(x, 0, cache)[-1:]
        n_groups = out.shape[0]
        temp, top_k, top_p = req.subtalker_temperature, req.subtalker_top_k, req.subtalker_top_p
        if not greedy and gumbel is None:
            assert gen is not None
            gumbel = _gumbel(n_groups, _k(top_k, int(m.cp_heads_t.shape[2])), m.device, gen)
        heads, embd, step = m.cp_heads_t, m.cp_embd_in, cp.step
        for g in range(n_groups):
            logits = torch.mm(hid, heads[g]).view(-1)
            if greedy:
                c = torch.argmax(logits)
            else:
                assert gumbel is not None
                c = _draw(logits, temp, top_k, top_p, gumbel[g])
            out[g] = c
            if g + 1 < n_groups:
                hid = step(embd[g].index_select(0, c.view(1)), g + 2, cache)

    def _predict_codes_np(
        self,
        h: Tensor,
        code0: int | Tensor,
        cache: Any,
        out: Tensor,
        req: ModeSynthesizeRequest,
        greedy: bool,
        gen: torch.Generator | None,
    ) -> None:
        """``_predict_codes`` with the 14 single-row steps in numpy (small CPU models).

        The 2-row predictor prefill runs as two single-row steps; top-p < 1 never comes here.
        """
        m = self.model
        step, heads, embd = self._np_cp  # type: ignore[misc]
        kv = cache.kv.numpy()
        hid = step(m.project_to_predictor(h.view(1, -1))[0].numpy(), 0, kv)
        hid = step(m.codec_embd_in[int(code0)].numpy(), 1, kv)
        n_groups = out.shape[0]
        codes = out.numpy()
        gum: npt.NDArray[np.float32] | None = None
        top_k, temp = req.subtalker_top_k, np.float32(req.subtalker_temperature)
        n = heads.shape[2]
        k = _k(top_k, n)
        if not greedy:
            assert gen is not None
            gum = _gumbel(n_groups, k, m.device, gen).numpy() * temp
        for g in range(n_groups):
            logits = hid @ heads[g]
            if gum is None:
                c = int(logits.argmax())
            elif k < n:
                cand = np.argpartition(logits, n - k)[n - k :]
                c = int(cand[(logits[cand] + gum[g]).argmax()])
            else:
                c = int((logits + gum[g]).argmax())
            codes[g] = c
            if g + 1 < n_groups:
                hid = step(embd[g, c], g + 2, kv)

    def _graph_runner(self, req: ModeSynthesizeRequest, length: int) -> _CudaGraphRunner | None:
        """The CUDA-graph frame loop for ``req`` (None: run eagerly; always None on CPU)."""
        if not self.cuda_graphs or self.model.device.type != "cuda":
            return None
        key = _CudaGraphRunner.key_for(req, length)
        runner = self._graphs.get(key)
        if runner is None:
            try:
                runner = _CudaGraphRunner(self, req, length)
            except Exception as e:  # capture is an optimisation: fall back to eager
                log.warning("cuda_graphs_disabled", engine="qwen3", error=repr(e))
                self.cuda_graphs = False
                return None
            while len(self._graphs) >= 4:  # each set holds a talker KV cache: keep a few
                self._graphs.pop(next(iter(self._graphs)))
            self._graphs[key] = runner
        return runner

    def generate_codes(
        self, req: ModeSynthesizeRequest, *, cancel: Callable[[], bool] | None = None
    ) -> tuple[npt.NDArray[np.int64], dict[str, float]]:
        """All frames ``[T, 16]`` (int64) and the per-stage timings in ms."""
        frames = list(self.iter_frames(req, cancel=cancel))
        n = self.meta.talker.num_code_groups
        codes = np.stack(frames) if frames else np.zeros((0, n), dtype=np.int64)
        return codes, dict(self.timings)


def measure_frames_per_second(
    engine: Qwen3TtsEngine,
    req: ModeSynthesizeRequest,
    *,
    runs: int = 3,
    warmup: int = 1,
) -> dict[str, float]:
    """Generate ``req`` ``warmup + runs`` times; report frames/s (best and median) and stages.

    Frames/s counts the whole request (prefill included); ``decode_fps``
    excludes the prefill.
    """
    for _ in range(max(0, warmup)):
        engine.generate_codes(req)
    fps: list[float] = []
    dec: list[float] = []
    last: dict[str, float] = {}
    frames = 0
    for _ in range(max(1, runs)):
        t0 = time.perf_counter()
        codes, timings = engine.generate_codes(req)
        wall = time.perf_counter() - t0
        frames = int(codes.shape[0])
        fps.append(frames / wall if wall > 0 else 0.0)
        decode_s = (timings.get("talker", 0.0) + timings.get("code_predictor", 0.0)) / 1e3
        dec.append(frames / decode_s if decode_s > 0 else 0.0)
        last = timings
    return {
        "frames": float(frames),
        "fps_best": max(fps),
        "fps_median": float(np.median(fps)),
        "decode_fps_best": max(dec),
        "prefill_ms": last.get("prefill", 0.0),
        "talker_ms": last.get("talker", 0.0),
        "code_predictor_ms": last.get("code_predictor", 0.0),
        "ms_per_frame": 1e3 / max(fps) if max(fps) > 0 else 0.0,
    }


def _bucket(length: int, least: int = 4096) -> int:
    """Talker-cache capacity for graphs: a power of two >= 4096, so a short warm-up and the
    default 2048-frame requests share one capture."""
    cap = least
    while cap < length:
        cap *= 2
    return cap


def _capture(fn: Callable[[], None]) -> torch.cuda.CUDAGraph:
    """Warm ``fn`` up on a side stream, then record it as a CUDA graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


class _CudaGraphRunner:
    """The frame loop as two CUDA graphs, for one sampling setup and talker-cache size.

    * frame graph: codebook-0 logits, repetition penalty, suppression and draw; the 15
      code-predictor steps (static positions, fresh 17-slot cache) with their draws;
      the frame's embedding sum (the next talker input less its text row).
    * talker graph: one decode step at the position held in a device tensor, attending
      over the whole static cache with a -inf bias after that position.

    Everything between the graphs is a handful of eager kernels: the seeded Gumbel
    noise for the next frame (drawn into static buffers before each replay, so a seed
    still fixes the output), the text row add and the position fill. The host waits
    once per frame, for the 16 codes. The prefill runs eagerly into the static cache.
    Not exercised in CI (no GPU there): any capture error falls back to the eager loop.
    """

    def __init__(
        self,
        eng: Qwen3TtsEngine,
        req: ModeSynthesizeRequest,
        length: int,
        capture: Callable[[Callable[[], None]], Any] = _capture,
    ) -> None:
        m = eng.model
        dev, dt = m.device, m.dtype
        self.eng = eng
        self.req = req
        self.cap = _bucket(length)
        n_groups = eng.meta.talker.num_code_groups - 1
        width = eng.meta.talker.hidden_size
        self.cache = m.talker.new_cache(self.cap)
        self.cp_cache = m.cp.new_cache(n_groups + 2)
        self.h = torch.zeros((1, width), device=dev, dtype=dt)
        self.x = torch.zeros((1, width), device=dev, dtype=dt)
        self.next = torch.zeros((1, width), device=dev, dtype=dt)
        self.pos = torch.zeros(1, dtype=torch.long, device=dev)
        self.arange = torch.arange(self.cap, device=dev)
        self.seen = torch.zeros(eng._vocab, dtype=torch.bool, device=dev)
        self.sup = eng._suppress_eos.clone()
        self.frame = torch.zeros(n_groups + 1, dtype=torch.long, device=dev)
        self.g0 = torch.zeros(_k(req.top_k, eng._vocab), device=dev)
        n_cp = int(m.cp_heads_t.shape[2])
        self.gcp = torch.zeros((n_groups, _k(req.subtalker_top_k, n_cp)), device=dev)
        self.frame_graph = capture(self._frame_body)
        self.talker_graph = capture(self._talker_body)

    @staticmethod
    def key_for(req: ModeSynthesizeRequest, length: int) -> tuple[Any, ...]:
        return (
            _bucket(length),
            req.greedy,
            req.cp_greedy,
            req.temperature,
            req.top_k,
            req.top_p,
            req.subtalker_temperature,
            req.subtalker_top_k,
            req.subtalker_top_p,
            req.repetition_penalty,
        )

    def _frame_body(self) -> None:
        eng, req = self.eng, self.req
        code0 = eng._code0(self.h, self.seen, self.sup, req, None, self.g0)
        self.frame[:1].copy_(code0.view(1))
        eng._predict_codes(
            self.h, code0, self.cp_cache, self.frame[1:], req, req.cp_greedy, None, self.gcp
        )
        self.seen.index_fill_(0, code0.view(1), True)
        self.next.copy_(eng.model.frame_embedding(self.frame).view(1, -1))

    def _talker_body(self) -> None:
        bias = torch.where(self.arange <= self.pos, 0.0, float("-inf"))
        self.h.copy_(self.eng.model.talker.step_at(self.x, self.pos, self.cache, bias))

    @staticmethod
    def _fill_gumbel(buf: Tensor, gen: torch.Generator) -> None:
        buf.exponential_(generator=gen).clamp_min_(1e-30).log_().neg_()

    def run(
        self,
        prep: PreparedPrompt,
        req: ModeSynthesizeRequest,
        gen: torch.Generator,
        cancel: Callable[[], bool] | None,
        t_start: float,
    ) -> Iterator[npt.NDArray[np.int64]]:
        eng = self.eng
        m = eng.model
        timings = eng.timings
        n_rows = prep.rows.shape[0]
        self.h.copy_(m.talker.forward(prep.rows, 0, self.cache)[-1:])
        self.seen.zero_()
        self.sup.copy_(eng._suppress_eos)
        timings["prefill"] = (time.perf_counter() - t_start) * 1e3
        n_trailing = prep.trailing.shape[0]
        pos = n_rows
        frame_i = 0
        while frame_i < req.max_frames:
            if cancel is not None and cancel():
                raise SynthesisCancelled()
            t0 = time.perf_counter()
            if frame_i == 2:
                self.sup.copy_(eng._suppress)
            if not req.greedy:
                self._fill_gumbel(self.g0, gen)
            if not req.cp_greedy:
                self._fill_gumbel(self.gcp, gen)
            self.frame_graph.replay()
            frame = self.frame.cpu().numpy().copy()  # the frame's one host sync
            t1 = time.perf_counter()
            timings["code_predictor"] += (t1 - t0) * 1e3
            if frame[0] == eng._eos:
                break
            frame_i += 1
            timings["frames"] = float(frame_i)
            yield frame
            if frame_i >= req.max_frames:
                break
            t2 = time.perf_counter()
            row = prep.trailing[frame_i - 1] if frame_i - 1 < n_trailing else prep.tts_pad
            torch.add(self.next, row, out=self.x)
            self.pos.fill_(pos)
            pos += 1
            self.talker_graph.replay()
            timings["talker"] += (time.perf_counter() - t2) * 1e3
