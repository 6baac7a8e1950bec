"""The sampler: logit processors, logprobs, and token selection for one batch.

Order (as SGLang): penalties, logit bias, min-new-tokens ban and grammar mask edit the logits in
place; logprobs are taken from those logits (before temperature); then temperature, top-k, top-p,
min-p, and a draw. Each request draws from its own `torch.Generator`, so a seeded request gives
the same tokens whatever else shares its batch.

Two paths. CPU float32 logits (`_sample_host`): the processors, then argmax or one C++ draw per
row (kernels/cpu/sample.py: softmax, the filters and an inverse-CDF draw; torch's exponential
noise and sort cost ~3 ms a row there), and the grammar mask only on the rows that read it.
Elsewhere (the GPU): the mask on every constrained row, then an exponential race.
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
    want_logprobs = bool(return_logprob or top_logprobs_num)
    on_host = not logits.is_cuda and logits.dtype == torch.float32 and logits.is_contiguous()
    if on_host and (sb.all_greedy or host_sampler_available()):
        next_ids, logits = _sample_host(logits, sb, want_logprobs)
    else:
        logits = apply_logit_processors(logits, sb)
        next_ids = argmax(logits) if sb.all_greedy else _sample_rows(logits, sb)
    logprobs = top = None
    if want_logprobs:
        logp = torch.log_softmax(logits, dim=-1)
        logprobs = logp.gather(1, next_ids.view(-1, 1)).view(-1)
        if top_logprobs_num:
            top = tuple(logp.topk(top_logprobs_num, dim=-1))
    return SampleOutput(next_ids, logprobs, top)


def host_sampler_available() -> bool:
    from radixlm.kernels.cpu.linear import _lib

    return _lib() is not None


def _sample_host(
    logits: torch.Tensor, sb: SamplingBatch, want_logprobs: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """CPU float32 logits: the tokens, and the logits with every constrained row masked where
    logprobs are wanted. Each row's grammar mask is applied only when its row reads it:
    - greedy rows take their argmax; a row whose grammar refuses it is masked and takes the
      masked argmax (the same token: an allowed first maximum is the masked row's too);
    - sampled rows draw with kernels/cpu/sample.py. A constrained row with top-k, top-p or min-p
      is masked first (the filters read the masked distribution); one without draws from the
      unmasked row, and only where its grammar refuses the token is it masked and drawn again
      with a second uniform: exactly the masked distribution (P(a) = p(a) + (1 - p(A)) p(a) /
      p(A) = p(a) / p(A) for a in the allowed set A).
    Which of these a row takes depends on its own parameters only, so a seeded request draws the
    same tokens whatever shares its batch. Most steps of a constrained request compute no mask.
    """
    from radixlm.kernels.token_bitmask_cpu import apply_bitmask_cpu

    logits = apply_logit_processors(logits, sb, grammar_mask=False)
    mask = sb.vocab_mask
    ids = logits.numpy().argmax(axis=-1)  # NOTE: the first maximum, as torch's
    sampled: list[int] = []
    if not sb.all_greedy:
        assert sb.greedy is not None
        sampled = [i for i, g in enumerate(sb.greedy.tolist()) if not g]
        draw = _HostDraw(logits, sb)
        if mask is not None:
            filtered = set(mask.constrained_rows()) & set(draw.filtered_rows(sampled))
            if filtered:
                rows = sorted(filtered)
                apply_bitmask_cpu(logits, mask.host_bits(rows), torch.tensor(rows))
        ids[sampled] = draw(sampled)
    if mask is not None:
        refused = mask.refused(ids)
        if refused:
            apply_bitmask_cpu(logits, mask.host_bits(refused), torch.tensor(refused))
            redraw = sorted(set(refused) & set(sampled))
            for i in sorted(set(refused) - set(sampled)):
                ids[i] = logits[i].numpy().argmax()
            if redraw:
                ids[redraw] = draw(redraw)
        if want_logprobs:
            bits, rows = mask.dense()
            apply_bitmask_cpu(logits, bits, rows)
    return torch.from_numpy(ids), logits


class _HostDraw:
    """One draw per row with the C++ kernel, each row's uniform from its own generator (the
    global one where it has none)."""

    def __init__(self, logits: torch.Tensor, sb: SamplingBatch) -> None:
        assert sb.temperatures is not None
        vocab = logits.shape[1]
        bs = logits.shape[0]
        self.logits = logits
        self.generators = sb.generators
        self.temps = sb.temperatures.view(-1).tolist()
        self.top_k = sb.top_ks.tolist() if sb.top_ks is not None else [vocab] * bs
        self.top_p = sb.top_ps.tolist() if sb.top_ps is not None else [1.0] * bs
        self.min_p = sb.min_ps.tolist() if sb.min_ps is not None else [0.0] * bs
        self.vocab = vocab

    def filtered_rows(self, rows: list[int]) -> list[int]:
        return [
            i
            for i in rows
            if self.top_k[i] < self.vocab or self.top_p[i] < 1.0 or self.min_p[i] > 0.0
        ]

    def __call__(self, rows: list[int]) -> list[int]:
        from radixlm.kernels.cpu.sample import sample_rows

        uniforms = [
            torch.rand((), dtype=torch.float64, generator=self.generators[i]).item() for i in rows
        ]
        drawn = sample_rows(
            self.logits, rows, [self.temps[i] for i in rows], [self.top_k[i] for i in rows],
            [self.top_p[i] for i in rows], [self.min_p[i] for i in rows], uniforms,
        )  # fmt: skip
        assert drawn is not None  # host_sampler_available()
        # NOTE: a row whose every logit is -inf (-1) takes token 0, as torch's path does.
        return drawn.clamp_min(0).tolist()


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
