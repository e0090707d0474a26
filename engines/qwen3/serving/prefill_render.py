"""Prompt rendering: a checked request -> talker prefill rows and trailing text rows.

``PromptRenderer.layout`` builds the symbolic dual-track prefill (``prefill_layout.build_layout``,
the official layout); ``render`` turns it into ``[L, H]`` rows (text projection + codec
embeddings, summed where both tracks are present) and the trailing text rows
fed one per frame.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import structlog
import torch

from engines.qwen3.model.tts_model import TtsModel
from engines.qwen3.modes import QtsMode
from engines.qwen3.serving.prefill_layout import IclPrompt, PromptLayout, build_layout
from engines.qwen3.serving.request import ModeSynthesizeRequest
from engines.qwen3.serving.request_checks import RequestChecks
from engines.qwen3.weights.text_tokenizer import TextTokenizer

log = structlog.get_logger(__name__)
Tensor = torch.Tensor


@dataclass
class PreparedPrompt:
    """A request turned into talker inputs."""

    layout: PromptLayout
    rows: Tensor  # [L, H]
    trailing: Tensor  # [N, H]
    tts_pad: Tensor  # [H]
    language_id: int | None
    instruct_used: bool

    def text_row(self, frame_index: int) -> Tensor:
        """The text-track row added to the talker input after frame ``frame_index`` (0-based)."""
        n = self.trailing.shape[0]
        return self.trailing[frame_index] if frame_index < n else self.tts_pad


class PromptRenderer:
    """Checks, lays out and renders requests for one loaded checkpoint."""

    def __init__(self, checks: RequestChecks, tokenizer: TextTokenizer, model: TtsModel) -> None:
        self.checks = checks
        self.tokenizer = tokenizer
        self.model = model
        self.meta = model.meta
        self.mode: QtsMode = checks.mode

    def layout(self, req: ModeSynthesizeRequest) -> PromptLayout:
        """The symbolic prefill for ``req`` (after ``check_request``)."""
        self.checks.check(req)
        meta = self.meta
        instruct_ids: list[int] | None = None
        instruct = req.effective_instruct
        if instruct is not None:
            if self.checks.instruct_supported:
                instruct_ids = self.tokenizer.encode_instruction_for_tts(instruct)
            else:
                log.warning("instruct_ignored", reason="0.6b CustomVoice has no instruction input")
        speaker_id = self.checks.preset_speaker_id(req.speaker) if req.speaker is not None else None
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
            language_id=self.checks.language_id(req),
            speaker_codec_id=speaker_id,
            speaker_vector=speaker_vector,
            instruct_ids=instruct_ids,
            icl=icl,
            non_streaming=req.non_streaming,
        )
        layout.notes["instruct_used"] = instruct_ids is not None
        return layout

    def render(self, req: ModeSynthesizeRequest) -> PreparedPrompt:
        """Render the layout of ``req`` into talker input rows and trailing text rows."""
        layout = self.layout(req)
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
                vec = self.checks.speaker_vector(req)
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
            language_id=self.checks.language_id(req),
            instruct_used=bool(layout.notes.get("instruct_used")),
        )
