"""Two-stage argmax (greedy sampling) against torch.argmax."""

from __future__ import annotations

import pytest
import torch

from radixlm.kernels._triton import HAS_TRITON
from radixlm.kernels.argmax import argmax_rows, argmax_rows_ref

pytestmark = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("batch", "vocab", "block"), [(1, 1000, 128), (5, 257, 64), (3, 7, 4096)])
def test_argmax_matches_torch(
    device: str, dtype: torch.dtype, batch: int, vocab: int, block: int
) -> None:
    x = torch.randn(batch, vocab, generator=torch.Generator().manual_seed(vocab)).to(device, dtype)
    got = argmax_rows(x, block=block)
    assert got.dtype == torch.int64
    assert torch.equal(got, argmax_rows_ref(x))


def test_argmax_ties_masks_and_strides(device: str) -> None:
    """Ties inside a chunk and across chunks go to the lowest column; -inf (masked) columns never
    win unless the whole row is masked (then column 0); rows may be strided."""
    x = torch.full((4, 300), -5.0, device=device)
    x[0, [70, 3, 200]] = 2.0  # tie across chunks (block 64): column 3
    x[1, [40, 41]] = 9.0  # tie inside one chunk
    x[2] = float("-inf")
    x[2, 299] = -1e30  # the only unmasked column, in the last partial chunk
    x[3] = float("-inf")  # fully masked row
    wide = torch.zeros(4, 512, device=device)
    wide[:, :300] = x
    got = argmax_rows(wide[:, :300], block=64)
    assert got.tolist() == [3, 40, 299, 0] == argmax_rows_ref(x).tolist()
