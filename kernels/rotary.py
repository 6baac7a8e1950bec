"""Rotary position embedding, neox / rotate_half style (as HF Llama), applied in place.

For a head vector x of size D (rotary_dim == head_dim), with x1 = x[:D/2], x2 = x[D/2:] and
(cos, sin) = cos_sin_cache[position] split in halves:
    out1 = x1 * cos - x2 * sin,   out2 = x2 * cos + x1 * sin
which equals HF's `x * cat(cos, cos) + rotate_half(x) * cat(sin, sin)`.

Layouts:
    positions: [T] int32/int64
    q: [T, H, D], k: [T, kvH, D] fp32/bf16/fp16, last dim contiguous (views of a fused qkv are
       fine); both rotated in place.
    cos_sin_cache: [max_pos, D] fp32, row p = [cos(p * inv_freq), sin(p * inv_freq)], inv_freq
       of length D/2 (see `build_cos_sin_cache`).

# NOTE: the math is done in fp32 and rounded once to q's dtype. HF instead rounds cos/sin and each
# product to bf16/fp16 separately, so for half dtypes results differ from HF by ~1 ulp.
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


def build_cos_sin_cache(inv_freq: torch.Tensor, max_position: int) -> torch.Tensor:
    """[max_position, 2 * len(inv_freq)] fp32 cache from HF-style inverse frequencies."""
    t = torch.arange(max_position, dtype=torch.float32, device=inv_freq.device)
    freqs = torch.outer(t, inv_freq.float())
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)


def _rotate_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    xf = x.float()
    x1, x2 = xf[..., :half], xf[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def rotary_embedding_ref(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor
) -> None:
    """Reference: rotates q and k in place (fp32 math, one rounding)."""
    half = q.shape[-1] // 2
    cs = cos_sin_cache[positions.long()].float()  # [T, D]
    cos, sin = cs[:, None, :half], cs[:, None, half:]
    q.copy_(_rotate_ref(q, cos, sin))
    k.copy_(_rotate_ref(k, cos, sin))


@jit
def _rotate_heads(
    Row,
    stride_h,
    num_heads,
    cos,
    sin,
    HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    """Rotate heads 0..num_heads-1 of one token; Row points at its head 0, dim 0."""
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_HALF)
    base = Row + offs_h[:, None] * stride_h + offs_d[None, :]
    mask = (offs_h[:, None] < num_heads) & (offs_d[None, :] < HALF)
    x1 = tl.load(base, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(base + HALF, mask=mask, other=0.0).to(tl.float32)
    o1 = x1 * cos[None, :] - x2 * sin[None, :]
    o2 = x2 * cos[None, :] + x1 * sin[None, :]
    tl.store(base, o1.to(Row.dtype.element_ty), mask=mask)
    tl.store(base + HALF, o2.to(Row.dtype.element_ty), mask=mask)


@jit
def _rope_kernel(
    Pos,
    Q,
    K,
    Cache,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_c,
    num_q_heads,
    num_k_heads,
    HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    # One program rotates every q and k head of one token.
    t = tl.program_id(0).to(tl.int64)
    pdl_prologue(USE_PDL)
    pos = tl.load(Pos + t).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_HALF)
    mask_d = offs_d < HALF
    cos = tl.load(Cache + pos * stride_c + offs_d, mask=mask_d, other=0.0).to(tl.float32)
    sin = tl.load(Cache + pos * stride_c + HALF + offs_d, mask=mask_d, other=0.0).to(tl.float32)
    _rotate_heads(Q + t * stride_qt, stride_qh, num_q_heads, cos, sin, HALF, BLOCK_HALF, BLOCK_HQ)
    _rotate_heads(K + t * stride_kt, stride_kh, num_k_heads, cos, sin, HALF, BLOCK_HALF, BLOCK_HK)


def rotary_embedding(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor
) -> None:
    """Triton version of `rotary_embedding_ref`: rotates q [T, H, D] and k [T, kvH, D] in place."""
    require_triton()
    num_tokens, num_q_heads, head_dim = q.shape
    assert k.shape[0] == num_tokens and k.shape[2] == head_dim and positions.shape == (num_tokens,)
    assert head_dim % 2 == 0 and cos_sin_cache.shape[1] == head_dim, "rotary_dim must be head_dim"
    assert q.stride(2) == 1 and k.stride(2) == 1 and cos_sin_cache.stride(1) == 1
    if num_tokens == 0:
        return
    half = head_dim // 2
    _rope_kernel[(num_tokens,)](
        positions,
        q,
        k,
        cos_sin_cache,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        cos_sin_cache.stride(0),
        num_q_heads,
        k.shape[1],
        HALF=half,
        BLOCK_HALF=next_power_of_2(half),
        BLOCK_HQ=next_power_of_2(num_q_heads),
        BLOCK_HK=next_power_of_2(k.shape[1]),
        num_warps=4,
        **pdl_launch_args(q.device),
    )
