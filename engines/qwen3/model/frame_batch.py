"""``FrameBatch``: static per-row state of up to ``max_batch`` utterances and the frame step.

Rule 1: one step makes one frame for every active row at once: codebook 0
from the talker's last row (repetition penalty, suppression, draw), the 15
code-predictor steps, then one talker step at each row's own position. Rule 2:
this file does not know threads, queues or calls; ``scheduler`` drives it.

Everything lives in preallocated device tensors indexed by batch row: the talker
KV cache ``[layers, max_batch, max_context + 1, ...]`` (the last position is
scratch for rows that only pad a batch), a predictor cache, the last hidden
row, position, codebook-0 history and sampling parameters of every row. A
step runs over rows ``0..n-1`` (``n`` = highest active row + 1, or a CUDA
graph bucket); free and still-prefilling rows inside that range are padding
(``valid`` False): they write to the scratch position, advance nothing, and
their outputs are ignored. ``step_body`` takes only static sizes and reads no
host value, so ``cuda_graphs`` captures it as is; ``step`` runs it eagerly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt
import torch

from engines.qwen3.model.sampling import RowSampling, candidates, draw_rows, gumbel, penalised
from engines.qwen3.model.tts_model import TtsModel

Tensor = torch.Tensor


class PrefillInput(Protocol):
    """A rendered prompt as the batch reads it (``serving.prefill_render.PreparedPrompt``)."""

    @property
    def rows(self) -> Tensor:
        """Talker prefill rows ``[L, H]``."""
        ...

    def text_row(self, frame_index: int) -> Tensor:
        """The text-track row added to the talker input after frame ``frame_index``."""
        ...


#: Default prompt rows per prefill chunk: a chunk costs about one batched step.
PREFILL_CHUNK = 32


@dataclass(frozen=True)
class StepShape:
    """The static sizes of one step (part of a CUDA graph's key): Gumbel candidates of
    codebook 0 and of the predictor (0: all rows greedy) and whether any row uses top-p."""

    k0: int
    kc: int
    p0: bool
    pc: bool


@dataclass
class BatchRow:
    """Host-side view of one occupied batch row."""

    prep: PrefillInput
    sampling: RowSampling
    gen: torch.Generator
    max_frames: int
    prefilled: int = 0  # prompt rows already in the cache
    frames: int = 0  # frames emitted
    k0: int = 0  # Gumbel candidates for codebook 0 (0: greedy)
    kc: int = 0  # ... for the predictor codebooks

    @property
    def n_rows(self) -> int:
        return int(self.prep.rows.shape[0])

    @property
    def ready(self) -> bool:
        return self.prefilled >= self.n_rows


class FrameBatch:
    """The batched frame loop's state and step (eager; ``cuda_graphs`` replays ``step_body``)."""

    def __init__(
        self, model: TtsModel, *, max_batch: int, max_context: int, eos: int, suppress: Tensor
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if max_context < 2:
            raise ValueError(f"max_context must be >= 2, got {max_context}")
        m = model
        self.model = m
        dev, dt = m.device, m.dtype
        tc = m.meta.talker
        self.max_batch = max_batch
        self.max_context = max_context
        self.n_groups = tc.num_code_groups - 1
        self.vocab = tc.vocab_size
        self.cp_vocab = int(m.cp_heads_t.shape[2])
        self.eos = eos
        width = tc.hidden_size
        self.cache = m.talker.new_cache(max_context + 1, max_batch)
        self.cp_cache = m.cp.new_cache(self.n_groups + 3, max_batch)
        self.h = torch.zeros((max_batch, width), device=dev, dtype=dt)
        self.text = torch.zeros((max_batch, width), device=dev, dtype=dt)
        self.pos = torch.zeros(max_batch, dtype=torch.long, device=dev)
        self.cp_pos = torch.zeros(max_batch, dtype=torch.long, device=dev)
        self.valid = torch.zeros(max_batch, dtype=torch.bool, device=dev)
        self.seen = torch.zeros((max_batch, self.vocab), dtype=torch.bool, device=dev)
        self.frame_i = torch.zeros(max_batch, dtype=torch.long, device=dev)
        self.codes = torch.zeros((max_batch, self.n_groups + 1), dtype=torch.long, device=dev)
        self.suppress = suppress  # [V]: ids 2048.. -inf except EOS
        self.suppress_eos = suppress.clone()
        self.suppress_eos[eos] = float("-inf")  # min_new_tokens = 2
        f32 = torch.float32
        self.greedy = torch.ones(max_batch, dtype=torch.bool, device=dev)
        self.temp = torch.ones(max_batch, device=dev, dtype=f32)
        self.top_k = torch.ones(max_batch, dtype=torch.long, device=dev)
        self.top_p = torch.ones(max_batch, device=dev, dtype=f32)
        self.penalty = torch.ones(max_batch, device=dev, dtype=f32)
        self.cp_greedy = torch.ones(max_batch, dtype=torch.bool, device=dev)
        self.cp_temp = torch.ones(max_batch, device=dev, dtype=f32)
        self.cp_top_k = torch.ones(max_batch, dtype=torch.long, device=dev)
        self.cp_top_p = torch.ones(max_batch, device=dev, dtype=f32)
        self.noise0 = torch.zeros((max_batch, self.vocab), device=dev, dtype=f32)
        self.noisec = torch.zeros((max_batch, self.n_groups, self.cp_vocab), device=dev, dtype=f32)
        self.rows: list[BatchRow | None] = [None] * max_batch

    # -- rows -------------------------------------------------------------------------------

    def fits(self, prep: PrefillInput, max_frames: int) -> bool:
        """Whether prompt + ``max_frames`` frames fit one row's context."""
        return int(prep.rows.shape[0]) + max_frames <= self.max_context

    def free_row(self) -> int | None:
        for i, s in enumerate(self.rows):
            if s is None:
                return i
        return None

    def occupy(self, b: int, row: BatchRow) -> None:
        """Put ``row`` in batch row ``b`` (not yet valid: its prefill runs in ``prefill``)."""
        assert self.rows[b] is None
        self.rows[b] = row
        s = row.sampling
        row.k0 = 0 if s.greedy else candidates(s.top_k, self.vocab)
        row.kc = 0 if s.cp_greedy else candidates(s.cp_top_k, self.cp_vocab)
        self.greedy[b] = s.greedy
        self.temp[b] = s.temperature if s.temperature > 0 else 1.0
        self.top_k[b] = max(1, row.k0)
        self.top_p[b] = s.top_p
        self.penalty[b] = s.repetition_penalty
        self.cp_greedy[b] = s.cp_greedy
        self.cp_temp[b] = s.cp_temperature if s.cp_temperature > 0 else 1.0
        self.cp_top_k[b] = max(1, row.kc)
        self.cp_top_p[b] = s.cp_top_p
        self.valid[b] = False

    def release(self, b: int) -> None:
        """Free batch row ``b`` at once (finished, cancelled or failed)."""
        self.rows[b] = None
        self.valid[b] = False
        self.pos[b] = 0

    def prefill(self, batch_rows: Sequence[int], chunk: int = PREFILL_CHUNK) -> list[int]:
        """Up to ``chunk`` more prompt rows of each of ``batch_rows``, in one batched call.

        Prompts of different lengths are padded (the padding writes only to the scratch
        position). Returns the batch rows whose prefill is now done (they join the next step).
        """
        m = self.model
        rows = [self.rows[b] for b in batch_rows]
        starts = [r.prefilled for r in rows if r is not None]
        assert len(starts) == len(batch_rows)
        lens = [min(r.n_rows - r.prefilled, max(1, chunk)) for r in rows if r is not None]
        width = max(lens)
        x = torch.zeros((len(batch_rows), width, self.h.shape[1]), device=m.device, dtype=m.dtype)
        for i, r in enumerate(rows):
            assert r is not None
            x[i, : lens[i]] = r.prep.rows[starts[i] : starts[i] + lens[i]]
        dev = m.device
        out = m.talker.forward(
            x,
            torch.tensor(starts, dtype=torch.long, device=dev),
            self.cache,
            kv_len=max(s + n for s, n in zip(starts, lens, strict=True)),
            lengths=torch.tensor(lens, dtype=torch.long, device=dev),
            rows=torch.tensor(list(batch_rows), dtype=torch.long, device=dev),
        )
        done = []
        for i, (b, r) in enumerate(zip(batch_rows, rows, strict=True)):
            assert r is not None
            r.prefilled += lens[i]
            if r.prefilled < r.n_rows:
                continue
            self.h[b] = out[i, lens[i] - 1]
            self.pos[b] = r.n_rows
            self.seen[b] = False
            self.frame_i[b] = 0
            self.valid[b] = True
            done.append(b)
        return done

    # -- the step ---------------------------------------------------------------------------

    def active_span(self) -> int:
        """1 + the highest batch row whose prefill is done (0: nothing to step)."""
        n = 0
        for i, s in enumerate(self.rows):
            if s is not None and s.ready:
                n = i + 1
        return n

    def prepare_step(self, n: int) -> tuple[StepShape, int]:
        """Host work before a step over rows ``0..n-1``: each ready row's next text row
        and its seeded noise. Returns the step's static shape and the talker ``kv_len``."""
        k0 = kc = 0
        p0 = pc = False
        top = 1
        dev = self.model.device
        for i in range(n):
            row = self.rows[i]
            if row is None or not row.ready:
                continue
            self.text[i] = row.prep.text_row(row.frames)
            if row.k0:  # codebook-0 noise first, then the predictor's (one order, alone or not)
                self.noise0[i, : row.k0] = gumbel((row.k0,), dev, row.gen)
                k0 = max(k0, row.k0)
            if row.kc:
                self.noisec[i, :, : row.kc] = gumbel((self.n_groups, row.kc), dev, row.gen)
                kc = max(kc, row.kc)
            p0 = p0 or (row.k0 > 0 and row.sampling.top_p < 1.0)
            pc = pc or (row.kc > 0 and row.sampling.cp_top_p < 1.0)
            top = max(top, row.n_rows + row.frames + 1)
        return StepShape(k0, kc, p0, pc), top

    def step_body(self, n: int, sh: StepShape, kv_len: int, cp_len: int | None) -> None:
        """One frame for rows ``0..n-1``: ``frame_codes`` then ``talker_step`` (no host reads).

        ``kv_len`` bounds the talker keys read and ``cp_len`` (None: the natural 2..16)
        the predictor's; a CUDA graph passes both whole cache lengths.
        """
        self.frame_codes(n, sh, cp_len)
        self.talker_step(n, kv_len)

    def frame_codes(self, n: int, sh: StepShape, cp_len: int | None) -> None:
        """Codebook 0 and the 15 predictor codes of rows ``0..n-1`` into ``self.codes[:n]``."""
        m = self.model
        cp = m.cp
        h = self.h[:n]
        logits = torch.matmul(h, m.codec_head_t).float()
        logits = penalised(logits, self.seen[:n], self.penalty[:n])
        logits = logits + torch.where(
            self.frame_i[:n, None] < 2, self.suppress_eos[None, :], self.suppress[None, :]
        )
        code0 = draw_rows(
            logits, self.greedy[:n], self.temp[:n], self.top_k[:n], self.top_p[:n],
            self.noise0[:n, : sh.k0], sh.p0,
        )  # fmt: skip
        self.codes[:n, 0] = code0
        cpc = self.cp_cache.rows(0, n)
        cpos = self.cp_pos[:n]
        cpos.zero_()
        x = torch.stack((m.project_to_predictor(h), m.codec_embd_in.index_select(0, code0)), 1)
        hid = cp.forward(x, cpos, cpc, kv_len=2 if cp_len is None else cp_len)[:, -1]
        heads, embd = m.cp_heads_t, m.cp_embd_in
        for g in range(self.n_groups):
            c = draw_rows(
                torch.matmul(hid, heads[g]).float(), self.cp_greedy[:n], self.cp_temp[:n],
                self.cp_top_k[:n], self.cp_top_p[:n], self.noisec[:n, g, : sh.kc], sh.pc,
            )  # fmt: skip
            self.codes[:n, g + 1] = c
            if g + 1 < self.n_groups:
                cpos.fill_(g + 2)
                xg = embd[g].index_select(0, c).unsqueeze(1)
                hid = cp.forward(xg, cpos, cpc, kv_len=g + 3 if cp_len is None else cp_len)[:, 0]

    def talker_step(self, n: int, kv_len: int) -> None:
        """Codebook-0 history, then one talker step of rows ``0..n-1`` on this frame's codes."""
        m = self.model
        valid = self.valid[:n]
        self.seen[:n].scatter_(1, self.codes[:n, :1], valid[:, None])
        self.frame_i[:n] += 1
        x = (m.frames_embedding(self.codes[:n]) + self.text[:n]).unsqueeze(1)
        cache = self.cache.rows(0, n)
        out = m.talker.forward(x, self.pos[:n], cache, kv_len=kv_len, lengths=valid.long())
        self.h[:n] = out[:, 0]
        self.pos[:n] += valid.long()

    def step(self, n: int) -> npt.NDArray[np.int64]:
        """Eager step over rows ``0..n-1``; the frames ``[n, 16]`` (host copy)."""
        shape, top = self.prepare_step(n)
        self.step_body(n, shape, top, None)
        return self.codes[:n].cpu().numpy().copy()
