"""Per-batch sampling state: the batch's parameters as tensors, built once per step from requests.

Built by the scheduler (`SamplingBatch.from_reqs`), consumed by `Sampler.sample`. Rows follow the
order of the batch's sampling requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from radixlm.runtime.sampling.sampling_params import SamplingParams
from radixlm.runtime.sampling.vocab_mask import VocabMask


class SamplingReq(Protocol):
    sampling_params: SamplingParams
    generator: torch.Generator | None
    origin_input_ids: list[int]
    output_ids: list[int]
    stop_ids_for_min_tokens: tuple[int, ...]  # eos + stop_token_ids, masked until min_new_tokens


@dataclass
class SamplingBatch:
    # NOTE: None when `all_greedy` (the decode fast path builds no tensor at all).
    temperatures: torch.Tensor | None  # [B, 1] float32; greedy rows hold 1.0
    greedy: torch.Tensor | None  # [B] bool
    all_greedy: bool
    top_ps: torch.Tensor | None  # [B] (None when no row needs it)
    top_ks: torch.Tensor | None  # [B] int64, vocab size where disabled
    min_ps: torch.Tensor | None  # [B]
    generators: list[torch.Generator | None]
    # Logit processors (None when no row needs them).
    frequency: torch.Tensor | None  # [B, 1]
    presence: torch.Tensor | None  # [B, 1]
    output_counts: torch.Tensor | None  # [B, V] counts of each token in the outputs
    repetition: torch.Tensor | None  # [B, 1]
    seen_mask: torch.Tensor | None  # [B, V] bool: token in prompt or output
    # (rows, ids) int64 index pairs of the tokens banned this step (eos and stop ids before
    # min_new_tokens): a few per row, so no [B, V] mask is built.
    min_tokens_ban: tuple[torch.Tensor, torch.Tensor] | None
    logit_bias: torch.Tensor | None  # [B, V]
    vocab_mask: VocabMask | None = None  # grammar mask (vocab_mask.py); None: none constrained

    def set_vocab_mask(self, mask: VocabMask | None) -> None:
        """Attach a grammar mask (constrained/manager.py `build_mask`, or a `DenseMask`)."""
        self.vocab_mask = mask

    @classmethod
    def greedy_only(cls, bs: int) -> SamplingBatch:
        """Argmax for every row, no logit processor: no tensor is built."""
        return cls(
            temperatures=None,
            greedy=None,
            all_greedy=True,
            top_ps=None,
            top_ks=None,
            min_ps=None,
            generators=[None] * bs,
            frequency=None,
            presence=None,
            output_counts=None,
            repetition=None,
            seen_mask=None,
            min_tokens_ban=None,
            logit_bias=None,
        )

    @classmethod
    def from_reqs(
        cls, reqs: Sequence[SamplingReq], vocab: int, device: torch.device
    ) -> SamplingBatch:
        sps = [r.sampling_params for r in reqs]
        bs = len(reqs)
        greedy_list = [sp.is_greedy for sp in sps]
        if all(greedy_list) and not any(needs_processor(r) for r in reqs):
            return cls.greedy_only(len(reqs))

        def col(values: list[float], dtype=torch.float32) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype, device=device)

        temps = col([1.0 if g else sp.temperature for sp, g in zip(sps, greedy_list)]).view(bs, 1)
        sampled = [sp for sp, g in zip(sps, greedy_list) if not g]
        need_top_p = any(sp.top_p < 1.0 for sp in sampled)
        need_top_k = any(sp.top_k not in (-1,) and sp.top_k < vocab for sp in sampled)
        need_min_p = any(sp.min_p > 0.0 for sp in sampled)
        need_freq = any(sp.frequency_penalty or sp.presence_penalty for sp in sps)
        need_rep = any(sp.repetition_penalty != 1.0 for sp in sps)

        output_counts = seen = None
        if need_freq or need_rep:
            output_counts = torch.zeros((bs, vocab), dtype=torch.float32, device=device)
            for i, r in enumerate(reqs):
                if r.output_ids:
                    ids = torch.tensor(r.output_ids, dtype=torch.int64, device=device)
                    output_counts[i].index_add_(0, ids, torch.ones_like(ids, dtype=torch.float32))
        if need_rep:
            seen = output_counts > 0
            for i, r in enumerate(reqs):
                seen[i, torch.tensor(r.origin_input_ids, dtype=torch.int64, device=device)] = True

        ban_rows: list[int] = []
        ban_ids: list[int] = []
        for i, r in enumerate(reqs):
            if len(r.output_ids) < r.sampling_params.min_new_tokens:
                ids = [t for t in r.stop_ids_for_min_tokens if 0 <= t < vocab]
                ban_rows += [i] * len(ids)
                ban_ids += ids
        ban = (col(ban_rows, torch.int64), col(ban_ids, torch.int64)) if ban_rows else None

        bias = None
        if any(sp.logit_bias for sp in sps):
            bias = torch.zeros((bs, vocab), dtype=torch.float32, device=device)
            for i, sp in enumerate(sps):
                for tok, b in (sp.logit_bias or {}).items():
                    bias[i, int(tok)] = float(b)

        all_greedy = all(greedy_list)
        return cls(
            temperatures=None if all_greedy else temps,
            greedy=None if all_greedy else torch.tensor(greedy_list, device=device),
            all_greedy=all_greedy,
            top_ps=col([sp.top_p for sp in sps]) if need_top_p else None,
            top_ks=col([sp.top_k if sp.top_k > 0 else vocab for sp in sps], torch.int64)
            if need_top_k
            else None,
            min_ps=col([sp.min_p for sp in sps]) if need_min_p else None,
            generators=[r.generator for r in reqs],
            frequency=col([sp.frequency_penalty for sp in sps]).view(bs, 1) if need_freq else None,
            presence=col([sp.presence_penalty for sp in sps]).view(bs, 1) if need_freq else None,
            output_counts=output_counts,
            repetition=col([sp.repetition_penalty for sp in sps]).view(bs, 1) if need_rep else None,
            seen_mask=seen,
            min_tokens_ban=ban,
            logit_bias=bias,
        )


def needs_processor(req: SamplingReq) -> bool:
    """Whether a greedy row still needs a logit processor (penalties, bias, min-tokens ban)."""
    sp = req.sampling_params
    return bool(
        sp.frequency_penalty
        or sp.presence_penalty
        or sp.repetition_penalty != 1.0
        or sp.logit_bias
        or len(req.output_ids) < sp.min_new_tokens
    )
