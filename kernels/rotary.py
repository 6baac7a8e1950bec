"""Rotary position embedding, neox / rotate_half style (as HF Llama), applied in place.

For a head vector x of size D whose first R = rotary_dim dims rotate (R == D, or R < D for
partial rotary embeddings such as Phi-4-mini's), with x1 = x[:R/2], x2 = x[R/2:R] and
(cos, sin) = cos_sin_cache[position] split in halves:
    out1 = x1 * cos - x2 * sin,   out2 = x2 * cos + x1 * sin,   out[R:] = x[R:]
which equals HF's `x_rot * cat(cos, cos) + rotate_half(x_rot) * cat(sin, sin)` (x_rot = x[:R]) with
x[R:] passed through.

Layouts:
    positions: [T] int32/int64
    q: [T, H, D], k: [T, kvH, D] fp32/bf16/fp16, last dim contiguous (views of a fused qkv are
       fine); both rotated in place.
    cos_sin_cache: [max_pos, R] fp32, row p = [cos(p * inv_freq), sin(p * inv_freq)], inv_freq
       of length R/2 (see `build_cos_sin_cache`); its width is the rotary_dim.

`rotary_store_kv` also writes the rotated k and v into the paged KV pool (store_kv.py's layouts and
dtypes, FP8 pools included) in the same kernel: one launch per layer instead of two. Into an FP8
pool it quantises k as the unfused path would: rotated, rounded to k's dtype, then quantised.

# NOTE: the math is done in fp32 and rounded once to q's dtype. HF instead rounds cos/sin and each
# product to bf16/fp16 separately, so for half dtypes results differ from HF by ~1 ulp.
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
from radixlm.kernels.store_kv import check_kv_scales


def build_cos_sin_cache(inv_freq: torch.Tensor, max_position: int) -> torch.Tensor:
    """[max_position, 2 * len(inv_freq)] fp32 cache from HF-style inverse frequencies."""
    t = torch.arange(max_position, dtype=torch.float32, device=inv_freq.device)
    freqs = torch.outer(t, inv_freq.float())
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)


def _rotate_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = cos.shape[-1]
    xf = x.float()
    x1, x2, rest = xf[..., :half], xf[..., half : 2 * half], xf[..., 2 * half :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1).to(x.dtype)


def rotary_embedding_ref(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor
) -> None:
    """Reference: rotates q and k in place (fp32 math, one rounding); dims past the cache's
    width (the rotary_dim) pass through."""
    half = cos_sin_cache.shape[-1] // 2
    cs = cos_sin_cache[positions.long()].float()  # [T, D]
    cos, sin = cs[:, None, :half], cs[:, None, half:]
    q.copy_(_rotate_ref(q, cos, sin))
    k.copy_(_rotate_ref(k, cos, sin))


@jit
def _rotated_heads(
    Row,
    stride_h,
    num_heads,
    cos,
    sin,
    HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    """(out1, out2, mask): heads 0..num_heads-1 of one token rotated (fp32 halves, mask of the
    [BLOCK_H, BLOCK_HALF] tile); Row points at its head 0, dim 0."""
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_HALF)
    base = Row + offs_h[:, None] * stride_h + offs_d[None, :]
    mask = (offs_h[:, None] < num_heads) & (offs_d[None, :] < HALF)
    x1 = tl.load(base, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(base + HALF, mask=mask, other=0.0).to(tl.float32)
    return x1 * cos[None, :] - x2 * sin[None, :], x2 * cos[None, :] + x1 * sin[None, :], mask


@jit
def _store_heads(
    Row,
    stride_h,
    out1,
    out2,
    mask,
    HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    """Store `_rotated_heads`' halves at Row (head 0, dim 0 of one token), rounded to its dtype."""
    offs = tl.arange(0, BLOCK_H)[:, None] * stride_h + tl.arange(0, BLOCK_HALF)[None, :]
    tl.store(Row + offs, out1.to(Row.dtype.element_ty), mask=mask)
    tl.store(Row + offs + HALF, out2.to(Row.dtype.element_ty), mask=mask)


@jit
def _cos_sin(Cache, pos, stride_c, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr):
    offs_d = tl.arange(0, BLOCK_HALF)
    mask_d = offs_d < HALF
    row = Cache + pos * stride_c + offs_d
    cos = tl.load(row, mask=mask_d, other=0.0).to(tl.float32)
    return cos, tl.load(row + HALF, mask=mask_d, other=0.0).to(tl.float32)


@jit(do_not_specialize=("Pos", "Loc"))  # NOTE: rows of packed inputs: alignment follows the batch
def _rope_kernel(
    Pos,
    Q,
    K,
    V,
    Cache,
    KBuf,
    VBuf,
    Loc,
    k_inv_scale,
    v_inv_scale,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_c,
    stride_kbs,
    stride_kbh,
    stride_vbs,
    stride_vbh,
    num_q_heads,
    num_k_heads,
    HEAD_DIM: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_PASS: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
    STORE_KV: tl.constexpr,
    FP8_MAX: tl.constexpr,
    FP8_MANT: tl.constexpr,
    FP8_TINY: tl.constexpr,
    FP8_EMULATE: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    # One program per token: q and k rotated in place (their first 2 * HALF dims; the others pass
    # through); with STORE_KV the rotated k and v are also written into the pool at the token's
    # slot (V, KBuf, VBuf, Loc unused otherwise).
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(Pos + t).to(tl.int64)
    if STORE_KV:
        slot = tl.load(Loc + t).to(tl.int64)
    cos, sin = _cos_sin(Cache, pos, stride_c, HALF, BLOCK_HALF)
    pdl_prologue(USE_PDL)  # positions, slots and the table are not written by the previous kernel
    q1, q2, mask_q = _rotated_heads(
        Q + t * stride_qt, stride_qh, num_q_heads, cos, sin, HALF, BLOCK_HALF, BLOCK_HQ
    )
    _store_heads(Q + t * stride_qt, stride_qh, q1, q2, mask_q, HALF, BLOCK_HALF, BLOCK_HQ)
    k1, k2, mask_k = _rotated_heads(
        K + t * stride_kt, stride_kh, num_k_heads, cos, sin, HALF, BLOCK_HALF, BLOCK_HK
    )
    _store_heads(K + t * stride_kt, stride_kh, k1, k2, mask_k, HALF, BLOCK_HALF, BLOCK_HK)
    if STORE_KV:
        kb_row = KBuf + slot * stride_kbs
        if FP8_MAX > 0:  # an FP8 pool: quantise k as stored above (rounded to K's dtype)
            kq1 = quantize_fp8(
                k1.to(K.dtype.element_ty), k_inv_scale, FP8_MAX, FP8_MANT, FP8_TINY, FP8_EMULATE
            )
            kq2 = quantize_fp8(
                k2.to(K.dtype.element_ty), k_inv_scale, FP8_MAX, FP8_MANT, FP8_TINY, FP8_EMULATE
            )
            _store_heads(kb_row, stride_kbh, kq1, kq2, mask_k, HALF, BLOCK_HALF, BLOCK_HK)
        else:
            _store_heads(kb_row, stride_kbh, k1, k2, mask_k, HALF, BLOCK_HALF, BLOCK_HK)
        offs_h = tl.arange(0, BLOCK_HK)
        if 2 * HALF < HEAD_DIM:  # partial rotary: k's unrotated dims go to the pool as they are
            offs_p = 2 * HALF + tl.arange(0, BLOCK_PASS)
            mask_p = (offs_h[:, None] < num_k_heads) & (offs_p[None, :] < HEAD_DIM)
            k_pass = K + t * stride_kt + offs_h[:, None] * stride_kh + offs_p[None, :]
            kp = tl.load(k_pass, mask=mask_p)
            if FP8_MAX > 0:
                kp = quantize_fp8(kp, k_inv_scale, FP8_MAX, FP8_MANT, FP8_TINY, FP8_EMULATE)
            kp_dst = kb_row + offs_h[:, None] * stride_kbh + offs_p[None, :]
            tl.store(kp_dst, kp.to(KBuf.dtype.element_ty), mask=mask_p)
        offs_d = tl.arange(0, BLOCK_D)
        mask_v = (offs_h[:, None] < num_k_heads) & (offs_d[None, :] < HEAD_DIM)
        v = tl.load(V + t * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :], mask=mask_v)
        if FP8_MAX > 0:
            v = quantize_fp8(v, v_inv_scale, FP8_MAX, FP8_MANT, FP8_TINY, FP8_EMULATE)
        v_dst = VBuf + slot * stride_vbs + offs_h[:, None] * stride_vbh + offs_d[None, :]
        tl.store(v_dst, v.to(VBuf.dtype.element_ty), mask=mask_v)


def _check(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cache: torch.Tensor) -> None:
    num_tokens, _, head_dim = q.shape
    assert k.shape[0] == num_tokens and k.shape[2] == head_dim and positions.shape == (num_tokens,)
    rotary_dim = cache.shape[1]
    assert rotary_dim % 2 == 0 and 0 < rotary_dim <= head_dim, "rotary_dim: even, <= head_dim"
    assert q.stride(2) == 1 and k.stride(2) == 1 and cache.stride(1) == 1


def _launch(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cache: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    loc: torch.Tensor,
    store_kv: bool,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    half, head_dim = cache.shape[1] // 2, q.shape[2]
    _rope_kernel[(q.shape[0],)](
        *(positions, q, k, v, cache, k_buffer, v_buffer, loc),
        1.0 / k_scale,
        1.0 / v_scale,
        *q.stride()[:2],
        *k.stride()[:2],
        *v.stride()[:2],
        cache.stride(0),
        *k_buffer.stride()[:2],
        *v_buffer.stride()[:2],
        q.shape[1],
        k.shape[1],
        HEAD_DIM=head_dim,
        HALF=half,
        BLOCK_HALF=next_power_of_2(half),
        BLOCK_D=next_power_of_2(head_dim),
        BLOCK_PASS=next_power_of_2(max(head_dim - 2 * half, 1)),
        BLOCK_HQ=next_power_of_2(q.shape[1]),
        BLOCK_HK=next_power_of_2(k.shape[1]),
        STORE_KV=store_kv,
        **fp8_flags(k_buffer.dtype if store_kv else q.dtype),
        num_warps=4,
        **pdl_launch_args(q.device),
    )


def rotary_embedding(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor
) -> None:
    """Triton version of `rotary_embedding_ref`: rotates q [T, H, D] and k [T, kvH, D] in place."""
    require_triton()
    _check(positions, q, k, cos_sin_cache)
    if q.shape[0] == 0:
        return
    # NOTE: without the store, k stands in for the unused V / pool arguments, positions for loc.
    _launch(positions, q, k, k, cos_sin_cache, k, k, positions, store_kv=False)


def rotary_store_kv(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    loc: torch.Tensor,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """`rotary_embedding` and `store_kv.store_kv(k_buffer, v_buffer, loc, k, v, k_scale, v_scale)`
    in one kernel: q and k are rotated in place and the rotated k and v are written at the slots
    `loc` (layouts of store_kv.py)."""
    require_triton()
    _check(positions, q, k, cos_sin_cache)
    assert v.shape == k.shape and v.stride(2) == 1 and loc.shape == (q.shape[0],)
    assert k_buffer.shape[1:] == k.shape[1:] and v_buffer.shape == k_buffer.shape
    assert k_buffer.stride(2) == 1 and v_buffer.stride(2) == 1
    assert k_buffer.dtype == v_buffer.dtype
    check_kv_scales(k_buffer.dtype, k_scale, v_scale)
    if q.shape[0] == 0:
        return
    _launch(positions, q, k, v, cos_sin_cache, k_buffer, v_buffer, loc, True, k_scale, v_scale)
