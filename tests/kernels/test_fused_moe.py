"""Fused MoE (Triton grouped GEMMs over expert-sorted pairs) against the torch reference."""

from __future__ import annotations

import pytest
import torch

from radixlm.kernels._triton import HAS_TRITON
from radixlm.kernels.fused_moe import align_pairs, fused_moe
from radixlm.kernels.testing import assert_close
from radixlm.runtime.models.moe import fused_moe_torch, route

pytestmark = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")


def test_align_pairs_groups_by_expert_and_pads() -> None:
    ids = torch.tensor([[2, 0], [2, 3], [0, 2]])
    pairs, experts = align_pairs(ids, num_experts=5, block_m=4)
    n = ids.numel()
    assert pairs.numel() % 4 == 0 and experts.numel() == pairs.numel() // 4
    flat = ids.reshape(-1)
    seen = []
    for b, e in enumerate(experts.tolist()):
        block = pairs[4 * b : 4 * b + 4].tolist()
        real = [p for p in block if p < n]
        if e < 0:
            assert not real
            continue
        assert real and all(int(flat[p]) == e for p in real)
        seen += real
    assert sorted(seen) == list(range(n))  # every pair exactly once


@pytest.mark.parametrize(
    ("tokens", "experts", "top_k", "dtype"),
    [
        (1, 8, 2, torch.float32),
        (13, 4, 2, torch.float32),
        (40, 8, 3, torch.float16),
        (9, 4, 2, torch.bfloat16),
    ],
)
def test_fused_moe_matches_reference(device, tokens, experts, top_k, dtype) -> None:
    hidden, inter = 64, 48  # inter not a multiple of the N tile
    x = torch.randn(tokens, hidden, device=device, dtype=dtype)
    w13 = (torch.randn(experts, 2 * inter, hidden, device=device) * 0.1).to(dtype)
    w2 = (torch.randn(experts, hidden, inter, device=device) * 0.1).to(dtype)
    logits = torch.randn(tokens, experts, device=device)
    weights, ids = route(logits, top_k, renormalize=True, dtype=dtype)
    out = fused_moe(x, w13, w2, weights, ids)
    assert_close(out, fused_moe_torch(x, w13, w2, weights, ids), dtype, "fused moe")
