"""Gated MLP activations: `act(gate) * up` over the two halves of a gate_up projection, with
`act` SiLU (Llama, Qwen, Mistral, ...) or tanh-approximated GELU (Gemma's `gelu_pytorch_tanh`).

Rounding follows the torch expression `F.silu(gate) * up` (or `F.gelu(gate, approximate="tanh")
* up`) in the input dtype: the activation is computed in fp32 and rounded to the input dtype, then
the product is computed in fp32 and rounded again.

Layouts: x: [..., 2 * I] (gate then up along the last dim, last dim contiguous; leading dims
flattened to rows with one row stride); returns a new tensor [..., I] of x's dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from radixlm.kernels._triton import cdiv, jit, pdl_launch_args, pdl_prologue, require_triton, tl

ACTIVATIONS = ("silu", "gelu_tanh")  # the index is the kernels' ACT constant


def act_and_mul_ref(x: torch.Tensor, activation: str = "silu") -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    if activation == "gelu_tanh":
        return F.gelu(gate, approximate="tanh") * up
    assert activation == "silu", activation
    return F.silu(gate) * up


@jit
def gated_act(g, u, dtype: tl.constexpr, ACT: tl.constexpr):
    """`act(g) * u` with the torch rounding above (g, u: any float type; result in dtype);
    ACT indexes ACTIVATIONS."""
    gf = g.to(dtype).to(tl.float32)
    if (
        ACT == 1
    ):  # 0.5 x (1 + tanh(z)), z = sqrt(2 / pi) (x + 0.044715 x^3), tanh(z) = 1 - 2 / (exp(2z) + 1)
        z = 0.7978845608028654 * (gf + 0.044715 * gf * gf * gf)
        act = 0.5 * gf * (2.0 - 2.0 / (tl.exp(2.0 * z) + 1.0))
    else:
        act = gf / (1.0 + tl.exp(-gf))
    return (act.to(dtype).to(tl.float32) * u.to(dtype).to(tl.float32)).to(dtype)


@jit
def _act_and_mul_kernel(
    X, Out, inter, stride_x, stride_o, BLOCK: tl.constexpr, ACT: tl.constexpr, USE_PDL: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < inter
    pdl_prologue(USE_PDL)
    g = tl.load(X + row * stride_x + offs, mask=mask, other=0.0)
    u = tl.load(X + row * stride_x + inter + offs, mask=mask, other=0.0)
    tl.store(Out + row * stride_o + offs, gated_act(g, u, Out.dtype.element_ty, ACT), mask=mask)


def act_and_mul(x: torch.Tensor, activation: str = "silu", block: int = 1024) -> torch.Tensor:
    """Triton version of `act_and_mul_ref`."""
    require_triton()
    assert x.shape[-1] % 2 == 0 and x.stride(-1) == 1, "last dim must be even and contiguous"
    inter = x.shape[-1] // 2
    out = x.new_empty((*x.shape[:-1], inter))
    rows_in, rows_out = x.reshape(-1, 2 * inter), out.view(-1, inter)
    if rows_in.shape[0] == 0:
        return out
    _act_and_mul_kernel[(rows_in.shape[0], cdiv(inter, block))](
        rows_in,
        rows_out,
        inter,
        rows_in.stride(0),
        rows_out.stride(0),
        BLOCK=block,
        ACT=ACTIVATIONS.index(activation),
        num_warps=4,
        **pdl_launch_args(x.device),
    )
    return out
