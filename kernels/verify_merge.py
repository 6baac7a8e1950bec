"""Stage 2 of tree verify attention (verify_attention.py): merge each row's per-split outputs
with `decode_merge.merge_splits`, for the requests whose prefix stage 1 split (more than one
split holds keys); the others stage 1 wrote directly.

Grid (B, num_kv_heads * M_BLOCKS) like stage 1's without the splits; rows m = node * GROUP + g
of one kv head's block, as there.
"""

from __future__ import annotations

from radixlm.kernels._triton import jit, tl
from radixlm.kernels.decode_merge import merge_splits, split_span


@jit
def verify_stage2_kernel(
    MidO,
    MidLse,
    PrefixLens,
    Out,
    num_splits,
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
    BLOCK_S: tl.constexpr,
    CHUNK: tl.constexpr,
    WINDOW: tl.constexpr,
):
    b = tl.program_id(0)
    kv_h = tl.program_id(1) // M_BLOCKS
    offs_m = (tl.program_id(1) % M_BLOCKS) * BLOCK_M + tl.arange(0, BLOCK_M)
    prefix = tl.load(PrefixLens + b).to(tl.int32)
    if WINDOW > 0:
        prefix = tl.minimum(prefix, WINDOW - 1)  # the span stage 1 split
    _, n_valid = split_span(prefix, num_splits, BLOCK_N)
    if n_valid > 1:  # else stage 1 wrote the output itself
        rows = (b * NODES + offs_m // GROUP).to(tl.int64)
        heads = kv_h * GROUP + offs_m % GROUP
        merge_splits(
            MidO + rows * stride_mor + heads * stride_moh,
            MidLse + rows * stride_mlr + heads * stride_mlh,
            Out + rows * stride_or + heads * stride_oh,
            offs_m < NODES * GROUP,
            prefix,
            num_splits,
            stride_mos,
            HEAD_DIM,
            BLOCK_D,
            BLOCK_N,
            BLOCK_S,
            CHUNK,
        )
