"""The sampler's CPU mask path (numpy) equals the kernel's torch reference, rows and padding."""

from __future__ import annotations

import pytest
import torch

from radixlm.kernels.token_bitmask import apply_token_bitmask_inplace_ref
from radixlm.kernels.token_bitmask_cpu import apply_bitmask_cpu


@pytest.mark.parametrize("vocab", [64, 100, 49152, 49152 + 37])
@pytest.mark.parametrize("rows", [None, [1], [0, 2]])
def test_matches_reference(vocab, rows):
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(3, vocab, generator=gen)
    words = min((vocab + 31) // 32, 1536)  # a model vocab wider than the mask: padding is -inf
    mask = torch.randint(-(2**31), 2**31 - 1, (3, words), dtype=torch.int32, generator=gen)
    mask[0, 0] = -1  # bit 31 set: the sign bit
    idx = None if rows is None else torch.tensor(rows)
    expected, got = logits.clone(), logits.clone()
    apply_token_bitmask_inplace_ref(expected, mask, idx)
    apply_bitmask_cpu(got, mask, idx)
    assert torch.equal(expected, got)


@pytest.mark.parametrize("vocab", [100, 49152 + 37])
@pytest.mark.parametrize("rows", [None, [0, 2]])
@pytest.mark.parametrize("density", [0.0, 0.02, 0.5, 1.0])
def test_masked_argmax_equals_mask_then_argmax(vocab, rows, density):
    """The sampler's lazy greedy path picks exactly the tokens of masking every row first, ties
    included (integer logits repeat their maximum) and rows whose argmax the mask refuses."""
    from radixlm.runtime.sampling.sampler import sample
    from radixlm.runtime.sampling.sampling_batch import SamplingBatch
    from radixlm.runtime.sampling.vocab_mask import DenseMask

    gen = torch.Generator().manual_seed(vocab + int(100 * density))
    logits = torch.randint(0, 6, (4, vocab), generator=gen).float()
    allowed = torch.rand(4, vocab, generator=gen) < density
    allowed[1, logits[1].argmax()] = True  # one row whose plain argmax is allowed
    bits = torch.zeros(4, ((vocab + 31) // 32) * 32, dtype=torch.int64)
    bits[:, :vocab] = allowed.long()
    weights = 2 ** torch.arange(32, dtype=torch.int64)
    packed = (bits.view(4, -1, 32) * weights).sum(-1)
    mask = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)
    idx = None if rows is None else torch.tensor(rows)
    expected = logits.clone()
    apply_token_bitmask_inplace_ref(expected, mask, idx)
    sb = SamplingBatch.greedy_only(4)
    sb.set_vocab_mask(DenseMask(mask, idx))
    got = sample(logits.clone(), sb).next_token_ids
    assert torch.equal(got, expected.argmax(dim=-1))
