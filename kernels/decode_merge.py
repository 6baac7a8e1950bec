"""Merging split-KV decode results: each split's normalised output and log-sum-exp combine into
the final attention output.

Two ways, same math (see decode_attention.py for the layouts):
    `merge_splits`: called by the last split program of a head block inside the stage-1 kernel
        (the fused merge; `fence_gpu` publishes a program's partials before it counts itself);
    `decode_stage2_kernel`: a separate kernel, grid (B, num_heads), when no arrival counters are
        given.
"""

from __future__ import annotations

from radixlm.kernels._triton import jit, pdl_prologue, tl


@jit
def fence_gpu():
    tl.inline_asm_elementwise(
        "fence.acq_rel.gpu; // $0", "=r", [], dtype=tl.int32, is_pure=False, pack=1
    )


@jit
def merge_splits(
    MoRows,
    LseRow,
    OutRows,
    mask_h,
    seq_len,
    num_splits,
    stride_mos,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Merge the per-split (output, lse) of a block of heads into their final output (the
    fused stage 2). MoRows/OutRows: [BLOCK_H, 1] row pointers; LseRow: [BLOCK_H] pointers."""
    split_len = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    n_valid = tl.minimum(tl.cdiv(seq_len, tl.maximum(split_len, 1)), num_splits)
    offs_d = tl.arange(0, BLOCK_D)
    mask = mask_h[:, None] & (offs_d < HEAD_DIM)[None, :]
    m = tl.full(mask_h.shape, float("-inf"), dtype=tl.float32)
    denom = tl.zeros(mask_h.shape, dtype=tl.float32)
    acc = tl.zeros(mask.shape, dtype=tl.float32)
    for s in range(0, n_valid):
        # NOTE: .cg reads from L2: the partials were written by other SMs in this launch.
        lse = tl.load(LseRow + s, mask=mask_h, other=0.0, cache_modifier=".cg")
        mo = tl.load(MoRows + s * stride_mos + offs_d[None, :], mask=mask, other=0.0,
                     cache_modifier=".cg")  # fmt: skip
        m_new = tl.maximum(m, lse)
        rescale = tl.exp(m - m_new)  # split 0 comes first: exp(-inf) = 0, never inf - inf
        w = tl.exp(lse - m_new)
        acc = acc * rescale[:, None] + w[:, None] * mo
        denom = denom * rescale + w
        m = m_new
    o = acc / tl.maximum(denom, 1e-30)[:, None]  # padding lane (no split): 0
    tl.store(OutRows + offs_d[None, :], o.to(OutRows.dtype.element_ty), mask=mask)


@jit
def decode_stage2_kernel(
    MidO,
    MidLse,
    SeqLens,
    Out,
    num_splits,
    stride_mob,
    stride_moh,
    stride_mos,
    stride_mlb,
    stride_mlh,
    stride_ob,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_N: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    pdl_prologue(USE_PDL)
    seq_len = tl.load(SeqLens + b).to(tl.int32)
    split_len = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    # Same split rule as stage 1: splits 0..n_valid-1 hold data (none for a padding lane).
    n_valid = tl.minimum(tl.cdiv(seq_len, tl.maximum(split_len, 1)), num_splits)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    lse_row = MidLse + b * stride_mlb + h * stride_mlh
    mo_row = MidO + b * stride_mob + h * stride_moh
    m = float("-inf")
    denom = 0.0
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    # NOTE: the first chunk always holds split 0, so m is finite after it (no inf - inf).
    for s0 in range(0, n_valid, BLOCK_S):
        splits = s0 + offs_s
        valid = splits < n_valid
        lse = tl.load(lse_row + splits, mask=valid, other=float("-inf"))
        m_new = tl.maximum(m, tl.max(lse, 0))
        rescale = tl.exp(m - m_new)
        w = tl.where(valid, tl.exp(lse - m_new), 0.0)
        mo = tl.load(
            mo_row + splits[:, None] * stride_mos + offs_d[None, :],
            mask=valid[:, None] & mask_d[None, :],
            other=0.0,
        )
        acc = acc * rescale + tl.sum(w[:, None] * mo, 0)
        denom = denom * rescale + tl.sum(w, 0)
        m = m_new
    o = acc / tl.maximum(denom, 1e-30)  # padding lane: 0 / 1e-30 = 0
    tl.store(Out + b * stride_ob + h * stride_oh + offs_d, o.to(Out.dtype.element_ty), mask=mask_d)
