"""The sampler: logit processors, logprobs, and token selection for one batch.

Order (as SGLang): penalties, logit bias, min-new-tokens ban and grammar mask edit the logits in
place; logprobs are taken from those logits (before temperature); then temperature, top-k, top-p,
min-p, and a draw. Each request draws from its own `torch.Generator`, so a seeded request gives
the same tokens whatever else shares its batch.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from radixlm.runtime.sampling.sampling_batch import SamplingBatch


class SampleOutput(NamedTuple):
    next_token_ids: torch.Tensor  # [B] int64
    logprobs: torch.Tensor | None  # [B] logprob of each chosen token
    top_logprobs: tuple[torch.Tensor, torch.Tensor] | None  # ([B, k] values, [B, k] ids)


def apply_logit_processors(
    logits: torch.Tensor, sb: SamplingBatch, grammar_mask: bool = True
) -> torch.Tensor:
    """Edit float32 logits `[B, V]` in place; returns them."""
    if sb.repetition is not None:
        assert sb.seen_mask is not None
        penalised = torch.where(logits > 0, logits / sb.repetition, logits * sb.repetition)
        logits = torch.where(sb.seen_mask, penalised, logits, out=logits)
    if sb.frequency is not None:
        assert sb.output_counts is not None and sb.presence is not None
        logits -= sb.frequency * sb.output_counts + sb.presence * (sb.output_counts > 0)
    if sb.logit_bias is not None:
        logits += sb.logit_bias
    if sb.min_tokens_ban is not None:
        logits[sb.min_tokens_ban] = float("-inf")
    if sb.vocab_mask is not None and grammar_mask:
        from radixlm.kernels import token_bitmask

        # NOTE: only the constrained rows are unpacked (`rows`), the others untouched.
        bits, rows = sb.vocab_mask.dense()
        if logits.is_cuda:
            token_bitmask.apply_token_bitmask_inplace(logits, bits, rows)
        elif logits.dtype == torch.float32 and logits.is_contiguous():
            from radixlm.kernels.token_bitmask_cpu import apply_bitmask_cpu

            apply_bitmask_cpu(logits, bits, rows)
        else:
            token_bitmask.apply_token_bitmask_inplace_ref(logits, bits, rows)
    return logits


@torch.inference_mode()
def sample(
    logits: torch.Tensor, sb: SamplingBatch, return_logprob: bool = False, top_logprobs_num: int = 0
) -> SampleOutput:
    # NOTE: inference mode: the model runner's logits are inference tensors, which the logit
    # processors edit in place.
    # NOTE: greedy CPU rows without logprobs apply the grammar mask lazily (vocab_mask.py): the
    # same tokens, without masking (or even computing the mask of) rows whose argmax the grammar
    # allows.
    lazy_mask = (
        sb.all_greedy
        and sb.vocab_mask is not None
        and not (return_logprob or top_logprobs_num)
        and not logits.is_cuda
        and logits.dtype == torch.float32
        and logits.is_contiguous()
    )
    logits = apply_logit_processors(logits, sb, grammar_mask=not lazy_mask)
    logprobs = top = None
    if return_logprob or top_logprobs_num:
        logp = torch.log_softmax(logits, dim=-1)
    if lazy_mask:
        from radixlm.kernels.token_bitmask_cpu import remask_argmax

        assert sb.vocab_mask is not None
        ids = logits.numpy().argmax(axis=-1)  # NOTE: the first maximum, as torch's
        refused = sb.vocab_mask.refused(ids)
        if refused:
            remask_argmax(logits, ids, sb.vocab_mask.host_bits(refused), refused)
        next_ids = torch.from_numpy(ids)
    elif sb.all_greedy:
        next_ids = argmax(logits)
    else:
        next_ids = _sample_rows(logits, sb)
    if return_logprob or top_logprobs_num:
        logprobs = logp.gather(1, next_ids.view(-1, 1)).view(-1)
        if top_logprobs_num:
            top = tuple(logp.topk(top_logprobs_num, dim=-1))
    return SampleOutput(next_ids, logprobs, top)


def argmax(x: torch.Tensor) -> torch.Tensor:
    """Row-wise argmax of `[B, V]` (the Triton two-stage kernel on the GPU, where torch's takes
    a sixth of a batch-1 step's lm_head time)."""
    if x.is_cuda:
        from radixlm.kernels.argmax import argmax_rows

        return argmax_rows(x)
    if x.dtype == torch.float32 and x.dim() == 2 and x.is_contiguous():
        # NOTE: numpy's row argmax is ~14x faster than torch's on one CPU thread (48 vs 680 us
        # for [16, 49152]); the same first maximum.
        return torch.from_numpy(x.numpy().argmax(axis=-1))
    return x.argmax(dim=-1)


def _sample_rows(logits: torch.Tensor, sb: SamplingBatch) -> torch.Tensor:
    assert sb.temperatures is not None and sb.greedy is not None
    greedy_ids = argmax(logits)
    probs = torch.softmax(logits / sb.temperatures, dim=-1)
    if sb.top_ks is not None or sb.top_ps is not None or sb.min_ps is not None:
        probs = _filter(probs, sb)
    # Exponential race: argmax(p / E) with E ~ Exp(1) draws from p; E comes from each row's own
    # generator, so a row's draw does not depend on the other rows.
    noise = torch.empty_like(probs)
    for i, gen in enumerate(sb.generators):
        noise[i].exponential_(generator=gen)
    drawn = argmax(probs / noise)
    return torch.where(sb.greedy, greedy_ids, drawn)


def _filter(probs: torch.Tensor, sb: SamplingBatch) -> torch.Tensor:
    """top-k, top-p (nucleus) and min-p filtering over sorted probabilities."""
    sorted_p, order = probs.sort(dim=-1, descending=True)
    drop = torch.zeros_like(sorted_p, dtype=torch.bool)
    if sb.top_ks is not None:
        ranks = torch.arange(probs.shape[-1], device=probs.device).view(1, -1)
        drop |= ranks >= sb.top_ks.view(-1, 1)
    if sb.top_ps is not None:
        # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
        before = sorted_p.cumsum(dim=-1) - sorted_p
        drop |= before > sb.top_ps.view(-1, 1)
    if sb.min_ps is not None:
        drop |= sorted_p < sorted_p[:, :1] * sb.min_ps.view(-1, 1)
    sorted_p = sorted_p.masked_fill(drop, 0.0)
    return torch.zeros_like(probs).scatter_(1, order, sorted_p)
