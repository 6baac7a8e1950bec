"""RMSNorm / fused add + RMSNorm: references against HF-style math, kernels against references."""

from __future__ import annotations

import pytest
import torch

from radixlm.kernels._triton import HAS_TRITON
from radixlm.kernels.rmsnorm import fused_add_rmsnorm, fused_add_rmsnorm_ref, rmsnorm, rmsnorm_ref

needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")

# NOTE: Triton's interpreter truncates fp32 -> bf16 (the GPU rounds to nearest even), so bf16
# results may differ by one bf16 ulp there; fp32/fp16 are compared tightly.
TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (1e-3, 1e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}


def test_reference_matches_torch_rms_norm() -> None:
    x = torch.randn(5, 96)
    w = torch.randn(96)
    expected = torch.nn.functional.rms_norm(x, (96,), w, eps=1e-5)
    torch.testing.assert_close(rmsnorm_ref(x, w, 1e-5), expected, atol=1e-5, rtol=1e-5)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("hidden", [64, 96, 4096])
def test_rmsnorm_matches_reference(device: str, dtype: torch.dtype, hidden: int) -> None:
    x = torch.randn(2, 3, hidden, device=device).to(dtype)
    w = (1 + 0.1 * torch.randn(hidden, device=device)).to(dtype)
    atol, rtol = TOL[dtype]
    got = rmsnorm(x, w, 1e-6)
    assert got.dtype == dtype and got.shape == x.shape
    torch.testing.assert_close(got, rmsnorm_ref(x, w, 1e-6), atol=atol, rtol=rtol)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("inplace", [False, True])
def test_fused_add_rmsnorm_matches_reference(
    device: str, dtype: torch.dtype, inplace: bool
) -> None:
    hidden = 576
    x = torch.randn(7, hidden, device=device).to(dtype)
    residual = torch.randn(7, hidden, device=device).to(dtype)
    w = (1 + 0.1 * torch.randn(hidden, device=device)).to(dtype)
    exp_out, exp_res = fused_add_rmsnorm_ref(x, residual, w, 1e-5)
    x_in, res_in = x.clone(), residual.clone()
    out, res = fused_add_rmsnorm(x_in, res_in, w, 1e-5, inplace=inplace)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(out, exp_out, atol=atol, rtol=rtol)
    torch.testing.assert_close(res, exp_res, atol=atol, rtol=rtol)
    if inplace:
        assert out.data_ptr() == x_in.data_ptr() and res.data_ptr() == res_in.data_ptr()
    else:
        assert torch.equal(x_in, x) and torch.equal(res_in, residual)


@needs_triton
def test_rmsnorm_strided_rows(device: str) -> None:
    base = torch.randn(6, 160, device=device)
    x = base[:, :128]  # rows with stride 160
    w = torch.randn(128, device=device)
    torch.testing.assert_close(rmsnorm(x, w), rmsnorm_ref(x, w), atol=1e-5, rtol=1e-5)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_unit_offset_rmsnorm_matches_gemma(device: str, dtype: torch.dtype) -> None:
    """`unit_offset`: Gemma's `(1 + w)` RMSNorm in fp32, plain and with the residual add; the
    reference equals the model's torch GemmaRMSNorm."""
    from radixlm.runtime.models.gemma import GemmaRMSNorm

    hidden = 96
    x = torch.randn(5, hidden, device=device).to(dtype)
    residual = torch.randn(5, hidden, device=device).to(dtype)
    norm = GemmaRMSNorm(hidden, 1e-6).to(device)
    norm.weight.data = (0.1 * torch.randn(hidden, device=device)).to(dtype)
    w = norm.weight.data
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(rmsnorm_ref(x, w, 1e-6, unit_offset=True), norm(x))
    got = rmsnorm(x, w, 1e-6, unit_offset=True)
    torch.testing.assert_close(got, norm(x), atol=atol, rtol=rtol)
    out, res = fused_add_rmsnorm(x, residual, w, 1e-6, unit_offset=True)
    exp_out, exp_res = norm(x, residual)
    torch.testing.assert_close(out, exp_out, atol=atol, rtol=rtol)
    torch.testing.assert_close(res, exp_res)
