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
