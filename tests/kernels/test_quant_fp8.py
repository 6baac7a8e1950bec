"""Per-token FP8 activation quantisation: the reference's contract, the kernel against it."""

from __future__ import annotations

import pytest
import torch

from radixlm.kernels._triton import HAS_TRITON
from radixlm.kernels.quant_fp8 import (
    FP8_DTYPE,
    FP8_MAX,
    MIN_SCALE,
    per_token_quant_fp8,
    per_token_quant_fp8_ref,
)

needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")


def test_reference_scales_each_row_to_the_fp8_range() -> None:
    x = torch.randn(4, 100) * torch.tensor([[1e-3], [1.0], [50.0], [0.0]])
    q, scale = per_token_quant_fp8_ref(x)
    assert q.dtype == FP8_DTYPE and scale.shape == (4, 1)
    # The largest element of each non-zero row lands exactly on +-FP8_MAX.
    assert torch.equal(q[:3].float().abs().amax(1), torch.full((3,), FP8_MAX))
    assert scale[3].item() == pytest.approx(MIN_SCALE) and not q[3].float().any()
    # e4m3 keeps 3 mantissa bits: relative error <= 2^-4 above the subnormal range.
    deq = q.float() * scale
    big = x.abs() >= scale * 2.0**-6
    assert ((deq - x).abs() <= x.abs() * 2.0**-4 + 1e-12)[big].all()


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k", [96, 5000])  # 5000: several blocks per row
def test_kernel_matches_reference(device: str, dtype: torch.dtype, k: int) -> None:
    base = torch.randn(3, k + 8, device=device) * torch.tensor(
        [[0.01], [1.0], [30.0]], device=device
    )
    x = base.to(dtype)[:, 4 : 4 + k]  # a strided view: row stride != k
    x[1, 7] = 0.0
    q, scale = per_token_quant_fp8(x)
    q_ref, scale_ref = per_token_quant_fp8_ref(x)
    assert q.shape == (3, k) and q.dtype == FP8_DTYPE and q.is_contiguous()
    torch.testing.assert_close(scale, scale_ref, rtol=1e-6, atol=0)
    if device == "cpu":  # the interpreter divides like numpy: bit-exact
        assert torch.equal(q.float(), q_ref.float())
    # Equal up to one FP8 ulp where the GPU's division rounds differently (module NOTE).
    diff = (q.float() - q_ref.float()).abs()
    assert (diff <= q_ref.float().abs() * 2.0**-3 + 2.0**-9).all()
    assert (diff == 0).float().mean() > 0.99


@needs_triton
def test_kernel_handles_an_empty_batch(device: str) -> None:
    q, scale = per_token_quant_fp8(torch.empty(0, 64, device=device))
    assert q.shape == (0, 64) and scale.shape == (0, 1)
