"""Merging split-KV decode results: each split's normalised output and log-sum-exp combine into
the final attention output.

Two ways, same math (see decode_attention.py for the layouts):
    `merge_splits`: called by the last split program of a head block inside the stage-1 kernel
        (the fused merge; `fence_gpu` publishes a program's partials before it counts itself);
    `decode_stage2_kernel`: a separate kernel with stage 1's grid, when no arrival counters are
        given.
"""

from __future__ import annotations

from radixlm.kernels._triton import jit, next_power_of_2, pdl_prologue, tl


@jit
def fence_gpu():
    tl.inline_asm_elementwise(
        "fence.acq_rel.gpu; // $0", "=r", [], dtype=tl.int32, is_pure=False, pack=1
    )


@jit
def split_span(seq_len, num_splits, BLOCK_N: tl.constexpr):
    """(split_len, n_valid): the split rule shared by both stages. Split s covers
    [s * split_len, min((s + 1) * split_len, seq_len)) and splits 0..n_valid-1 hold tokens
    (none for a padding lane, seq_len = 0)."""
    split_len = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    n_valid = tl.minimum(tl.cdiv(seq_len, tl.maximum(split_len, 1)), num_splits)
    return split_len, n_valid


@jit
def merge_splits(
    MoRows,
    LseRows,
    OutRows,
    mask_h,
    seq_len,
    num_splits,
    stride_mos,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_S: tl.constexpr,
    CHUNK: tl.constexpr,
):
    """Merge the per-split (output, lse) of a block of heads into their final output.

    MoRows / LseRows / OutRows: [BLOCK_H] pointers to each head's first split / output row.
    BLOCK_S >= num_splits (power of two); CHUNK splits' outputs are loaded at once, so a merge of
    n splits waits for about n / CHUNK memory round trips, not n.
    """
    _, n_valid = split_span(seq_len, num_splits, BLOCK_N)
    offs_s = tl.arange(0, BLOCK_S)
    # NOTE: .cg reads from L2: the partials were written by other SMs in this launch.
    lse_all = tl.load(
        LseRows[:, None] + offs_s[None, :],
        mask=mask_h[:, None] & (offs_s < n_valid)[None, :],
        other=float("-inf"),
        cache_modifier=".cg",
    )
    m = tl.max(lse_all, 1)
    m = tl.where(m == float("-inf"), 0.0, m)  # no split (padding lane, masked head): all -inf
    denom = tl.sum(tl.exp(lse_all - m[:, None]), 1)
    offs_c = tl.arange(0, CHUNK)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = (offs_d < HEAD_DIM)[None, None, :]
    acc = tl.zeros((LseRows.shape[0], BLOCK_D), dtype=tl.float32)
    for s0 in range(0, n_valid, CHUNK):
        splits = s0 + offs_c
        valid = mask_h[:, None] & (splits < n_valid)[None, :]
        lse = tl.load(LseRows[:, None] + splits[None, :], mask=valid, other=float("-inf"),
                      cache_modifier=".cg")  # fmt: skip
        mo_ptrs = MoRows[:, None, None] + splits[None, :, None] * stride_mos + offs_d[None, None, :]
        mo = tl.load(mo_ptrs, mask=valid[:, :, None] & mask_d, other=0.0, cache_modifier=".cg")
        acc += tl.sum(tl.exp(lse - m[:, None])[:, :, None] * mo, 1)
    o = acc / tl.maximum(denom, 1e-30)[:, None]  # no split: 0
    mask = mask_h[:, None] & (offs_d < HEAD_DIM)[None, :]
    tl.store(OutRows[:, None] + offs_d[None, :], o.to(OutRows.dtype.element_ty), mask=mask)


MERGE_VALUES = 16384


def merge_block_sizes(num_splits: int, block_h: int, block_d: int) -> dict[str, int]:
    """BLOCK_S and CHUNK for `merge_splits`: every split's lse in one load, and as many splits'
    outputs per load as fit in MERGE_VALUES fp32 values (16K: the fastest of 4K / 8K / 16K at
    batch 1 on the H200, by 2-11 %)."""
    block_s = next_power_of_2(num_splits)
    return {"BLOCK_S": block_s, "CHUNK": max(1, min(block_s, MERGE_VALUES // (block_h * block_d)))}


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
    GROUP: tl.constexpr,
    HEAD_BLOCKS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_S: tl.constexpr,
    CHUNK: tl.constexpr,
    USE_PDL: tl.constexpr,
    WINDOW: tl.constexpr = 0,
):
    """The merge as its own kernel, grid (B, num_kv_heads * HEAD_BLOCKS) like stage 1
    (`WINDOW`: the sequence a windowed layer attended, its last WINDOW positions)."""
    b = tl.program_id(0)
    kv_h = tl.program_id(1) // HEAD_BLOCKS
    offs_g = (tl.program_id(1) % HEAD_BLOCKS) * BLOCK_H + tl.arange(0, BLOCK_H)
    heads = kv_h * GROUP + offs_g
    pdl_prologue(USE_PDL)
    seq_len = tl.load(SeqLens + b).to(tl.int32)
    if WINDOW > 0:
        seq_len = tl.minimum(seq_len, WINDOW)
    _, n_valid = split_span(seq_len, num_splits, BLOCK_N)
    if n_valid != 1:  # a single split wrote the output itself
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
