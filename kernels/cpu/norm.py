"""RMSNorm (optionally fused with the residual add before it) on CPU (`norm.cpp`), fp32 only.

`rmsnorm(x, residual, weight, eps)` returns `out` (no residual) or `(out, x + residual)`, as
`runtime/models/llama.py`'s RMSNorm does, or None where the kernel cannot run (library missing,
not fp32, a width that is not a multiple of the SIMD width) so that the caller keeps torch's ops.
"""

from __future__ import annotations

import torch

from radixlm.kernels.cpu.linear import _lib


def rmsnorm(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None:
    lib = _lib()
    if lib is None or x.dtype != torch.float32 or weight.dtype != torch.float32:
        return None
    if residual is not None and residual.dtype != torch.float32:
        return None
    d = x.shape[-1]
    x2 = x.reshape(-1, d).contiguous()
    r2 = None if residual is None else residual.reshape(-1, d).contiguous()
    out = torch.empty_like(x2)
    res_out = None if r2 is None else torch.empty_like(x2)
    rc = lib.rl_rmsnorm(
        x2.data_ptr(), 0 if r2 is None else r2.data_ptr(), weight.contiguous().data_ptr(), eps,
        x2.shape[0], d, out.data_ptr(), 0 if res_out is None else res_out.data_ptr(),
    )  # fmt: skip
    if rc != 0:
        return None
    if res_out is None:
        return out.view(x.shape)
    return out.view(x.shape), res_out.view(x.shape)


def rmsnorm_ref(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    if residual is not None:
        x = x + residual
        residual = x
    h = x.float()
    out = weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return out if residual is None else (out, residual)
