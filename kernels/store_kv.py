"""Write new K/V rows into the paged KV pool (one layer).

Layouts:
    k_buffer, v_buffer: [num_slots, num_kv_heads, head_dim] (fp32/bf16/fp16), owned by the KV pool;
        slot 0 is the padding slot and never holds real data.
    k, v: [T, num_kv_heads, head_dim], same dtype as the buffers or castable to it. The last dim must
        be contiguous; dims 0/1 may be strided (e.g. views into a fused qkv projection).
    loc: [T] int32/int64 slot indices (the batch's `out_cache_loc`); distinct except for padding
        lanes, which all point at slot 0.

Both functions write in place and return nothing.
"""

from __future__ import annotations

import torch

from radixlm.kernels._triton import (
    cdiv,
    jit,
    next_power_of_2,
    pdl_launch_args,
    pdl_prologue,
    require_triton,
    tl,
)


def store_kv_ref(
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    loc: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> None:
    """Reference: `k_buffer[loc] = k; v_buffer[loc] = v` (cast to the buffer dtype)."""
    idx = loc.long()
    k_buffer[idx] = k.to(k_buffer.dtype)
    v_buffer[idx] = v.to(v_buffer.dtype)


@jit
def _store_kv_kernel(
    K,
    V,
    KBuf,
    VBuf,
    Loc,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_kbs,
    stride_kbh,
    stride_vbs,
    stride_vbh,
    ROW: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    # One program copies BLOCK elements of the flattened (kv_head, dim) row of one token.
    t = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    pdl_prologue(USE_PDL)
    mask = offs < ROW
    h = offs // HEAD_DIM
    d = offs % HEAD_DIM
    slot = tl.load(Loc + t).to(tl.int64)
    t64 = t.to(tl.int64)
    k = tl.load(K + t64 * stride_kt + h * stride_kh + d, mask=mask)
    v = tl.load(V + t64 * stride_vt + h * stride_vh + d, mask=mask)
    tl.store(KBuf + slot * stride_kbs + h * stride_kbh + d, k.to(KBuf.dtype.element_ty), mask=mask)
    tl.store(VBuf + slot * stride_vbs + h * stride_vbh + d, v.to(VBuf.dtype.element_ty), mask=mask)


def store_kv(
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    loc: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> None:
    """Triton version of `store_kv_ref` (same arguments, same in-place effect)."""
    require_triton()
    num_tokens, num_kv_heads, head_dim = k.shape
    assert v.shape == k.shape and loc.shape == (num_tokens,)
    assert k_buffer.shape[1:] == (num_kv_heads, head_dim) and v_buffer.shape == k_buffer.shape
    assert k.stride(2) == 1 and v.stride(2) == 1, "last dim of k/v must be contiguous"
    assert k_buffer.stride(2) == 1 and v_buffer.stride(2) == 1
    if num_tokens == 0:
        return
    row = num_kv_heads * head_dim
    block = min(next_power_of_2(row), 2048)
    grid = (num_tokens, cdiv(row, block))
    _store_kv_kernel[grid](
        k,
        v,
        k_buffer,
        v_buffer,
        loc,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        k_buffer.stride(0),
        k_buffer.stride(1),
        v_buffer.stride(0),
        v_buffer.stride(1),
        ROW=row,
        HEAD_DIM=head_dim,
        BLOCK=block,
        num_warps=4 if block >= 512 else 1,
        **pdl_launch_args(k.device),
    )
