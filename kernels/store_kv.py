"""Write new K/V rows into the paged KV pool (one layer).

Layouts:
    k_buffer, v_buffer: [num_slots, num_kv_heads, head_dim] (fp32/bf16/fp16, or float8_e4m3fn /
        float8_e5m2 for an FP8 KV cache), one dtype, owned by the KV pool; slot 0 is the padding
        slot and never holds real data.
    k, v: [T, num_kv_heads, head_dim] fp32/bf16/fp16 (the model dtype). The last dim must be
        contiguous; dims 0/1 may be strided (e.g. views into a fused qkv projection).
    loc: [T] int32/int64 slot indices (the batch's `out_cache_loc`); distinct except for padding
        lanes, which all point at slot 0.
    k_scale, v_scale: python floats, the buffers' dequantisation scales (FP8 buffers only; 1.0 for
        any other dtype).

Storing is a cast to the buffer dtype; into an FP8 buffer it quantises (`quantize_kv`):
    stored = fp8(clamp(x * (1 / scale), -finfo.max, finfo.max))   (rounded to nearest even)
and whoever reads the buffer dequantises (`dequantize_kv`): x ~= stored * scale.
# NOTE: x * (1 / scale), not x / scale: a GPU's fp32 division may round differently from torch's
# in the last bit (and then, at a tie, in the fp8 result); a multiply rounds the same everywhere,
# so kernel and reference agree bit for bit.

Both store functions write in place and return nothing.
"""

from __future__ import annotations

import torch

from radixlm.kernels._triton import (
    cdiv,
    fp8_flags,
    jit,
    next_power_of_2,
    pdl_launch_args,
    pdl_prologue,
    quantize_fp8,
    require_triton,
    tl,
)

FP8_KV_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype in FP8_KV_DTYPES


def check_kv_scales(dtype: torch.dtype, k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """Scales belong to FP8 buffers; a buffer of any other dtype stores values as they are."""
    if k_scale == 1.0 and v_scale == 1.0:
        return
    assert is_fp8(dtype), f"KV scales need an fp8 pool, not {dtype}"
    assert k_scale > 0.0 and v_scale > 0.0, "KV scales must be positive"


def quantize_kv(x: torch.Tensor, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    """`x` as stored in a KV buffer of `dtype`: a cast, or for FP8 the clamped, scaled cast above."""
    check_kv_scales(dtype, scale)
    if not is_fp8(dtype):
        return x.to(dtype)
    fp8_max = torch.finfo(dtype).max
    return (x.float() * (1.0 / scale)).clamp(-fp8_max, fp8_max).to(dtype)


def dequantize_kv(x: torch.Tensor, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    """Values read from a KV buffer, in compute `dtype`: `x.to(dtype) * scale`."""
    check_kv_scales(x.dtype, scale)
    y = x.to(dtype)
    return y if scale == 1.0 else y * scale


def store_kv_ref(
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    loc: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """Reference: `k_buffer[loc] = k; v_buffer[loc] = v` (cast to the buffer dtype; quantised with
    the scales when it is fp8)."""
    idx = loc.long()
    k_buffer[idx] = quantize_kv(k, k_buffer.dtype, k_scale)
    v_buffer[idx] = quantize_kv(v, v_buffer.dtype, v_scale)


@jit
def _store_kv_kernel(
    K,
    V,
    KBuf,
    VBuf,
    Loc,
    k_inv_scale,
    v_inv_scale,
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
    FP8_MAX: tl.constexpr,
    FP8_MANT: tl.constexpr,
    FP8_TINY: tl.constexpr,
    FP8_EMULATE: tl.constexpr,
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
    if FP8_MAX > 0:  # an FP8 pool: quantise (see the module docstring)
        k = quantize_fp8(k, k_inv_scale, FP8_MAX, FP8_MANT, FP8_TINY, FP8_EMULATE)
        v = quantize_fp8(v, v_inv_scale, FP8_MAX, FP8_MANT, FP8_TINY, FP8_EMULATE)
    tl.store(KBuf + slot * stride_kbs + h * stride_kbh + d, k.to(KBuf.dtype.element_ty), mask=mask)
    tl.store(VBuf + slot * stride_vbs + h * stride_vbh + d, v.to(VBuf.dtype.element_ty), mask=mask)


def store_kv(
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    loc: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """Triton version of `store_kv_ref` (same arguments, same in-place effect)."""
    require_triton()
    num_tokens, num_kv_heads, head_dim = k.shape
    assert v.shape == k.shape and loc.shape == (num_tokens,)
    assert k_buffer.shape[1:] == (num_kv_heads, head_dim) and v_buffer.shape == k_buffer.shape
    assert k.stride(2) == 1 and v.stride(2) == 1, "last dim of k/v must be contiguous"
    assert k_buffer.stride(2) == 1 and v_buffer.stride(2) == 1
    assert k_buffer.dtype == v_buffer.dtype
    check_kv_scales(k_buffer.dtype, k_scale, v_scale)
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
        1.0 / k_scale,
        1.0 / v_scale,
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
        **fp8_flags(k_buffer.dtype),
        num_warps=4 if block >= 512 else 1,
        **pdl_launch_args(k.device),
    )
