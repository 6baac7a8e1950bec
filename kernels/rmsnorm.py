"""RMSNorm and fused residual-add + RMSNorm with Hugging Face Llama semantics.

HF `LlamaRMSNorm`: h = x.float(); h = h * rsqrt(mean(h^2, -1) + eps); return weight * h.to(x.dtype).
The fused version first forms `residual = x + residual` in the input dtype, then normalises it.
`unit_offset=True`: Gemma's RMSNorm, `(h * (1 + weight.float())).to(x.dtype)` with h kept in fp32.

Layouts: x, residual: [..., hidden] (last dim contiguous; leading dims flattened to rows, which
must be expressible as one row stride); weight: [hidden]. Outputs are new tensors of x's dtype
(torch's promotion of weight.dtype and x.dtype, as in HF), unless `inplace=True` for the fused op:
then x receives the normed output and residual the sum (SGLang's in-place convention).
"""

from __future__ import annotations

import torch

from radixlm.kernels._triton import (
    jit,
    next_power_of_2,
    pdl_launch_args,
    pdl_prologue,
    require_triton,
    tl,
)


def rmsnorm_ref(
    x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, unit_offset: bool = False
) -> torch.Tensor:
    """Reference, exactly HF's LlamaRMSNorm.forward (`unit_offset`: Gemma's RMSNorm)."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if unit_offset:
        return (h * (1.0 + weight.float())).to(x.dtype)
    return weight * h.to(x.dtype)


def fused_add_rmsnorm_ref(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    unit_offset: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference: (rmsnorm(x + residual), x + residual), the sum taken in the input dtype."""
    new_residual = x + residual
    return rmsnorm_ref(new_residual, weight, eps, unit_offset), new_residual


@jit
def _rmsnorm_kernel(
    X,
    Res,
    W,
    Out,
    ResOut,
    hidden,
    eps,
    stride_x,
    stride_r,
    stride_o,
    stride_ro,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
    USE_PDL: tl.constexpr,
    UNIT_OFFSET: tl.constexpr = False,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < hidden
    w = tl.load(W + offs, mask=mask, other=0.0).to(tl.float32)  # NOTE: constant: before the wait
    pdl_prologue(USE_PDL)
    x = tl.load(X + row * stride_x + offs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(Res + row * stride_r + offs, mask=mask, other=0.0)
        # NOTE: the sum is rounded to the input dtype before the norm, as HF does.
        x = (x.to(tl.float32) + r.to(tl.float32)).to(X.dtype.element_ty)
        tl.store(ResOut + row * stride_ro + offs, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, 0) / hidden + eps)
    if UNIT_OFFSET:  # Gemma: fp32 throughout, times (1 + w)
        o = xf * rstd * (1.0 + w)
    else:  # HF rounds the normed activations to the input dtype, then multiplies by the weight.
        o = (xf * rstd).to(X.dtype.element_ty).to(tl.float32) * w
    tl.store(Out + row * stride_o + offs, o.to(Out.dtype.element_ty), mask=mask)


def _rows(t: torch.Tensor) -> torch.Tensor:
    assert t.stride(-1) == 1, "last dim must be contiguous"
    return t.view(-1, t.shape[-1]) if t.dim() != 2 else t


def _launch(x, res, weight, out, res_out, eps: float, unit_offset: bool = False) -> None:
    rows, hidden = x.shape
    if rows == 0:
        return
    block = next_power_of_2(hidden)
    num_warps = min(16, max(1, block // 512))
    has_res = res is not None
    _rmsnorm_kernel[(rows,)](
        x,
        res if has_res else x,
        weight,
        out,
        res_out if has_res else out,
        hidden,
        eps,
        x.stride(0),
        res.stride(0) if has_res else 0,
        out.stride(0),
        res_out.stride(0) if has_res else 0,
        HAS_RESIDUAL=has_res,
        BLOCK=block,
        UNIT_OFFSET=unit_offset,
        num_warps=num_warps,
        **pdl_launch_args(x.device),
    )


def rmsnorm(
    x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, unit_offset: bool = False
) -> torch.Tensor:
    """Triton version of `rmsnorm_ref`. Returns a new tensor shaped like x."""
    require_triton()
    assert weight.shape == (x.shape[-1],) and weight.is_contiguous()
    out_dtype = x.dtype if unit_offset else torch.promote_types(weight.dtype, x.dtype)
    out = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    _launch(_rows(x), None, weight, _rows(out), None, eps, unit_offset)
    return out


def fused_add_rmsnorm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    inplace: bool = False,
    unit_offset: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton version of `fused_add_rmsnorm_ref`: returns (normed, new_residual).

    inplace=True writes normed into x and the sum into residual and returns (x, residual);
    it needs weight.dtype == x.dtype (no promotion possible in place).
    """
    require_triton()
    assert residual.shape == x.shape and residual.dtype == x.dtype
    assert weight.shape == (x.shape[-1],) and weight.is_contiguous()
    if inplace:
        assert weight.dtype == x.dtype, "in place needs weight.dtype == x.dtype"
        out, res_out = x, residual
    else:
        out_dtype = x.dtype if unit_offset else torch.promote_types(weight.dtype, x.dtype)
        out = torch.empty(x.shape, dtype=out_dtype, device=x.device)
        res_out = torch.empty_like(x)
    # NOTE: in place is safe: each program reads its whole row before writing it.
    _launch(_rows(x), _rows(residual), weight, _rows(out), _rows(res_out), eps, unit_offset)
    return out, res_out
