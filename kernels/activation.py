"""Llama's MLP activation: `silu(gate) * up` over the two halves of a gate_up projection.

Rounding follows the torch expression `F.silu(gate) * up` in the input dtype: silu is computed in
fp32 and rounded to the input dtype, then the product is computed in fp32 and rounded again.

Layouts: x: [..., 2 * I] (gate then up along the last dim, last dim contiguous; leading dims
flattened to rows with one row stride); returns a new tensor [..., I] of x's dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from radixlm.kernels._triton import cdiv, jit, pdl_launch_args, pdl_prologue, require_triton, tl


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


@jit
def silu_gate(g, u, dtype: tl.constexpr):
    """`silu(g) * u` with the torch rounding above (g, u: any float type; result in dtype)."""
    gf = g.to(dtype).to(tl.float32)
    act = (gf / (1.0 + tl.exp(-gf))).to(dtype)
    return (act.to(tl.float32) * u.to(dtype).to(tl.float32)).to(dtype)


@jit
def _silu_and_mul_kernel(
    X, Out, inter, stride_x, stride_o, BLOCK: tl.constexpr, USE_PDL: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < inter
    pdl_prologue(USE_PDL)
    g = tl.load(X + row * stride_x + offs, mask=mask, other=0.0)
    u = tl.load(X + row * stride_x + inter + offs, mask=mask, other=0.0)
    tl.store(Out + row * stride_o + offs, silu_gate(g, u, Out.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor, block: int = 1024) -> torch.Tensor:
    """Triton version of `silu_and_mul_ref`."""
    require_triton()
    assert x.shape[-1] % 2 == 0 and x.stride(-1) == 1, "last dim must be even and contiguous"
    inter = x.shape[-1] // 2
    out = x.new_empty((*x.shape[:-1], inter))
    rows_in, rows_out = x.reshape(-1, 2 * inter), out.view(-1, inter)
    if rows_in.shape[0] == 0:
        return out
    _silu_and_mul_kernel[(rows_in.shape[0], cdiv(inter, block))](
        rows_in,
        rows_out,
        inter,
        rows_in.stride(0),
        rows_out.stride(0),
        BLOCK=block,
        num_warps=4,
        **pdl_launch_args(x.device),
    )
    return out
