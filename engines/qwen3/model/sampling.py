"""Per-row sampling of one batched frame step, with no host sync (the rules of the
official ``qwen_tts`` ``generate``).

Rule 1: each batch row carries its own sampling parameters and its own seeded
generator, so a seeded request draws the same noise, and so the same codes,
alone or in a batch. Rule 2: this file knows nothing of models or caches: it
turns scores into ids.

Draws are Gumbel-max: ``argmax(s + T * g)`` with ``g = -log(Exp(1))`` picks
from ``softmax(s / T)`` exactly, without a probability tensor, a multinomial
or a host sync (so it lives inside CUDA graphs). Order (HF warpers):
temperature, top-k, top-p, draw; greedy rows take the argmax.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

Tensor = torch.Tensor


class SamplingFields(Protocol):
    """The sampling fields of a request (``ModeSynthesizeRequest``) that a batch row copies."""

    @property
    def greedy(self) -> bool: ...
    @property
    def temperature(self) -> float: ...
    @property
    def top_k(self) -> int: ...
    @property
    def top_p(self) -> float: ...
    @property
    def repetition_penalty(self) -> float: ...
    @property
    def cp_greedy(self) -> bool: ...
    @property
    def subtalker_temperature(self) -> float: ...
    @property
    def subtalker_top_k(self) -> int: ...
    @property
    def subtalker_top_p(self) -> float: ...


@dataclass(frozen=True)
class RowSampling:
    """The sampling setup of one request, for codebook 0 (talker) and the predictor."""

    greedy: bool
    temperature: float
    top_k: int
    top_p: float
    repetition_penalty: float
    cp_greedy: bool
    cp_temperature: float
    cp_top_k: int
    cp_top_p: float

    @classmethod
    def of(cls, req: SamplingFields) -> RowSampling:
        return cls(
            greedy=req.greedy,
            temperature=float(req.temperature),
            top_k=int(req.top_k),
            top_p=float(req.top_p),
            repetition_penalty=float(req.repetition_penalty),
            cp_greedy=req.cp_greedy,
            cp_temperature=float(req.subtalker_temperature),
            cp_top_k=int(req.subtalker_top_k),
            cp_top_p=float(req.subtalker_top_p),
        )


def candidates(top_k: int, vocab: int) -> int:
    """Ids a draw looks at: top-k when it restricts, else the whole vocabulary."""
    return top_k if 0 < top_k < vocab else vocab


def gumbel(shape: tuple[int, ...], device: torch.device, gen: torch.Generator) -> Tensor:
    """Standard Gumbel noise ``-log(Exp(1))`` of ``shape`` (finite: Exp clamped > 0)."""
    e = torch.empty(shape, dtype=torch.float32, device=device).exponential_(generator=gen)
    return e.clamp_min_(1e-30).log_().neg_()


def draw_rows(
    scores: Tensor,
    greedy: Tensor,
    temperature: Tensor,
    top_k: Tensor,
    top_p: Tensor,
    noise: Tensor,
    nucleus: bool = True,
) -> Tensor:
    """One id per row of float32 ``scores [B, V]`` -> long ``[B]``.

    ``greedy [B]`` bool; ``temperature``, ``top_p`` float ``[B]``; ``top_k [B]`` long,
    already ``candidates(top_k, V)``. ``noise [B, K]``: row ``b``'s Gumbel noise in
    its first ``top_k[b]`` columns, ``K >= max top_k`` of the sampled rows; ``K == 0``
    means every row is greedy (argmax only). ``nucleus`` False skips top-p (when no
    row has ``top_p < 1``; the result is the same, the kernels fewer).
    """
    best = torch.argmax(scores, dim=-1)
    k = noise.shape[1]
    if k == 0:
        return best
    vals, idx = torch.topk(scores, k, dim=-1)  # sorted, descending
    rank = torch.arange(k, device=scores.device)
    vals = vals.masked_fill(rank[None, :] >= top_k[:, None], float("-inf"))
    t = temperature[:, None]
    if nucleus:
        probs = torch.softmax(vals / t, dim=-1)
        # Drop the tail whose cumulative mass (from the bottom) is <= 1 - top_p; keep >= 1.
        rev_cum = torch.flip(torch.cumsum(torch.flip(probs, (1,)), 1), (1,))
        remove = (rev_cum <= (1.0 - top_p[:, None])) & (top_p[:, None] < 1.0)
        remove[:, 0] = False
        vals = vals.masked_fill(remove, float("-inf"))
    # argmax(s/T + g) == argmax(s + T*g) for T > 0
    choice = torch.argmax(vals + t * noise, dim=-1, keepdim=True)
    return torch.where(greedy, best, idx.gather(1, choice).squeeze(1))


def penalised(scores: Tensor, seen: Tensor, penalty: Tensor) -> Tensor:
    """Repetition penalty over the ids in ``seen [B, V]`` (``l > 0 ? l/p : l*p``)."""
    p = penalty[:, None]
    return torch.where(seen, torch.where(scores > 0, scores / p, scores * p), scores)
