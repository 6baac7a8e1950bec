"""Rotary embedding of an extend's q and k in place on CPU (`rotary.cpp`), fp32 only.

`rotary_inplace(positions, q, k, cos, sin, head_dim)` rotates q `[T, H * head_dim]` and k
`[T, KVH * head_dim]` (rows may be views of a fused qkv: last dim contiguous) with the tables
`cos` / `sin` `[max_pos, rotary_dim / 2]` fp32, as `runtime/models/rotary.py`'s torch path does and
with the same operations (so the same bits as the one-call decode step, which shares rotary.h).
Returns False where the kernel cannot run (library missing, another dtype or layout): the caller
keeps torch's ops.
"""

from __future__ import annotations

import torch

from radixlm.kernels.cpu.linear import _lib


def rotary_inplace(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    head_dim: int,
) -> bool:
    lib = _lib()
    if lib is None or q.dim() != 2 or k.dim() != 2 or q.shape[0] != k.shape[0]:
        return False
    if q.dtype != torch.float32 or k.dtype != torch.float32 or cos.dtype != torch.float32:
        return False
    if q.stride(1) != 1 or k.stride(1) != 1 or not (cos.is_contiguous() and sin.is_contiguous()):
        return False
    pos = positions.to(torch.int64).contiguous()
    rc = lib.rl_rotary(
        q.data_ptr(), q.stride(0), q.shape[1] // head_dim, k.data_ptr(), k.stride(0),
        k.shape[1] // head_dim, head_dim, cos.shape[1], pos.data_ptr(), q.shape[0],
        cos.data_ptr(), sin.data_ptr(),
    )  # fmt: skip
    return rc == 0
