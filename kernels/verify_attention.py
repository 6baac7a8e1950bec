"""Tree verify attention over the paged KV pool (speculative decoding): split-KV over each
request's committed prefix, shared by all its draft nodes, plus the tree part under a mask.

A verify batch holds B requests x N nodes (N fixed, <= MAX_TREE_NODES; row r = i * N + j is node
j of request i, node 0 the root = the last committed token). Request i has `prefix_lens[i]`
tokens in the pool (`req_to_token[req_pool_indices[i], :prefix_len]`); its nodes' K/V were
stored at `draft_loc[i, :]` by the layer before this call (like a decode store). Row (i, j)
attends to the whole prefix plus the nodes whose bit is set in its mask row: j itself and its
ancestors (runtime/speculative/tree.py builds it from parents).

Layouts:
    q:         [B * N, num_heads, head_dim]  fp32/bf16/fp16
    k_buffer, v_buffer: [num_slots, num_kv_heads, head_dim] the pool (read only): q's dtype, or
               float8_e4m3fn / float8_e5m2 read as `fp8.to(q.dtype) * scale` (like decode)
    req_to_token: [max_running_requests, max_context_len] int32
    req_pool_indices, prefix_lens: [B] int32/int64 (a padding request: prefix 0, an empty mask)
    draft_loc: [B, N] int64 the nodes' slots (slot 0 for padding nodes)
    tree_mask: [B, N, ceil(N / 32)] int32, bit t % 32 of word t // 32 of row (i, j): j sees node t
    positions: [B * N] int64 = prefix_len + depth (read only for a sliding window)
    out:       [B * N, num_heads, head_dim] dtype of q; rows that see no key (padding nodes of a
               request without prefix) get zeros
    workspace: (mid_o, mid_lse) of `alloc_decode_workspace(B * N, num_heads, head_dim, splits)`

Stage 1, grid (B, num_kv_heads * M_BLOCKS, max_kv_splits): one program owns BLOCK_M query rows
m = node * GROUP + g (all N nodes x the GQA group of one kv head, in M_BLOCKS blocks), so each
prefix K/V tile is read once per request and kv head, not once per node, and both products are
`tl.dot`s. Split s covers a range of the prefix (`decode_merge.split_span`, as in decode); split 0
also attends to the tree keys (one tile of BLOCK_T >= N nodes, masked per row by the bits).
Stage 2 (verify_merge.py, same grid without splits) merges the splits; when the
prefix fits one split (or is empty) stage 1 writes `out` directly and stage 2 skips the request.

# NOTE: grids and shapes depend only on (B, N, max_kv_splits) and nothing is read on the host, so
# both launches can be captured in a CUDA graph; a padded request (prefix 0, mask 0, slots 0)
# reads nothing but slot 0 (the pool's padding slot) and writes zeros.
# NOTE (masking): a row may see no key of a tile, or of a whole split (a windowed deep node, a
# padding node): the online softmax here keeps such rows at m = -inf, l = 0 (no NaN), their split
# output is 0 with lse -inf, which the merge weighs 0. Keys that no row of the block sees are not
# loaded at all (a padding node's slot 0, unwritten slots).
# NOTE (FP8 pool): the tree nodes attend to each other's stored (quantised) K/V, like decode's
# new token; k_scale folds into the score scale, v_scale multiplies each split's normalised output.
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
    require_triton,
    soft_cap,
    tl,
)
from radixlm.kernels.decode_merge import merge_block_sizes, split_span
from radixlm.kernels.decode_workspace import (
    alloc_decode_workspace,
    check_split_inputs,
    choose_num_kv_splits,
)
from radixlm.kernels.store_kv import is_fp8
from radixlm.kernels.verify_merge import verify_stage2_kernel

MAX_TREE_NODES = 64  # the tree keys of a request fit one tile
_LOG2E = 1.4426950408889634


@jit
def _masked_online_softmax(qk, m_i, l_i):
    """`online_softmax` for rows that may see no key yet (all -inf): they keep m = -inf, l = 0
    and get p = 0, alpha = 0 instead of NaN."""
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(qk - m_use[:, None])
    return p, alpha, m_new, l_i * alpha + tl.sum(p, 1)


@jit
def _scores(
    q, k, qk_scale, softcap, PREC: tl.constexpr, UPCAST: tl.constexpr, SOFTCAP: tl.constexpr
):
    qk = mma(q, k, PREC, UPCAST) * qk_scale  # log2 units
    if SOFTCAP:  # capped in natural units (qk_scale has no log2(e) then)
        qk = soft_cap(qk, softcap) * 1.4426950408889634
    return qk


@jit
def _verify_stage1_kernel(
    Q,
    KBuf,
    VBuf,
    ReqToToken,
    ReqPoolIdx,
    PrefixLens,
    DraftLoc,
    TreeMask,
    Positions,
    MidO,
    MidLse,
    Out,
    qk_scale,
    v_scale,
    softcap,
    num_splits,
    stride_qr,
    stride_qh,
    stride_kbs,
    stride_kbh,
    stride_vbs,
    stride_vbh,
    stride_r2t,
    stride_dlb,
    stride_tmb,
    stride_tmn,
    stride_mor,
    stride_moh,
    stride_mos,
    stride_mlr,
    stride_mlh,
    stride_or,
    stride_oh,
    NODES: tl.constexpr,
    GROUP: tl.constexpr,
    M_BLOCKS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_T: tl.constexpr,
    PREC: tl.constexpr,
    UPCAST: tl.constexpr,
    V_SCALED: tl.constexpr,
    FP16_MMA: tl.constexpr,
    WINDOW: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    b = tl.program_id(0)
    kv_h = tl.program_id(1) // M_BLOCKS
    mb = tl.program_id(1) % M_BLOCKS
    split = tl.program_id(2)
    prefix = tl.load(PrefixLens + b).to(tl.int32)
    lo = prefix * 0
    if WINDOW > 0:  # the root sees positions > prefix - WINDOW; deeper rows fewer (masked below)
        lo = tl.maximum(prefix - WINDOW + 1, 0)
    split_len, n_valid = split_span(prefix - lo, num_splits, BLOCK_N)
    n_valid = tl.maximum(n_valid, 1)  # split 0 always runs: it holds the tree part
    if split < n_valid:
        req = tl.load(ReqPoolIdx + b).to(tl.int64)
        r2t_row = ReqToToken + req * stride_r2t
        offs_m = mb * BLOCK_M + tl.arange(0, BLOCK_M)
        mask_m = offs_m < NODES * GROUP
        node = offs_m // GROUP
        rows = (b * NODES + node).to(tl.int64)
        heads = kv_h * GROUP + offs_m % GROUP
        offs_d = tl.arange(0, BLOCK_D)
        mask_d = offs_d < HEAD_DIM
        mask_md = mask_m[:, None] & mask_d[None, :]
        q = tl.load(
            Q + rows[:, None] * stride_qr + heads[:, None] * stride_qh + offs_d[None, :],
            mask=mask_md,
            other=0.0,
        )
        if FP16_MMA:  # an fp8 pool under a bf16 q: products in fp16 (decode_attention.py)
            q = tl.clamp(q.to(tl.float32), -65504.0, 65504.0).to(tl.float16)
        q_pos = prefix * 0
        if WINDOW > 0:
            q_pos = tl.load(Positions + rows, mask=mask_m, other=0).to(tl.int32)
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        # ---- the prefix keys of this split: [n_start, n_end) ----
        n_start = lo + split * split_len
        n_end = tl.minimum(n_start + split_len, prefix)
        offs_n = tl.arange(0, BLOCK_N)
        for n0 in range(n_start, n_end, BLOCK_N):
            cols = n0 + offs_n
            mask_n = cols < n_end
            slots = tl.load(r2t_row + cols, mask=mask_n, other=0).to(tl.int64)
            k = tl.load(
                KBuf + slots[None, :] * stride_kbs + kv_h * stride_kbh + offs_d[:, None],
                mask=mask_n[None, :] & mask_d[:, None],
                other=0.0,
            ).to(q.dtype)  # NOTE: a no-op unless the pool is fp8
            qk = _scores(q, k, qk_scale, softcap, PREC, UPCAST, SOFTCAP)
            see = mask_n[None, :] & mask_m[:, None]
            if WINDOW > 0:
                see = see & (cols[None, :] > q_pos[:, None] - WINDOW)
            qk = tl.where(see, qk, float("-inf"))
            p, alpha, m_i, l_i = _masked_online_softmax(qk, m_i, l_i)
            v = tl.load(
                VBuf + slots[:, None] * stride_vbs + kv_h * stride_vbh + offs_d[None, :],
                mask=mask_n[:, None] & mask_d[None, :],
                other=0.0,
            ).to(q.dtype)
            acc = acc * alpha[:, None] + mma(p.to(v.dtype), v, PREC, UPCAST)
        # ---- the tree keys (split 0): node t where the row's bit t is set ----
        if split == 0:
            offs_t = tl.arange(0, BLOCK_T)
            mask_t = offs_t < NODES
            words = tl.load(
                TreeMask + b * stride_tmb + node[:, None] * stride_tmn + (offs_t // 32)[None, :],
                mask=mask_m[:, None] & mask_t[None, :],
                other=0,
            )
            see = ((words >> (offs_t % 32)[None, :]) & 1) != 0
            if WINDOW > 0:
                k_pos = tl.load(Positions + b * NODES + offs_t, mask=mask_t, other=0).to(tl.int32)
                see = see & (k_pos[None, :] > q_pos[:, None] - WINDOW)
            used = tl.max(see.to(tl.int32), 0) > 0  # keys some row of the block sees
            slots = tl.load(DraftLoc + b * stride_dlb + offs_t, mask=used, other=0).to(tl.int64)
            k = tl.load(
                KBuf + slots[None, :] * stride_kbs + kv_h * stride_kbh + offs_d[:, None],
                mask=used[None, :] & mask_d[:, None],
                other=0.0,
            ).to(q.dtype)
            qk = _scores(q, k, qk_scale, softcap, PREC, UPCAST, SOFTCAP)
            qk = tl.where(see, qk, float("-inf"))
            p, alpha, m_i, l_i = _masked_online_softmax(qk, m_i, l_i)
            v = tl.load(
                VBuf + slots[:, None] * stride_vbs + kv_h * stride_vbh + offs_d[None, :],
                mask=used[:, None] & mask_d[None, :],
                other=0.0,
            ).to(q.dtype)
            acc = acc * alpha[:, None] + mma(p.to(v.dtype), v, PREC, UPCAST)
        o = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]  # a row that saw nothing: 0
        if V_SCALED:  # an FP8 pool with v_scale != 1
            o = o * v_scale
        if n_valid == 1:  # the whole prefix in one split (or none): written out, nothing to merge
            o_ptrs = Out + rows[:, None] * stride_or + heads[:, None] * stride_oh + offs_d[None, :]
            tl.store(o_ptrs, o.to(Out.dtype.element_ty), mask=mask_md)
        else:
            mo_ptrs = (
                MidO
                + rows[:, None] * stride_mor
                + heads[:, None] * stride_moh
                + split * stride_mos
                + offs_d[None, :]
            )
            tl.store(mo_ptrs, o, mask=mask_md)
            lse = (m_i + tl.log2(tl.maximum(l_i, 1e-30))) * 0.6931471805599453  # natural log
            lse = tl.where(l_i > 0.0, lse, float("-inf"))  # a row that saw nothing: weight 0
            tl.store(MidLse + rows * stride_mlr + heads * stride_mlh + split, lse, mask=mask_m)


def verify_block_config(
    head_dim: int, group: int, nodes: int, dtype: torch.dtype = torch.bfloat16
) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) of stage 1 for (head_dim, GQA group, nodes per
    request, the pool's dtype). BLOCK_M covers up to 64 (node, head) rows; a prefix tile streams
    16 KB (decode_attention.decode_block_config's small-batch tile). Not yet tuned on the GPU."""
    block_m = min(64, max(16, next_power_of_2(nodes * group)))
    if interpreting() or not torch.cuda.is_available():
        return block_m, 32, 4, 1
    row_bytes = next_power_of_2(head_dim) * torch.empty((), dtype=dtype).element_size()
    block_n = max(16, min(128, (16 << 10) // row_bytes))
    return block_m, block_n, 4, 2


def verify_attention_fwd(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    draft_loc: torch.Tensor,
    tree_mask: torch.Tensor,
    positions: torch.Tensor,
    out: torch.Tensor,
    mid_o: torch.Tensor,
    mid_lse: torch.Tensor,
    sm_scale: float | None = None,
    config: tuple[int, int, int, int] | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """CUDA-graph-safe tree verify attention into preallocated `out`, `mid_o`, `mid_lse` (layouts
    in the module docstring). max_kv_splits = mid_o.shape[2]; workspace rows past B * N are
    ignored, so one allocated for the largest captured batch serves every smaller one.
    `window`: sliding window (keys at positions > the query's - window); `softcap`: logit cap;
    `k_scale` / `v_scale`: an FP8 pool's dequantisation scales (python floats)."""
    require_triton()
    bsz, nodes = draft_loc.shape
    rows, num_heads, head_dim = q.shape
    num_kv_heads = k_buffer.shape[1]
    assert 1 <= nodes <= MAX_TREE_NODES, f"a tree has 1..{MAX_TREE_NODES} nodes, got {nodes}"
    assert rows == bsz * nodes, "q has B * N rows (N nodes per request)"
    check_split_inputs(q, k_buffer, v_buffer, out, mid_o, mid_lse, req_to_token, k_scale, v_scale)
    assert tree_mask.dtype == torch.int32 and tree_mask.shape == (bsz, nodes, cdiv(nodes, 32))
    assert tree_mask.stride(2) == 1 and draft_loc.stride(1) == 1
    assert positions.numel() == rows and positions.is_contiguous()
    assert window is None or window >= 1
    num_splits = mid_o.shape[2]
    if bsz == 0:
        return out
    group = num_heads // num_kv_heads
    block_m, block_n, num_warps, num_stages = config or verify_block_config(
        head_dim, group, nodes, k_buffer.dtype
    )
    m_blocks = cdiv(nodes * group, block_m)
    block_d = max(16, next_power_of_2(head_dim))
    scale = 1.0 / math.sqrt(head_dim) if sm_scale is None else sm_scale
    mid_strides = (*mid_o.stride()[:3], *mid_lse.stride()[:2])
    common = {
        "NODES": nodes,
        "GROUP": group,
        "M_BLOCKS": m_blocks,
        "HEAD_DIM": head_dim,
        "BLOCK_D": block_d,
        "BLOCK_M": block_m,
        "BLOCK_N": block_n,
        "WINDOW": window or 0,
    }
    _verify_stage1_kernel[(bsz, num_kv_heads * m_blocks, num_splits)](
        *(q, k_buffer, v_buffer, req_to_token, req_pool_indices, prefix_lens, draft_loc),
        *(tree_mask, positions, mid_o, mid_lse, out),
        scale * (1.0 if softcap is not None else _LOG2E) * k_scale,
        v_scale,
        softcap or 1.0,
        num_splits,
        *q.stride()[:2],
        *k_buffer.stride()[:2],
        *v_buffer.stride()[:2],
        req_to_token.stride(0),
        draft_loc.stride(0),
        *tree_mask.stride()[:2],
        *mid_strides,
        *out.stride()[:2],
        **common,
        BLOCK_T=max(16, next_power_of_2(nodes)),
        **dot_flags(q.dtype),
        V_SCALED=v_scale != 1.0,
        FP16_MMA=is_fp8(k_buffer.dtype) and q.dtype == torch.bfloat16,
        SOFTCAP=softcap is not None,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    if num_splits > 1:
        verify_stage2_kernel[(bsz, num_kv_heads * m_blocks)](
            *(mid_o, mid_lse, prefix_lens, out),
            num_splits,
            *mid_strides,
            *out.stride()[:2],
            **common,
            **merge_block_sizes(num_splits, block_m, block_d),
            num_warps=4,
        )
    return out


def verify_num_kv_splits(batch: int, nodes: int, num_heads: int, num_kv_heads: int,
                         max_prefix: int) -> int:  # fmt: skip
    """Split count for a verify batch: `choose_num_kv_splits` over its programs per split (B x
    the M_BLOCKS of each kv head) and the longest prefix. Pure python: usable for a graph's size."""
    m_blocks = cdiv(nodes * (num_heads // num_kv_heads), 64)
    return choose_num_kv_splits(batch * m_blocks, max(1, max_prefix), num_kv_heads)


def verify_attention(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    draft_loc: torch.Tensor,
    tree_mask: torch.Tensor,
    positions: torch.Tensor,
    sm_scale: float | None = None,
    num_kv_splits: int | None = None,
    max_prefix_len: int | None = None,
    out: torch.Tensor | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Eager convenience wrapper: allocates the workspace and picks `num_kv_splits` (from
    `max_prefix_len`, read from `prefix_lens` when both are None: one host sync). Not for CUDA-graph
    capture: use `verify_attention_fwd`."""
    bsz, nodes = draft_loc.shape
    _, num_heads, head_dim = q.shape
    if num_kv_splits is None:
        if max_prefix_len is None:
            max_prefix_len = int(prefix_lens.max()) if bsz else 1
        num_kv_splits = verify_num_kv_splits(
            bsz, nodes, num_heads, k_buffer.shape[1], max_prefix_len
        )
    if out is None:
        out = torch.empty_like(q)
    mid_o, mid_lse = alloc_decode_workspace(
        q.shape[0], num_heads, head_dim, num_kv_splits, q.device
    )
    return verify_attention_fwd(
        *(q, k_buffer, v_buffer, req_to_token, req_pool_indices, prefix_lens, draft_loc),
        *(tree_mask, positions, out, mid_o, mid_lse, sm_scale),
        k_scale=k_scale,
        v_scale=v_scale,
        window=window,
        softcap=softcap,
    )
