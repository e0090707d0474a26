"""The talker prefill layout (as the official ``qwen_tts`` package builds it), as
symbolic rows before any embedding is computed.

Every row is the sum of a text-track vector ``P(id) = text_projection(text_embedding(id))``
and a codec-track vector: ``C(id)`` (codec embedding), the speaker x-vector
``X`` or an ICL reference frame ``R[j]`` (sum of its 16 code embeddings).
Building the layout symbolically keeps it testable as exact strings; the
engine renders it into one ``[L, H]`` tensor plus the trailing text rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from engines.qwen3.model.config import CodecIds, TextIds


@dataclass(frozen=True)
class Row:
    """One prefill row: optional text id plus at most one codec-track item."""

    text: int | None = None
    codec: int | None = None
    speaker: bool = False
    ref_frame: int | None = None

    def describe(self, text_names: dict[int, str] | None = None) -> str:
        parts: list[str] = []
        if self.text is not None:
            name = (text_names or {}).get(self.text)
            parts.append(f"P({name})" if name else f"P({self.text})")
        if self.codec is not None:
            parts.append(f"C({self.codec})")
        if self.speaker:
            parts.append("X")
        if self.ref_frame is not None:
            parts.append(f"R{self.ref_frame}")
        return "+".join(parts) if parts else "0"


@dataclass
class PromptLayout:
    """Prefill rows in order, plus the text ids fed one per generated frame (then ``tts_pad``)."""

    rows: list[Row]
    trailing: list[int]
    instruct_rows: int = 0
    role_start: int = 0
    notes: dict[str, object] = field(default_factory=dict)

    def describe(self, text_names: dict[int, str] | None = None) -> list[str]:
        return [r.describe(text_names) for r in self.rows]

    def describe_trailing(self, text_names: dict[int, str] | None = None) -> list[str]:
        return [Row(text=t).describe(text_names) for t in self.trailing]


@dataclass(frozen=True)
class IclPrompt:
    """ICL part of a Base prompt: reference text tokens and the number of reference frames."""

    ref_text_ids: Sequence[int]
    n_ref_frames: int


def control_codes(codec: CodecIds, language_id: int | None) -> list[int]:
    """``[nothink, think_bos, think_eos]`` (auto) or ``[think, think_bos, lang, think_eos]``."""
    if language_id is None:
        return [codec.nothink, codec.think_bos, codec.think_eos]
    return [codec.think, codec.think_bos, language_id, codec.think_eos]


def build_layout(
    *,
    codec: CodecIds,
    text: TextIds,
    target_ids: Sequence[int],
    language_id: int | None,
    speaker_codec_id: int | None = None,
    speaker_vector: bool = False,
    instruct_ids: Sequence[int] | None = None,
    icl: IclPrompt | None = None,
    non_streaming: bool = False,
) -> PromptLayout:
    """Rows for one request.

    ``target_ids`` is the whole tokenised target template (``[im_start, assistant, \\n]
    + T + [im_end, \\n, im_start, assistant, \\n]``), sliced exactly as upstream does.
    ``speaker_codec_id`` (CustomVoice preset) and ``speaker_vector`` (Base x-vector)
    are mutually exclusive; with neither there is no speaker row (VoiceDesign).
    """
    if speaker_codec_id is not None and speaker_vector:
        raise ValueError("a prompt has either a preset speaker id or a speaker vector, not both")
    if len(target_ids) < 9:
        raise ValueError("target template too short: the text produced no tokens")
    role = list(target_ids[:3])
    body = list(target_ids[3:-5])
    rows: list[Row] = [Row(text=i) for i in (instruct_ids or [])]
    n_instruct = len(rows)
    role_start = len(rows)
    rows += [Row(text=i) for i in role]

    codec_items: list[Row] = [Row(codec=c) for c in control_codes(codec, language_id)]
    if speaker_codec_id is not None:
        codec_items.append(Row(codec=speaker_codec_id))
    elif speaker_vector:
        codec_items.append(Row(speaker=True))
    codec_items += [Row(codec=codec.pad), Row(codec=codec.bos)]
    n = len(codec_items)
    header_text = [text.tts_pad] * (n - 2) + [text.tts_bos]
    for j in range(n - 1):
        item = codec_items[j]
        rows.append(Row(text=header_text[j], codec=item.codec, speaker=item.speaker))

    trailing: list[int]
    if icl is not None:
        txt = [*icl.ref_text_ids, *body, text.tts_eos]
        cod = [Row(codec=codec.bos)] + [Row(ref_frame=j) for j in range(icl.n_ref_frames)]
        lt, lc = len(txt), len(cod)
        if non_streaming:
            rows += [Row(text=t, codec=codec.pad) for t in txt]
            rows += [Row(text=text.tts_pad, codec=c.codec, ref_frame=c.ref_frame) for c in cod]
            trailing = [text.tts_pad]
        elif lt > lc:
            rows += [
                Row(text=t, codec=c.codec, ref_frame=c.ref_frame)
                for t, c in zip(txt[:lc], cod, strict=True)
            ]
            trailing = txt[lc:]
        else:
            padded = txt + [text.tts_pad] * (lc - lt)
            rows += [
                Row(text=t, codec=c.codec, ref_frame=c.ref_frame)
                for t, c in zip(padded, cod, strict=True)
            ]
            trailing = [text.tts_pad]
    elif non_streaming:
        rows += [Row(text=t, codec=codec.pad) for t in body]
        rows.append(Row(text=text.tts_eos, codec=codec.pad))
        rows.append(Row(text=text.tts_pad, codec=codec.bos))
        trailing = [text.tts_pad]
    else:
        rows.append(Row(text=target_ids[3], codec=codec.bos))
        trailing = [*body[1:], text.tts_eos]
    return PromptLayout(
        rows=rows, trailing=trailing, instruct_rows=n_instruct, role_start=role_start
    )
