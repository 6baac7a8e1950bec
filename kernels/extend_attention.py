"""Extend (prefill with a cached prefix) attention over the paged KV pool.

Each request b of the batch has `extend_prefix_lens[b]` tokens already in the pool (read through
`req_to_token[req_pool_indices[b], 0:prefix_len]`) and `extend_seq_lens[b] >= 1` new tokens whose
queries, keys and values are rows `extend_start_loc[b] : extend_start_loc[b] + extend_seq_lens[b]`
of the flattened token dim. New token i (0-based inside the extend part) attends to the whole prefix
and to new tokens 0..i (causal).

Layouts (all owned by the caller; only `out` is written):
    q:         [num_tokens, num_heads, head_dim]     fp32/bf16/fp16
    k_extend:  [num_tokens, num_kv_heads, head_dim]  same dtype as q (the new K, contiguous in tokens)
    v_extend:  [num_tokens, num_kv_heads, head_dim]
    k_buffer, v_buffer: [num_slots, num_kv_heads, head_dim] the KV pool of this layer: q's dtype, or
               float8_e4m3fn / float8_e5m2 (an FP8 KV cache), the cached prefix then read as
               `fp8.to(q.dtype) * scale` with the pool's python-float `k_scale` / `v_scale`
    req_to_token: [max_running_requests, max_context_len] int32
    req_pool_indices, extend_prefix_lens, extend_seq_lens, extend_start_loc: [B] int32/int64
    out:       [num_tokens, num_heads, head_dim] dtype of q
GQA: query head h reads kv head h // (num_heads // num_kv_heads). Scores use `sm_scale`
(default 1/sqrt(head_dim)); softmax and accumulation are fp32.

# NOTE: the kernel reads the new K/V from k_extend/v_extend, never from the pool, so it does not
# matter whether the caller stored them into the pool before or after this call. With an FP8 pool
# the new tokens therefore attend to each other unquantised, and only the cached prefix is
# dequantised (k_scale folded into the prefix's score scale, v_scale into its P @ V product).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from radixlm.kernels._triton import (
    cdiv,
    dot_flags,
    interpreting,
    jit,
    launch_with_fallback,
    mma,
    next_power_of_2,
    online_softmax,
    require_triton,
    soft_cap,
    tl,
)
from radixlm.kernels.store_kv import check_kv_scales, dequantize_kv, is_fp8

_LOG2E = 1.4426950408889634


def extend_attention_ref(
    q: torch.Tensor,
    k_extend: torch.Tensor,
    v_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    extend_prefix_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    sm_scale: float | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Pure-torch reference: one request at a time, dense fp32 softmax with an explicit mask; the
    prefix dequantised from the pool, the new tokens from k_extend/v_extend. `window`: keys at
    positions > q - window only; `softcap`: scores -> softcap * tanh(scores / softcap)."""
    num_heads, head_dim = q.shape[1], q.shape[2]
    group = num_heads // k_buffer.shape[1]
    scale = 1.0 / math.sqrt(head_dim) if sm_scale is None else sm_scale
    out = torch.empty_like(q)
    for b in range(req_pool_indices.shape[0]):
        req = int(req_pool_indices[b])
        prefix, ext, start = (
            int(extend_prefix_lens[b]),
            int(extend_seq_lens[b]),
            int(extend_start_loc[b]),
        )
        lo = 0 if window is None else max(0, prefix - window + 1)  # older keys are unseen
        slots = req_to_token[req, lo:prefix].long()
        k_prefix = dequantize_kv(k_buffer[slots], torch.float32, k_scale)
        v_prefix = dequantize_kv(v_buffer[slots], torch.float32, v_scale)
        k = torch.cat([k_prefix, k_extend[start : start + ext].float()])  # [S, kvH, D]
        v = torch.cat([v_prefix, v_extend[start : start + ext].float()])
        k = k.repeat_interleave(group, dim=1)  # [S, H, D]
        v = v.repeat_interleave(group, dim=1)
        qb = q[start : start + ext].float()  # [E, H, D]
        scores = torch.einsum("ehd,shd->hes", qb, k) * scale
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        q_pos = prefix + torch.arange(ext, device=q.device)
        k_pos = torch.arange(lo, prefix + ext, device=q.device)
        allowed = k_pos[None, :] <= q_pos[:, None]  # [E, S]
        if window is not None:
            allowed &= k_pos[None, :] > q_pos[:, None] - window
        scores = scores.masked_fill(~allowed[None], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[start : start + ext] = torch.einsum("hes,shd->ehd", probs, v).to(q.dtype)
    return out


@jit
def _extend_attention_kernel(
    Q,
    KExt,
    VExt,
    KBuf,
    VBuf,
    Out,
    ReqToToken,
    ReqPoolIdx,
    PrefixLens,
    ExtendLens,
    StartLoc,
    qk_scale,
    qk_scale_prefix,
    v_scale,
    softcap,
    stride_qt,
    stride_qh,
    stride_ket,
    stride_keh,
    stride_vet,
    stride_veh,
    stride_kbs,
    stride_kbh,
    stride_vbs,
    stride_vbh,
    stride_ot,
    stride_oh,
    stride_r2t,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_NP: tl.constexpr,
    PREC: tl.constexpr,
    UPCAST: tl.constexpr,
    V_SCALED: tl.constexpr,
    WINDOW: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    # NOTE: heaviest (last) query blocks first: blocks launch in grid order, so the long causal
    # blocks do not end up as a tail.
    pid_m = tl.num_programs(2) - 1 - tl.program_id(2)
    kv_h = h // GROUP
    ext_len = tl.load(ExtendLens + b).to(tl.int32)
    m0 = pid_m * BLOCK_M
    # NOTE: the grid is sized for the longest request; blocks past this request's end do nothing.
    if m0 < ext_len:
        prefix_len = tl.load(PrefixLens + b).to(tl.int32)
        start = tl.load(StartLoc + b).to(tl.int64)
        req = tl.load(ReqPoolIdx + b).to(tl.int64)
        offs_m = m0 + tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_np = tl.arange(0, BLOCK_NP)
        offs_d = tl.arange(0, BLOCK_D)
        mask_m = offs_m < ext_len
        mask_d = offs_d < HEAD_DIM
        q_ptrs = Q + (start + offs_m)[:, None] * stride_qt + h * stride_qh + offs_d[None, :]
        q = tl.load(q_ptrs, mask=mask_m[:, None] & mask_d[None, :], other=0.0)

        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

        # Stage 1: the cached prefix, gathered from the pool through req_to_token (its own tile
        # width BLOCK_NP: long prefixes are gather-bound and like wider tiles).
        r2t_row = ReqToToken + req * stride_r2t
        # NOTE (window): the prefix loop starts at the first key this block's first query sees;
        # older slots are never read.
        p_lo = 0
        if WINDOW > 0:
            p_lo = tl.maximum(prefix_len + m0 - WINDOW + 1, 0)
        for n0 in range(p_lo, prefix_len, BLOCK_NP):
            cols = n0 + offs_np
            mask_n = cols < prefix_len
            slots = tl.load(r2t_row + cols, mask=mask_n, other=0).to(tl.int64)
            k = tl.load(
                KBuf + slots[None, :] * stride_kbs + kv_h * stride_kbh + offs_d[:, None],
                mask=mask_n[None, :] & mask_d[:, None],
                other=0.0,
            ).to(Q.dtype.element_ty)  # NOTE: a no-op unless the pool is fp8
            qk = mma(q, k, PREC, UPCAST) * qk_scale_prefix
            if SOFTCAP:
                qk = soft_cap(qk, softcap) * 1.4426950408889634
            if WINDOW > 0:
                seen = cols[None, :] > prefix_len + offs_m[:, None] - WINDOW
                qk = tl.where(seen, qk, -1.0e30)  # NOTE: see _triton.WINDOW_MASKED
            qk = tl.where(mask_n[None, :], qk, float("-inf"))
            p, alpha, m_i, l_i = online_softmax(qk, m_i, l_i)
            v = tl.load(
                VBuf + slots[:, None] * stride_vbs + kv_h * stride_vbh + offs_d[None, :],
                mask=mask_n[:, None] & mask_d[None, :],
                other=0.0,
            ).to(Q.dtype.element_ty)
            pv = mma(p.to(v.dtype), v, PREC, UPCAST)
            if V_SCALED:  # an FP8 pool with v_scale != 1
                pv = pv * v_scale
            acc = acc * alpha[:, None] + pv

        # Stage 2a: new tokens strictly before this query block; no mask needed.
        # NOTE: relies on BLOCK_M % BLOCK_N == 0 so this loop ends exactly at m0.
        ke_base = KExt + kv_h * stride_keh + offs_d[:, None]
        ve_base = VExt + kv_h * stride_veh + offs_d[None, :]
        a_lo = 0
        if WINDOW > 0:
            a_lo = tl.maximum(m0 - WINDOW + 1, 0) // BLOCK_N * BLOCK_N
        for n0 in range(a_lo, m0, BLOCK_N):
            rows = start + n0 + offs_n
            k = tl.load(ke_base + rows[None, :] * stride_ket, mask=mask_d[:, None], other=0.0)
            qk = mma(q, k, PREC, UPCAST) * qk_scale
            if SOFTCAP:
                qk = soft_cap(qk, softcap) * 1.4426950408889634
            if WINDOW > 0:
                seen = (n0 + offs_n)[None, :] > offs_m[:, None] - WINDOW
                qk = tl.where(seen, qk, -1.0e30)  # NOTE: see _triton.WINDOW_MASKED
            p, alpha, m_i, l_i = online_softmax(qk, m_i, l_i)
            v = tl.load(ve_base + rows[:, None] * stride_vet, mask=mask_d[None, :], other=0.0)
            acc = acc * alpha[:, None] + mma(p.to(v.dtype), v, PREC, UPCAST)

        # Stage 2b: the diagonal block(s): causal mask + end of the extend part.
        # NOTE: every query row sees key m0 here, so m_i is finite and no row produces NaN.
        n_end = tl.minimum(m0 + BLOCK_M, ext_len)
        for n0 in range(m0, n_end, BLOCK_N):
            cols = n0 + offs_n
            mask_n = cols < ext_len
            rows = start + cols
            k = tl.load(
                ke_base + rows[None, :] * stride_ket,
                mask=mask_n[None, :] & mask_d[:, None],
                other=0.0,
            )
            qk = mma(q, k, PREC, UPCAST) * qk_scale
            if SOFTCAP:
                qk = soft_cap(qk, softcap) * 1.4426950408889634
            if WINDOW > 0:
                qk = tl.where(
                    cols[None, :] > offs_m[:, None] - WINDOW, qk, -1.0e30
                )  # NOTE: see _triton.WINDOW_MASKED
            causal = (offs_m[:, None] >= cols[None, :]) & mask_n[None, :]
            qk = tl.where(causal, qk, float("-inf"))
            p, alpha, m_i, l_i = online_softmax(qk, m_i, l_i)
            v = tl.load(
                ve_base + rows[:, None] * stride_vet,
                mask=mask_n[:, None] & mask_d[None, :],
                other=0.0,
            )
            acc = acc * alpha[:, None] + mma(p.to(v.dtype), v, PREC, UPCAST)

        o = acc / l_i[:, None]
        o_ptrs = Out + (start + offs_m)[:, None] * stride_ot + h * stride_oh + offs_d[None, :]
        tl.store(o_ptrs, o.to(Out.dtype.element_ty), mask=mask_m[:, None] & mask_d[None, :])


class ExtendConfig(NamedTuple):
    """Launch parameters of the extend kernel (BLOCK_M % BLOCK_N == 0 is required)."""

    block_m: int  # query rows per program
    block_n: int  # key tile of the new (causal) part
    block_n_prefix: int  # key tile of the cached prefix
    num_warps: int
    num_stages: int


# Smallest tiles, one stage: fits any head_dim <= 256 in any dtype (used after OutOfResources).
FALLBACK_CONFIG = ExtendConfig(32, 32, 32, 4, 1)


def extend_attention_config(head_dim: int, dtype: torch.dtype = torch.bfloat16) -> ExtendConfig:
    """Launch parameters for (head_dim, dtype) on the current device.

    Measured on H200 (bf16, 32/8 heads): 8 x 1024 new tokens with prefix 0 or 1024 and 512 new
    tokens after a 32k prefix. fp32 tiles are twice the bytes, so they get half the tile size.
    `dtype` is q's (the model dtype): with an FP8 pool only the prefix tiles are fp8 (half the
    bytes, so the same config always fits); not re-tuned for that case.
    Under the interpreter: small tiles, one stage.
    """
    block_d = next_power_of_2(head_dim)
    if interpreting() or not torch.cuda.is_available():
        return ExtendConfig(64, 32, 32, 4, 1)
    row_bytes = block_d * torch.empty((), dtype=dtype).element_size()
    major, _ = torch.cuda.get_device_capability()
    if major >= 9:
        if row_bytes <= 128:  # head_dim <= 64 in bf16/fp16
            return ExtendConfig(128, 64, 64, 4, 4)
        if row_bytes <= 256:  # head_dim 80..128 in bf16/fp16
            return ExtendConfig(128, 64, 128, 8, 3)
        return ExtendConfig(64, 32, 32, 4, 2)
    if row_bytes <= 128:
        return ExtendConfig(64, 64, 64, 4, 2)
    if row_bytes <= 256:
        return ExtendConfig(64, 32, 32, 4, 2)
    return ExtendConfig(32, 32, 32, 4, 1)


def extend_attention(
    q: torch.Tensor,
    k_extend: torch.Tensor,
    v_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    extend_prefix_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    max_extend_len: int,
    sm_scale: float | None = None,
    out: torch.Tensor | None = None,
    config: ExtendConfig | tuple[int, int, int, int, int] | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Triton extend attention; same math as `extend_attention_ref`. Returns `out` [T, H, D].

    `window`: a sliding window (keys at positions > q - window; older prefix slots are not read);
    `softcap`: attention-logit soft-capping.

    `k_scale` / `v_scale`: the dequantisation scales of an FP8 pool (1.0 for any other pool).

    `max_extend_len` (python int) must be >= every `extend_seq_lens[b]`; it only sizes the grid.
    `config` overrides `extend_attention_config(head_dim, q.dtype)` (BLOCK_M % BLOCK_N must be 0).
    """
    require_triton()
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_buffer.shape[1]
    assert num_heads % num_kv_heads == 0, "num_heads must be a multiple of num_kv_heads"
    assert (
        k_extend.shape == (num_tokens, num_kv_heads, head_dim) and v_extend.shape == k_extend.shape
    )
    assert k_buffer.shape[2] == head_dim and v_buffer.shape == k_buffer.shape
    assert q.dtype == k_extend.dtype == v_extend.dtype, "q and the new K/V share one dtype"
    assert k_buffer.dtype == v_buffer.dtype
    assert k_buffer.dtype == q.dtype or is_fp8(k_buffer.dtype), "pool: q's dtype or fp8"
    check_kv_scales(k_buffer.dtype, k_scale, v_scale)
    for t in (q, k_extend, v_extend, k_buffer, v_buffer):
        assert t.stride(2) == 1, "last dim must be contiguous"
    assert req_to_token.stride(1) == 1
    if out is None:
        out = torch.empty_like(q)
    batch = req_pool_indices.shape[0]
    if batch == 0 or max_extend_len <= 0:
        return out
    cfg = (
        ExtendConfig(*config) if config is not None else extend_attention_config(head_dim, q.dtype)
    )
    assert cfg.block_m % cfg.block_n == 0
    scale = 1.0 / math.sqrt(head_dim) if sm_scale is None else sm_scale
    # NOTE: with a soft cap the scores are capped in natural units, then scaled to log2 units.
    log2e = 1.0 if softcap is not None else _LOG2E

    def launch(c: ExtendConfig) -> None:
        grid = (batch, num_heads, cdiv(max_extend_len, c.block_m))
        _extend_attention_kernel[grid](
            *(q, k_extend, v_extend, k_buffer, v_buffer, out, req_to_token, req_pool_indices),
            *(extend_prefix_lens, extend_seq_lens, extend_start_loc),
            scale * log2e,
            scale * log2e * k_scale,
            v_scale,
            softcap or 1.0,
            *q.stride()[:2],
            *k_extend.stride()[:2],
            *v_extend.stride()[:2],
            *k_buffer.stride()[:2],
            *v_buffer.stride()[:2],
            *out.stride()[:2],
            req_to_token.stride(0),
            GROUP=num_heads // num_kv_heads,
            HEAD_DIM=head_dim,
            BLOCK_D=max(16, next_power_of_2(head_dim)),
            BLOCK_M=c.block_m,
            BLOCK_N=c.block_n,
            BLOCK_NP=c.block_n_prefix,
            **dot_flags(q.dtype),
            V_SCALED=v_scale != 1.0,
            WINDOW=window or 0,
            SOFTCAP=softcap is not None,
            num_warps=c.num_warps,
            num_stages=c.num_stages,
        )

    key = ("extend", head_dim, q.dtype, k_buffer.dtype, cfg, window, softcap is not None)
    launch_with_fallback(key, launch, cfg, FALLBACK_CONFIG)
    return out
