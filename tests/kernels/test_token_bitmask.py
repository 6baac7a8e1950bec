"""Token bitmask: the torch reference against a brute-force loop, the kernel against the reference."""

from __future__ import annotations

import pytest
import torch

from radixlm.kernels._triton import HAS_TRITON
from radixlm.kernels.token_bitmask import (
    apply_token_bitmask_inplace,
    apply_token_bitmask_inplace_ref,
    unpack_bitmask,
)

needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")


def _random_bitmask(rows: int, words: int, device: str) -> torch.Tensor:
    mask = torch.randint(-(2**31), 2**31 - 1, (rows, words), dtype=torch.int32, device=device)
    mask[0] = -1  # everything allowed
    mask[-1] = 0  # nothing allowed
    return mask


def _brute_force(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> torch.Tensor:
    out = logits.clone()
    words = bitmask.shape[1]
    for r in rows:
        for j in range(logits.shape[1]):
            w = j // 32
            if w >= words or not (int(bitmask[r, w]) >> (j % 32)) & 1:
                out[r, j] = float("-inf")
    return out


@pytest.mark.parametrize(("vocab", "words"), [(96, 3), (100, 4), (130, 3)])
def test_reference_against_brute_force(vocab: int, words: int) -> None:
    logits = torch.randn(4, vocab)
    bitmask = _random_bitmask(4, words, "cpu")
    got = logits.clone()
    apply_token_bitmask_inplace_ref(got, bitmask)
    assert torch.equal(got, _brute_force(logits, bitmask, [0, 1, 2, 3]))
    got = logits.clone()
    apply_token_bitmask_inplace_ref(got, bitmask, torch.tensor([2, 0]))
    assert torch.equal(got, _brute_force(logits, bitmask, [2, 0]))


def test_unpack_bit_order() -> None:
    bitmask = torch.tensor([[0b101, -(2**31)]], dtype=torch.int32)  # tokens 0, 2 and 63 allowed
    allowed = unpack_bitmask(bitmask, 70)
    assert allowed.nonzero()[:, 1].tolist() == [0, 2, 63]


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("vocab", "words"), [(96, 3), (100, 4), (5000, 150), (131, 3)])
@pytest.mark.parametrize("use_indices", [False, True])
def test_kernel_matches_reference(
    device: str, dtype: torch.dtype, vocab: int, words: int, use_indices: bool
) -> None:
    rows = 5
    logits = torch.randn(rows, vocab, device=device).to(dtype)
    bitmask = _random_bitmask(rows, words, device)
    indices = torch.tensor([3, 0, 4], device=device) if use_indices else None
    got, expected = logits.clone(), logits.clone()
    apply_token_bitmask_inplace(got, bitmask, indices)
    apply_token_bitmask_inplace_ref(expected, bitmask, indices)
    assert torch.equal(got, expected)
    if use_indices:
        assert torch.equal(got[[1, 2]], logits[[1, 2]])  # rows not listed are untouched


@needs_triton
def test_kernel_strided_logits(device: str) -> None:
    base = torch.randn(3, 200, device=device)
    logits = base[:, :150]  # row stride 200
    bitmask = _random_bitmask(3, 5, device)
    expected = logits.clone()
    apply_token_bitmask_inplace_ref(expected, bitmask)
    apply_token_bitmask_inplace(logits, bitmask)
    assert torch.equal(logits, expected)
    assert not torch.isinf(base[:, 150:]).any()  # columns past the view untouched
