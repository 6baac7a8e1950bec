"""Fused MoE (Triton grouped GEMMs over expert-sorted pairs) against the torch reference."""

from __future__ import annotations

import pytest
import torch

from radixlm.kernels._triton import HAS_TRITON
from radixlm.kernels.fused_moe import (
    SMALL_PAIRS,
    MoEConfig,
    MoEGemvConfig,
    fused_moe,
    moe_config,
)
from radixlm.kernels.moe_align import align_pairs, align_pairs_ref
from radixlm.kernels.testing import assert_close
from radixlm.runtime.models.moe import fused_moe_torch, route

pytestmark = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")


@pytest.mark.parametrize("align", [align_pairs, align_pairs_ref], ids=["triton", "ref"])
def test_align_pairs_groups_by_expert_and_pads(device, align) -> None:
    ids = torch.tensor([[2, 0], [2, 3], [0, 2]], device=device)
    pairs, experts = align(ids, num_experts=5, block_m=4)
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
    ("tokens", "top_k", "experts", "block_m"),
    [
        (1, 1, 4, 16),
        (7, 2, 6, 4),  # experts not a power of two
        (300, 8, 128, 64),  # 10 chunks of pairs
        (513, 4, 60, 16),
        (4096, 8, 128, 64),  # MAX_CHUNKS chunks
        (4200, 8, 128, 64),  # 66 chunks of two one-hot tiles each
        (2100, 2, 8, 32),  # few experts: long one-hot tiles
        (64, 8, 256, 16),  # many experts, most of them idle
    ],
)
def test_align_pairs_kernel_equals_the_reference(device, tokens, top_k, experts, block_m) -> None:
    """The Triton sort (counts, offsets, places per chunk) gives exactly the stable argsort's
    order, padding and block experts, skewed routing included (a few experts take most pairs)."""
    skewed = torch.randint(0, max(1, experts // 8), (tokens, top_k), device=device)
    uniform = torch.randint(0, experts, (tokens, top_k), device=device)
    for ids in (uniform, skewed, torch.where(uniform % 3 == 0, skewed, uniform)):
        got = align_pairs(ids, experts, block_m)
        want = align_pairs_ref(ids, experts, block_m)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize(
    ("tokens", "experts", "top_k", "dtype"),
    [
        (1, 8, 2, torch.float32),
        (13, 4, 2, torch.float32),
        (40, 8, 3, torch.float16),
        (9, 4, 2, torch.bfloat16),
    ],
)
@pytest.mark.parametrize("tma", [False, True], ids=["pointers", "tma"])
def test_fused_moe_matches_reference(device, tokens, experts, top_k, dtype, tma) -> None:
    """The sorted grouped GEMMs, weight tiles loaded through pointers or TMA descriptors (gate_up's
    gate and up tiles in one 3-D load), each GEMM with its own tiles; the last N and K tiles of
    both GEMMs run past the weights' rows and columns (inter 48 and hidden 80 against 32-wide
    tiles)."""
    if tma and device == "cuda" and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("TMA needs a Hopper GPU")
    hidden, inter = 80, 48
    x = torch.randn(tokens, hidden, device=device, dtype=dtype)
    w13 = (torch.randn(experts, 2 * inter, hidden, device=device) * 0.1).to(dtype)
    w2 = (torch.randn(experts, hidden, inter, device=device) * 0.1).to(dtype)
    logits = torch.randn(tokens, experts, device=device)
    weights, ids = route(logits, top_k, renormalize=True, dtype=dtype)
    cfg = MoEConfig(16, 32, 32, 4, 1, down=(32, 16, 4, 1))
    out = fused_moe(x, w13, w2, weights, ids, cfg, tma=tma)  # the sorted grouped GEMM
    assert_close(out, fused_moe_torch(x, w13, w2, weights, ids), dtype, "fused moe")


@pytest.mark.parametrize(
    ("tokens", "experts", "top_k", "dtype"),
    [
        (1, 8, 2, torch.float32),
        (3, 4, 2, torch.float32),  # tokens sharing experts
        (2, 8, 3, torch.float16),
        (1, 8, 4, torch.bfloat16),
    ],
)
def test_small_t_gemv_path_matches_reference(device, tokens, experts, top_k, dtype) -> None:
    """The sorting-free GEMV path (decode: a few (token, expert) pairs) against the reference,
    with hidden and inter not multiples of its tiles (masked rows and K tails)."""
    hidden, inter = 72, 40
    x = torch.randn(tokens, hidden, device=device, dtype=dtype)
    w13 = (torch.randn(experts, 2 * inter, hidden, device=device) * 0.1).to(dtype)
    w2 = (torch.randn(experts, hidden, inter, device=device) * 0.1).to(dtype)
    weights, ids = route(torch.randn(tokens, experts, device=device), top_k, False, dtype)
    cfg = MoEGemvConfig(16, 32, 4, 8, 16, 4)  # each kernel its own tiles
    out = fused_moe(x, w13, w2, weights, ids, cfg)
    assert_close(out, fused_moe_torch(x, w13, w2, weights, ids), dtype, "fused moe gemv")


def test_default_config_takes_the_gemv_path_for_few_pairs() -> None:
    """Untimed defaults: decode-sized T * k runs the GEMV path, larger batches the grouped GEMM
    (start-up timing, `select_moe_config`, then picks per batch bucket on the GPU)."""
    assert isinstance(moe_config(1 * 8), MoEGemvConfig)
    assert isinstance(moe_config(SMALL_PAIRS), MoEGemvConfig)
    assert isinstance(moe_config(SMALL_PAIRS + 1), MoEConfig)
