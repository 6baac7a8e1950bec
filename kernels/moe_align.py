"""Sort the (token, expert) pairs of a MoE layer by expert, for the grouped GEMMs of fused_moe.py.

Input: topk_ids `[T, k]` (the router's experts). Pair p = t * k + j. Output:
- sorted_pairs `[L]` int32: the pairs grouped by expert (stable: ascending p within a group), each
  group padded to a multiple of BLOCK_M with the sentinel T * k;
- block_expert `[L / BLOCK_M]` int32: the expert of each BLOCK_M block, -1 past the last group.
L = T*k + min(T*k, E) * (BLOCK_M - 1), rounded up to BLOCK_M: the worst case, so that grids depend
only on shapes (graph-capturable, no host sync).

Three Triton launches (and one fill) instead of a dozen torch ops:
1. `_count_kernel`, one program per chunk of pairs: the chunk's count per expert (a one-hot sum).
2. `_offsets_kernel`, one program: each expert's padded start (a cumsum over experts), each
   chunk's first slot per expert (a cumsum over chunks), and block_expert.
3. `_place_kernel`, one program per chunk: a pair's slot = its chunk's slot for its expert + the
   pairs of that expert before it in the chunk (a one-hot cumsum).
`align_pairs_ref` is the torch reference (argsort), used by the tests.
"""

from __future__ import annotations

import torch

from radixlm.kernels._triton import cdiv, jit, require_triton, tl, triton

MAX_CHUNKS = 128  # programs of the count / place kernels; `_offsets_kernel` loads them all at once
ONE_HOT_ELEMENTS = 32768  # a sub-chunk's one-hot tile: SUB pairs x E_POW2 experts


def _chunking(n: int, experts_pow2: int) -> tuple[int, int, int]:
    """(sub, chunk, chunks): pairs per one-hot tile, per program (a multiple of sub), programs."""
    sub = max(16, min(1024, ONE_HOT_ELEMENTS // experts_pow2))
    chunk = max(sub, triton.next_power_of_2(cdiv(n, MAX_CHUNKS)))
    return sub, chunk, cdiv(n, chunk)


@jit
def _count_kernel(Ids, Counts, n, E_POW2: tl.constexpr, CHUNK: tl.constexpr, SUB: tl.constexpr):
    """Counts[c, e] = pairs of chunk c routed to expert e."""
    c = tl.program_id(0)
    experts = tl.arange(0, E_POW2)
    total = tl.zeros([E_POW2], dtype=tl.int32)
    for s in range(0, CHUNK, SUB):
        offs = c * CHUNK + s + tl.arange(0, SUB)
        ids = tl.load(Ids + offs, mask=offs < n, other=-1).to(tl.int32)
        total += tl.sum((ids[:, None] == experts[None, :]).to(tl.int32), axis=0)
    tl.store(Counts + c * E_POW2 + experts, total)


@jit
def _offsets_kernel(
    Counts,
    Offsets,
    BlockExpert,
    chunks,
    num_blocks,
    E: tl.constexpr,
    E_POW2: tl.constexpr,
    CHUNKS_POW2: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCKS: tl.constexpr,
):
    """Offsets[c, e] = the slot of chunk c's first pair of expert e; BlockExpert."""
    experts = tl.arange(0, E_POW2)
    rows = tl.arange(0, CHUNKS_POW2)
    idx = rows[:, None] * E_POW2 + experts[None, :]
    counts = tl.load(Counts + idx, mask=(rows < chunks)[:, None], other=0)
    total = tl.sum(counts, axis=0)
    padded = (total + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, 0)  # NOTE: bins E..E_POW2-1 are empty: their ends equal the last
    starts = ends - padded
    before = tl.cumsum(counts, 0) - counts  # earlier chunks' pairs, per expert
    tl.store(Offsets + idx, starts[None, :] + before, mask=(rows < chunks)[:, None])
    for b0 in range(0, num_blocks, BLOCKS):
        blocks = b0 + tl.arange(0, BLOCKS)
        first = blocks * BLOCK_M
        # the expert whose group holds slot `first`: how many groups end at or before it
        e = tl.sum((ends[None, :] <= first[:, None]).to(tl.int32), axis=1)
        tl.store(BlockExpert + blocks, tl.where(e < E, e, -1), mask=blocks < num_blocks)


@jit
def _place_kernel(
    Ids, Offsets, SortedPairs, n, E_POW2: tl.constexpr, CHUNK: tl.constexpr, SUB: tl.constexpr
):
    """SortedPairs[slot of p] = p for the pairs of chunk program_id(0)."""
    c = tl.program_id(0)
    experts = tl.arange(0, E_POW2)
    slot = tl.load(Offsets + c * E_POW2 + experts)  # the next free slot of each expert
    for s in range(0, CHUNK, SUB):
        offs = c * CHUNK + s + tl.arange(0, SUB)
        ids = tl.load(Ids + offs, mask=offs < n, other=-1).to(tl.int32)
        hits = (ids[:, None] == experts[None, :]).to(tl.int32)
        earlier = tl.cumsum(hits, 0) - hits  # same-expert pairs before this one in the tile
        dest = tl.sum((slot[None, :] + earlier) * hits, axis=1)
        tl.store(SortedPairs + dest, offs.to(tl.int32), mask=offs < n)
        slot += tl.sum(hits, axis=0)


def aligned_length(pairs: int, num_experts: int, block_m: int) -> int:
    """L: the worst-case length of sorted_pairs (every busy expert's group padded)."""
    return cdiv(pairs + min(pairs, num_experts) * (block_m - 1), block_m) * block_m


def align_pairs(
    topk_ids: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sorted_pairs `[L]` int32, block_expert `[L / block_m]` int32): see the module docstring."""
    require_triton()
    ids = topk_ids.reshape(-1)
    n = ids.numel()
    dev = ids.device
    e_pow2 = triton.next_power_of_2(num_experts)
    sub, chunk, chunks = _chunking(n, e_pow2)
    length = aligned_length(n, num_experts, block_m)
    sorted_pairs = torch.full((length,), n, dtype=torch.int32, device=dev)
    block_expert = torch.empty(length // block_m, dtype=torch.int32, device=dev)
    counts = torch.empty(chunks, e_pow2, dtype=torch.int32, device=dev)
    offsets = torch.empty_like(counts)
    _count_kernel[(chunks,)](ids, counts, n, E_POW2=e_pow2, CHUNK=chunk, SUB=sub, num_warps=4)
    _offsets_kernel[(1,)](
        *(counts, offsets, block_expert, chunks, block_expert.numel()),
        E=num_experts,
        E_POW2=e_pow2,
        CHUNKS_POW2=triton.next_power_of_2(chunks),
        BLOCK_M=block_m,
        BLOCKS=max(16, ONE_HOT_ELEMENTS // e_pow2 // 4),
        num_warps=4,
    )
    _place_kernel[(chunks,)](
        ids, offsets, sorted_pairs, n, E_POW2=e_pow2, CHUNK=chunk, SUB=sub, num_warps=4
    )
    return sorted_pairs, block_expert


def align_pairs_ref(
    topk_ids: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch reference of `align_pairs` (a stable argsort; same outputs)."""
    flat = topk_ids.reshape(-1).to(torch.int64)
    n = flat.numel()
    counts = torch.bincount(flat, minlength=num_experts)
    padded = (counts + block_m - 1) // block_m * block_m
    ends = torch.cumsum(padded, 0)
    order = torch.argsort(flat, stable=True)
    expert = flat[order]
    rank = torch.arange(n, device=flat.device) - (torch.cumsum(counts, 0) - counts)[expert]
    length = aligned_length(n, num_experts, block_m)
    sorted_pairs = torch.full((length,), n, dtype=torch.int32, device=flat.device)
    sorted_pairs[(ends - padded)[expert] + rank] = order.to(torch.int32)
    block_start = torch.arange(0, length, block_m, device=flat.device)
    block_expert = torch.searchsorted(ends, block_start, right=True)
    block_expert = torch.where(block_expert < num_experts, block_expert, -1).to(torch.int32)
    return sorted_pairs, block_expert
