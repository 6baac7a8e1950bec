"""Dynamic per-token FP8 quantisation of activations: the input side of an FP8 GEMM.

For each row x of X: scale = max(max|x| / FP8_MAX, MIN_SCALE) (fp32) and
q = clamp(x * (1 / scale), -FP8_MAX, FP8_MAX) cast to float8_e4m3fn, so that x ~= q * scale.

Layouts:
    x:     [M, K] fp32/bf16/fp16, last dim contiguous (any row stride)
    q:     [M, K] float8_e4m3fn, contiguous (returned)
    scale: [M, 1] fp32 (returned; the `scale_a` of `torch._scaled_mm`'s row-wise scaling)

# NOTE: the kernel computes 1 / scale in fp32 like the reference, but a GPU's fp32 division may
# round differently in the last bit, so an element may differ from the reference by one fp8 ulp.
"""

from __future__ import annotations

import torch

from radixlm.kernels._triton import (
    fp8_flags,
    jit,
    next_power_of_2,
    pdl_launch_args,
    pdl_prologue,
    quantize_fp8,
    require_triton,
    tl,
)

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448
MIN_SCALE = 1.0 / (FP8_MAX * 512.0)  # an all-zero row still gets a finite, positive scale
_MAX_BLOCK = 4096


def per_token_quant_fp8_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference: (q [M, K] float8_e4m3fn, scale [M, 1] fp32)."""
    xf = x.float()
    scale = (xf.abs().amax(dim=-1, keepdim=True) / FP8_MAX).clamp(min=MIN_SCALE)
    q = (xf * (1.0 / scale)).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q, scale


@jit
def _per_token_quant_kernel(
    X,
    Q,
    Scale,
    K,
    stride_x,
    min_scale,
    BLOCK: tl.constexpr,
    FP8_MAX: tl.constexpr,
    FP8_MANT: tl.constexpr,
    FP8_TINY: tl.constexpr,
    FP8_EMULATE: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    # One program per row: a first pass finds max|x|, a second (re-reading the row from cache)
    # writes the quantised values.
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    pdl_prologue(USE_PDL)
    amax = tl.zeros([BLOCK], dtype=tl.float32)
    for k0 in range(0, K, BLOCK):
        mask = k0 + offs < K
        x = tl.load(X + row * stride_x + k0 + offs, mask=mask, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(x))
    scale = tl.maximum(tl.max(amax, 0) / FP8_MAX, min_scale)
    inv_scale = 1.0 / scale
    for k0 in range(0, K, BLOCK):
        mask = k0 + offs < K
        x = tl.load(X + row * stride_x + k0 + offs, mask=mask, other=0.0).to(tl.float32)
        q = quantize_fp8(x, inv_scale, FP8_MAX, FP8_MANT, FP8_TINY, FP8_EMULATE)
        tl.store(Q + row * K + k0 + offs, q.to(Q.dtype.element_ty), mask=mask)
    tl.store(Scale + row, scale)


def per_token_quant_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton version of `per_token_quant_fp8_ref` (same results up to the NOTE above)."""
    require_triton()
    assert x.dim() == 2 and x.stride(1) == 1, "x must be [M, K] with a contiguous last dim"
    m, k = x.shape
    q = torch.empty((m, k), dtype=FP8_DTYPE, device=x.device)
    scale = torch.empty((m, 1), dtype=torch.float32, device=x.device)
    if m == 0:
        return q, scale
    block = min(next_power_of_2(k), _MAX_BLOCK)
    _per_token_quant_kernel[(m,)](
        x,
        q,
        scale,
        k,
        x.stride(0),
        MIN_SCALE,
        BLOCK=block,
        **fp8_flags(FP8_DTYPE),
        num_warps=8 if block >= 2048 else 4,
        **pdl_launch_args(x.device),
    )
    return q, scale
