"""Decode attention over the paged KV pool: split-KV (flash-decoding), GQA-grouped.

One query token per request attends to its whole sequence `req_to_token[req, 0:seq_len]` in the
pool; the new token's K/V must already be stored there (`store_kv` at `out_cache_loc`).

Layouts:
    q:        [B, num_heads, head_dim]                  fp32/bf16/fp16
    k_buffer, v_buffer: [num_slots, num_kv_heads, head_dim]  the KV pool (read only): q's dtype, or
              float8_e4m3fn / float8_e5m2 (an FP8 KV cache) read as `fp8.to(q.dtype) * scale` with
              the pool's python-float `k_scale` / `v_scale` (store_kv.py)
    req_to_token: [max_running_requests, max_context_len] int32
    req_pool_indices, seq_lens: [B] int32/int64 (seq_len counts the new token; 0 = padding lane)
    out:      [B, num_heads, head_dim] dtype of q
    workspace (fp32, owned by the caller, contents are scratch):
        mid_o:   [B, num_heads, max_kv_splits, head_dim] per-split output, already normalised
        mid_lse: [B, num_heads, max_kv_splits]           per-split natural-log sum-exp of scores

Stage 1, grid (B, num_kv_heads * head_blocks, max_kv_splits): one program owns a block of up to
BLOCK_H (>= 16, padded and masked) query heads that share one kv head, so every K/V tile is read
once per group and both products are `tl.dot`s. The splits are merged by the last program of
each head block to finish (with arrival counters) or by a second kernel (decode_merge.py).

# NOTE: the split actually used by a request is derived from its seq_len inside the kernels
# (`decode_merge.split_span`): split_len = BLOCK_N * ceil(ceil(seq_len / max_kv_splits) / BLOCK_N)
# and split s covers [s * split_len, min((s + 1) * split_len, seq_len)); splits past the end are
# skipped by both stages, and a sequence that fits one split writes `out` directly (no workspace,
# no merge). Shapes and grids therefore depend only on (B, max_kv_splits), which makes the kernels
# CUDA-graph safe.

# NOTE (FP8 pool): tiles are loaded as fp8 and converted to q's dtype for the `mma`s (exact: every
# e4m3/e5m2 value is representable in fp16/bf16/fp32), except that with a bf16 q both products
# run in fp16 (FP16_MMA: q clamped to fp16's finite range, then rounded; the probabilities and
# the fp8 values convert exactly or more precisely than to bf16). fp8 -> fp16 is one conversion
# per two elements, fp8 -> bf16 goes through fp32: the kernel is bound by that per-element work,
# and fp16 measured 14-19 % faster at batch 1-64, 4k-32k (docs/benchmarks.md, run 31). The
# scales cost nothing per element:
# k_scale is folded into qk_scale, and v_scale multiplies each split's normalised output (the
# merge is a convex combination of split outputs, so scaling each one equals scaling the result).
"""

from __future__ import annotations

import math

import torch

from radixlm.kernels._triton import (
    cdiv,
    dot_flags,
    interpreting,
    jit,
    mma,
    next_power_of_2,
    online_softmax,
    pdl_launch_args,
    pdl_prologue,
    require_triton,
    soft_cap,
    tl,
)
from radixlm.kernels.decode_merge import (
    decode_stage2_kernel,
    fence_gpu,
    merge_block_sizes,
    merge_splits,
    split_span,
)
from radixlm.kernels.decode_workspace import (
    alloc_decode_workspace,
    check_split_inputs,
    choose_num_kv_splits,
)
from radixlm.kernels.store_kv import is_fp8

_LOG2E = 1.4426950408889634


@jit
def _decode_stage1_kernel(
    Q,
    KBuf,
    VBuf,
    ReqToToken,
    ReqPoolIdx,
    SeqLens,
    MidO,
    MidLse,
    Arrivals,
    Out,
    qk_scale,
    v_scale,
    softcap,
    num_splits,
    stride_qb,
    stride_qh,
    stride_kbs,
    stride_kbh,
    stride_vbs,
    stride_vbh,
    stride_r2t,
    stride_mob,
    stride_moh,
    stride_mos,
    stride_mlb,
    stride_mlh,
    stride_ob,
    stride_oh,
    GROUP: tl.constexpr,
    HEAD_BLOCKS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PREC: tl.constexpr,
    UPCAST: tl.constexpr,
    V_SCALED: tl.constexpr,
    FP16_MMA: tl.constexpr,
    BLOCK_S: tl.constexpr,
    CHUNK: tl.constexpr,
    FUSED_MERGE: tl.constexpr,
    FENCE: tl.constexpr,
    USE_PDL: tl.constexpr,
    WINDOW: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    b = tl.program_id(0)
    kv_h = tl.program_id(1) // HEAD_BLOCKS
    hb = tl.program_id(1) % HEAD_BLOCKS
    split = tl.program_id(2)
    # NOTE (PDL): until gdc_wait this reads only what the previous kernel (the store of the new
    # token's K/V, after the q projection) does not write: the slots of the split's first tile
    # (req_to_token), which the loop's first iteration then takes instead of loading them.
    seq_len = tl.load(SeqLens + b).to(tl.int32)
    req = tl.load(ReqPoolIdx + b).to(tl.int64)
    r2t_row = ReqToToken + req * stride_r2t
    if WINDOW > 0:
        # NOTE: a windowed layer attends to the last WINDOW positions only: the row is shifted
        # to the window's first slot and the sequence shortened to it (stage 2 does the same);
        # older slots are never read.
        lo = tl.maximum(seq_len - WINDOW, 0)
        r2t_row += lo
        seq_len -= lo
    split_len, n_valid = split_span(seq_len, num_splits, BLOCK_N)
    n_start = split * split_len
    n_end = tl.minimum(n_start + split_len, seq_len)
    offs_n = tl.arange(0, BLOCK_N)
    first_slots = tl.load(r2t_row + n_start + offs_n, mask=n_start + offs_n < n_end, other=0)
    pdl_prologue(USE_PDL)
    if n_start < n_end:
        offs_g = hb * BLOCK_H + tl.arange(0, BLOCK_H)
        mask_h = offs_g < GROUP
        heads = kv_h * GROUP + offs_g
        offs_d = tl.arange(0, BLOCK_D)
        mask_d = offs_d < HEAD_DIM
        q = tl.load(
            Q + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
            mask=mask_h[:, None] & mask_d[None, :],
            other=0.0,
        )
        if FP16_MMA:
            q = tl.clamp(q.to(tl.float32), -65504.0, 65504.0).to(tl.float16)
        m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
        acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
        for n0 in range(n_start, n_end, BLOCK_N):
            cols = n0 + offs_n
            mask_n = cols < n_end
            first = cols < n_start + BLOCK_N
            slots = tl.load(r2t_row + cols, mask=mask_n & ~first, other=0)
            slots = tl.where(first, first_slots, slots).to(tl.int64)
            k = tl.load(
                KBuf + slots[None, :] * stride_kbs + kv_h * stride_kbh + offs_d[:, None],
                mask=mask_n[None, :] & mask_d[:, None],
                other=0.0,
            ).to(q.dtype)  # NOTE: a no-op unless the pool is fp8
            qk = mma(q, k, PREC, UPCAST) * qk_scale  # [BLOCK_H, BLOCK_N], log2 units
            if SOFTCAP:  # capped in natural units (qk_scale has no log2(e) then)
                qk = soft_cap(qk, softcap) * 1.4426950408889634
            qk = tl.where(mask_n[None, :], qk, float("-inf"))
            p, alpha, m_i, l_i = online_softmax(qk, m_i, l_i)
            v = tl.load(
                VBuf + slots[:, None] * stride_vbs + kv_h * stride_vbh + offs_d[None, :],
                mask=mask_n[:, None] & mask_d[None, :],
                other=0.0,
            ).to(q.dtype)
            acc = acc * alpha[:, None] + mma(p.to(v.dtype), v, PREC, UPCAST)
        mask_hd = mask_h[:, None] & mask_d[None, :]
        if n_valid == 1:  # the whole sequence in one split: written out, nothing to merge
            o_ptrs = Out + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :]
            o = acc / l_i[:, None]
            if V_SCALED:  # an FP8 pool with v_scale != 1 (see the module docstring)
                o = o * v_scale
            tl.store(o_ptrs, o.to(Out.dtype.element_ty), mask=mask_hd)
        else:
            mo_ptrs = (
                MidO
                + b * stride_mob
                + heads[:, None] * stride_moh
                + split * stride_mos
                + offs_d[None, :]
            )
            o = acc / l_i[:, None]
            if V_SCALED:
                o = o * v_scale
            tl.store(mo_ptrs, o, mask=mask_hd)
            lse = (m_i + tl.log2(l_i)) * 0.6931471805599453  # log2 -> natural-log units (x ln 2)
            tl.store(MidLse + b * stride_mlb + heads * stride_mlh + split, lse, mask=mask_h)
    if FUSED_MERGE:
        # With several splits holding tokens, the last of them to arrive merges; empty splits
        # exit without counting. A padding lane (no split) gets its zeros from split 0.
        last = (n_valid == 0) & (split == 0)
        if (split < n_valid) & (n_valid > 1):
            if FENCE:
                fence_gpu()  # this thread's partials are visible device-wide before it counts
            tl.debug_barrier()
            counter = Arrivals + b * tl.num_programs(1) + tl.program_id(1)
            arrived = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
            last = arrived == n_valid - 1
            if last:
                tl.store(counter, 0)  # NOTE: leaves the counters zeroed for the next launch
        if last:
            tl.debug_barrier()
            offs_g = hb * BLOCK_H + tl.arange(0, BLOCK_H)
            heads = kv_h * GROUP + offs_g
            merge_splits(
                MidO + b * stride_mob + heads * stride_moh,
                MidLse + b * stride_mlb + heads * stride_mlh,
                Out + b * stride_ob + heads * stride_oh,
                offs_g < GROUP,
                seq_len,
                num_splits,
                stride_mos,
                HEAD_DIM,
                BLOCK_D,
                BLOCK_N,
                BLOCK_S,
                CHUNK,
            )


def decode_block_config(
    head_dim: int, group: int, dtype: torch.dtype = torch.bfloat16, batch: int = 64
) -> tuple[int, int, int, int]:
    """(BLOCK_H, BLOCK_N, num_warps, num_stages) of stage 1 for (head_dim, GQA group, the KV
    pool's dtype, batch size).

    # NOTE (FP8 pool): BLOCK_N is sized from the pool's element size, i.e. from the bytes a K/V
    # tile streams through shared memory, so an fp8 tile holds twice the rows of a bf16 one in
    # the same bytes, up to the same cap of 128 rows (the tile converted to 16 bits for the `mma`
    # then takes as many registers as the measured bf16 tile of 128 rows). At head_dim 128 this
    # gives 128 rows at every batch size: unchanged from bf16 at batch >= 16 (16 KB tiles instead
    # of 32 KB), and below batch 16 the same 16 KB of shared memory per tile as bf16's halved
    # 64-row tile, which is what that halving was measured to be about. A pool in q's dtype
    # (bf16/fp16/fp32) gets exactly the previous sizes. Measured on the H200 (docs/benchmarks.md,
    # run 19): 128 rows beat 64 by 10-40 % and 256 rows; 3 stages beat 2 by 1-4 % at batch 8-64.
    """
    block_h = min(64, max(16, next_power_of_2(group)))
    if interpreting() or not torch.cuda.is_available():
        return block_h, 32, 4, 1
    # H200, bf16, head_dim 128: BLOCK_N=128 / 2 stages reached 93-99% of copy bandwidth at
    # batch 8-64 (a K/V tile of 32 KB). Below batch 16 the tile is halved: inside the real decode
    # step at batch 1 that measured +1.2-2.7 % tokens/s at contexts of 256-2048 (likely because
    # 128 KB of shared memory per program kept it from sharing SMs with the neighbouring kernels
    # that PDL starts early), although alone at 32k context the larger tile streams better
    # (batch 1: 79.9 % of copy bandwidth against 67.7 %, run 31). A second batch-1 graph with
    # the larger tile for long contexts lost 2-10 % in the step at every context of 1k-8k (run 32).
    row_bytes = next_power_of_2(head_dim) * torch.empty((), dtype=dtype).element_size()
    tile_bytes = (32 if batch >= 16 else 16) << 10
    block_n = max(16, min(128, tile_bytes // row_bytes))
    return block_h, block_n, 4, 3 if is_fp8(dtype) else 2


def decode_attention_fwd(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    out: torch.Tensor,
    mid_o: torch.Tensor,
    mid_lse: torch.Tensor,
    sm_scale: float | None = None,
    config: tuple[int, int, int, int] | None = None,
    arrivals: torch.Tensor | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """CUDA-graph-safe decode attention into preallocated `out`, `mid_o`, `mid_lse`.

    `window`: a sliding window (the last `window` positions; older slots are not read);
    `softcap`: attention-logit soft-capping.

    `k_scale` / `v_scale`: the dequantisation scales of an FP8 pool (python floats, baked into a
    captured graph); 1.0 for any other pool.

    With `arrivals` (int32, zeroed, >= batch * num_heads elements, left zeroed after) the
    splits are merged inside stage 1 by the last program of each head block to finish (one
    kernel); without it a second kernel merges them.

    max_kv_splits = mid_o.shape[2] (<= MAX_KV_SPLITS); no host sync, no allocation, grids depend
    only on shapes. Rows b >= q.shape[0] of the workspace are ignored, so a workspace allocated
    for the largest captured batch serves every smaller one (pass views `mid_o[:bs]` or the whole).
    """
    require_triton()
    batch, num_heads, head_dim = q.shape
    num_kv_heads = k_buffer.shape[1]
    check_split_inputs(q, k_buffer, v_buffer, out, mid_o, mid_lse, req_to_token, k_scale, v_scale)
    # NOTE: read as `SeqLens + b`: a stride-0 view (an expanded scalar) would read past its one
    # element (garbage lengths, then KV slots out of the pool)
    assert req_pool_indices.is_contiguous() and seq_lens.is_contiguous(), (
        "per-row inputs: contiguous"
    )
    num_splits = mid_o.shape[2]
    if batch == 0:
        return out
    group = num_heads // num_kv_heads
    block_h, block_n, num_warps, num_stages = config or decode_block_config(
        head_dim, group, k_buffer.dtype, batch
    )
    head_blocks = cdiv(group, block_h)
    block_d = max(16, next_power_of_2(head_dim))
    scale = 1.0 / math.sqrt(head_dim) if sm_scale is None else sm_scale
    mid_strides = (*mid_o.stride()[:3], *mid_lse.stride()[:2])
    fused = arrivals is not None
    if fused:
        assert arrivals.dtype == torch.int32
        assert arrivals.numel() >= batch * num_kv_heads * head_blocks
    merge_sizes = merge_block_sizes(num_splits, block_h, block_d)
    _decode_stage1_kernel[(batch, num_kv_heads * head_blocks, num_splits)](
        *(q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens, mid_o, mid_lse),
        arrivals if fused else seq_lens,
        out,
        scale * (1.0 if softcap is not None else _LOG2E) * k_scale,
        v_scale,
        softcap or 1.0,
        num_splits,
        *q.stride()[:2],
        *k_buffer.stride()[:2],
        *v_buffer.stride()[:2],
        req_to_token.stride(0),
        *mid_strides,
        *out.stride()[:2],
        GROUP=group,
        HEAD_BLOCKS=head_blocks,
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        BLOCK_H=block_h,
        BLOCK_N=block_n,
        **merge_sizes,
        **dot_flags(q.dtype),
        V_SCALED=v_scale != 1.0,
        FP16_MMA=is_fp8(k_buffer.dtype) and q.dtype == torch.bfloat16,
        FUSED_MERGE=fused,
        FENCE=not interpreting(),
        WINDOW=window or 0,
        SOFTCAP=softcap is not None,
        num_warps=num_warps,
        num_stages=num_stages,
        **pdl_launch_args(q.device),
    )
    if fused:
        return out
    decode_stage2_kernel[(batch, num_kv_heads * head_blocks)](
        *(mid_o, mid_lse, seq_lens, out),
        num_splits,
        *mid_strides,
        *out.stride()[:2],
        GROUP=group,
        HEAD_BLOCKS=head_blocks,
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        BLOCK_H=block_h,
        BLOCK_N=block_n,
        **merge_sizes,
        WINDOW=window or 0,
        num_warps=4,
        **pdl_launch_args(q.device),
    )
    return out


def decode_attention(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float | None = None,
    num_kv_splits: int | None = None,
    max_seq_len: int | None = None,
    out: torch.Tensor | None = None,
    fused_merge: bool = True,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Eager convenience wrapper: allocates the workspace and picks `num_kv_splits`.

    `max_seq_len` (python int) feeds the heuristic; if both it and `num_kv_splits` are None it is
    read from `seq_lens` (one host sync). Not for CUDA-graph capture: use `decode_attention_fwd`.
    """
    batch, num_heads, head_dim = q.shape
    if num_kv_splits is None:
        if max_seq_len is None:
            max_seq_len = int(seq_lens.max()) if batch else 1
        num_kv_splits = choose_num_kv_splits(batch, max_seq_len, k_buffer.shape[1])
    if out is None:
        out = torch.empty_like(q)
    mid_o, mid_lse = alloc_decode_workspace(batch, num_heads, head_dim, num_kv_splits, q.device)
    arrivals = torch.zeros(batch * num_heads, dtype=torch.int32, device=q.device)
    pool = (k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens)
    return decode_attention_fwd(
        *(q, *pool, out, mid_o, mid_lse, sm_scale),
        arrivals=arrivals if fused_merge else None,
        k_scale=k_scale,
        v_scale=v_scale,
        window=window,
        softcap=softcap,
    )
