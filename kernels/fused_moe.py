"""Fused mixture-of-experts MLP: grouped GEMMs over (token, expert) pairs sorted by expert.

Inputs: x `[T, H]`, w13 `[E, 2I, H]` (expert e's gate rows 0..I-1, up rows I..2I-1), w2 `[E, H, I]`,
topk_weights `[T, k]`, topk_ids `[T, k]` (the router's choice). Output `[T, H]` =
sum_k topk_weights[t, k] * w2[e] @ (silu(w13[e, :I] @ x_t) * (w13[e, I:] @ x_t)), e = topk_ids[t, k].

1. `align_pairs` (moe_align.py, Triton, no host sync): the T*k pairs p = t*k + j sorted by expert,
   each expert's group padded to a multiple of BLOCK_M with the sentinel T*k, and the expert of
   every BLOCK_M block (-1 past the last group). The buffer has a worst-case length, so grids
   depend only on shapes.
2. `_moe_gemm_kernel` with GATED=True: per (block, N tile) the gate and up tiles of one expert
   against the block's token rows, `silu(gate) * up` in the epilogue -> `act [L, I]` (slot rows:
   sorted, so each block's rows are contiguous).
3. The same kernel with GATED=False: `act @ w2[e]^T` times the pair's routing weight -> `[T*k, H]`
   (pair rows), then a sum over the k pairs of each token (torch).
On Hopper the weight tiles (and down's act tiles) come through TMA tensor descriptors
(`tma_enabled`); x's rows, gathered by token, through pointers.
`fused_moe_ref` (runtime/models/moe.py: `fused_moe_torch`) is the reference; CPU runs that.
A few tokens (decode) take the sorting-free GEMV path instead (fused_moe_gemv.py): the config's
type picks the path (`MoEGemvConfig` vs `MoEConfig`).
Launch configs: `moe_config(m, ...)` by batch bucket; `select_moe_config` times the candidates
(both paths where T * k <= `GEMV_MAX_PAIRS`) on the GPU at start-up for one layer shape, each
replayed from a CUDA graph as a decode step runs it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from radixlm.kernels._triton import (
    cdiv,
    dot_flags,
    interpreting,
    jit,
    mma,
    require_triton,
    tl,
    tma_enabled,
)
from radixlm.kernels.fused_moe_gemv import (
    GEMV_CANDIDATES,
    GEMV_INTERPRET_CONFIG,
    GEMV_MAX_PAIRS,
    MoEGemvConfig,
    fused_moe_gemv,
)
from radixlm.kernels.moe_align import align_pairs


class MoEConfig(NamedTuple):
    """Tiles of the sorted path: gate_up's (block_n, block_k, num_warps, num_stages) and, in
    `down`, the down GEMM's (None: the same); block_m (the pairs' padding) is shared."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    down: tuple[int, int, int, int] | None = None


# Candidates timed at start-up (GPU): small blocks for decode (few pairs per expert), large for
# prefill. NOTE: the last was the fastest of those timed at 4096 and 8192 tokens of
# Qwen3-30B-A3B on an H100 with TMA weight loads (run 62, docs/benchmarks.md).
CANDIDATES = (
    MoEConfig(16, 64, 128, 4, 3),
    MoEConfig(16, 128, 128, 4, 3),
    MoEConfig(32, 64, 64, 4, 4),
    MoEConfig(64, 128, 64, 4, 3),
    MoEConfig(128, 128, 64, 8, 3),
    MoEConfig(64, 256, 64, 8, 3),
    MoEConfig(128, 128, 64, 8, 4, down=(256, 64, 8, 4)),
)
INTERPRET_CONFIG = MoEConfig(16, 16, 32, 4, 1)


SMALL_PAIRS = 32  # default (untimed) choice of the GEMV path: T * k up to this


def moe_config(pairs: int) -> MoEConfig | MoEGemvConfig:
    """Default config for `pairs` = T * k (before start-up selection)."""
    if interpreting() or not torch.cuda.is_available():
        return GEMV_INTERPRET_CONFIG if pairs <= SMALL_PAIRS else INTERPRET_CONFIG
    if pairs <= SMALL_PAIRS:
        return GEMV_CANDIDATES[0]
    if pairs <= 64:
        return CANDIDATES[0]
    if pairs <= 1024:
        return CANDIDATES[2]
    return CANDIDATES[4]


@jit
def _moe_gemm_kernel(
    A,
    W,
    Out,
    SortedPairs,
    BlockExpert,
    TopkWeights,
    num_pairs,
    N,
    K,
    rows_per_expert,
    stride_am,
    stride_wn,
    stride_om,
    TOP_K: tl.constexpr,
    GATED: tl.constexpr,
    TMA: tl.constexpr,
    A_TMA: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PREC: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """One block of BLOCK_M slots (one expert's pairs) x one N tile.
    GATED (gate_up): A = x, row = the pair's token; `silu(gate) * up` -> Out (act) at the slot.
    else (down): A = act, row = the slot; times the pair's routing weight -> Out at the pair.
    W: the expert weights `[E * rows_per_expert, K]` (gate rows, then up rows N below them), a
    pointer, or with TMA a tensor descriptor: of [BLOCK_N, BLOCK_K] tiles (down), of
    [2, BLOCK_N, BLOCK_K] tiles over the view `[E * 2, N, K]` (gate_up: expert e's gate tile and
    up tile in one load, then one dot of 2 * BLOCK_N columns: 2-3 % faster than two dots at 4096
    and 8192 tokens of Qwen3-30B-A3B on an H100, runs 67-68). A_TMA (TMA and down): A
    (contiguous slots) is a descriptor of [BLOCK_M, BLOCK_K] tiles too.

    # NOTE: the N tiles of a block are consecutive programs, so they run together and read the
    # block's A rows from L2 once; the blocks of one expert are neighbours too and share its weight
    # tiles. With the block index fastest, the down GEMM re-read all of `act` (50 MB at 4096
    # tokens of Qwen3-30B-A3B, more than L2) from HBM once per N tile.
    # NOTE: a down TMA tile past an expert's N rows reads the next expert's rows (or zeros past
    # the last), a gate_up one zeros: they only reach output columns >= N, never stored. gate_up
    # writes zeros into its blocks' padding slots, which the down GEMM reads with TMA (into
    # padding rows).
    """
    pid = tl.program_id(0)
    n_tiles = tl.cdiv(N, BLOCK_N)
    pid_m = pid // n_tiles
    pid_n = pid % n_tiles
    e = tl.load(BlockExpert + pid_m)
    if e >= 0:
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        pairs = tl.load(SortedPairs + offs_m)
        valid = pairs < num_pairs
        rows = offs_m
        if GATED:  # x: the pair's token row
            rows = pairs // TOP_K
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        mask_n = offs_n < N
        offs_k = tl.arange(0, BLOCK_K)
        w_row = e.to(tl.int64) * rows_per_expert + pid_n * BLOCK_N
        if not A_TMA:
            a_ptrs = A + rows[:, None].to(tl.int64) * stride_am + offs_k[None, :]
        if not TMA:
            cols = tl.arange(0, BLOCK_N)[None, :].to(tl.int64)  # the tile's weight rows
            w_ptrs = W + (w_row + cols) * stride_wn + offs_k[:, None]
            u_ptrs = w_ptrs + N * stride_wn  # GATED: the up rows
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        acc_gu = tl.zeros([BLOCK_M, 2 * BLOCK_N], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            mask_k = offs_k < K - k0
            if A_TMA:
                a = A.load([pid_m * BLOCK_M, k0])
            else:
                a = tl.load(a_ptrs, mask=valid[:, None] & mask_k[None, :], other=0.0)
                a_ptrs += BLOCK_K
            if GATED and TMA:  # the gate and up tiles in one load, one dot of 2 * BLOCK_N
                wu = tl.reshape(W.load([2 * e, pid_n * BLOCK_N, k0]), [2 * BLOCK_N, BLOCK_K])
                acc_gu += mma(a, tl.trans(wu), PREC, UPCAST)
            else:
                if TMA:
                    w = tl.trans(W.load([w_row.to(tl.int32), k0]))
                else:
                    w = tl.load(w_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
                    w_ptrs += BLOCK_K
                acc += mma(a, w, PREC, UPCAST)
                if GATED:
                    u = tl.load(u_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
                    u_ptrs += BLOCK_K
                    acc_u += mma(a, u, PREC, UPCAST)
        if GATED and TMA:  # columns [gate | up] -> the two accumulators
            gu = tl.permute(tl.reshape(acc_gu, [BLOCK_M, 2, BLOCK_N]), (0, 2, 1))
            acc, acc_u = tl.split(gu)
        out_ty = Out.dtype.element_ty
        if GATED:  # silu(gate) * up, rounded like the torch expression in the output dtype
            g = acc.to(out_ty).to(tl.float32)
            # NOTE: the product in fp32 of the two rounded factors, then rounded: what a 16-bit
            # torch multiply does (and the interpreter cannot multiply bf16 itself).
            act = (g / (1.0 + tl.exp(-g))).to(out_ty).to(tl.float32)
            res = (act * acc_u.to(out_ty).to(tl.float32)).to(out_ty)
            out_rows = offs_m
            keep = offs_m >= 0  # NOTE: padding slots too (zeros: their A rows were masked)
        else:
            wt = tl.load(TopkWeights + pairs, mask=valid, other=0.0).to(tl.float32)
            res = (acc.to(out_ty).to(tl.float32) * wt[:, None]).to(out_ty)
            out_rows = pairs
            keep = valid
        o_ptrs = Out + out_rows[:, None].to(tl.int64) * stride_om + offs_n[None, :]
        tl.store(o_ptrs, res, mask=keep[:, None] & mask_n[None, :])


def _tiles(cfg: MoEConfig, gated: bool) -> tuple[int, int, int, int]:
    """(block_n, block_k, num_warps, num_stages) of one GEMM."""
    if gated or cfg.down is None:
        return cfg.block_n, cfg.block_k, cfg.num_warps, cfg.num_stages
    return cfg.down


def _gemm(
    a: torch.Tensor,
    w: torch.Tensor,
    out: torch.Tensor,
    routing: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    cfg: MoEConfig,
    top_k: int,
    gated: bool,
    tma: bool,
) -> None:
    """One grouped GEMM (see `_moe_gemm_kernel`) of `a` against the experts' `w` `[E, R, K]`."""
    sorted_pairs, block_expert, weights = routing
    experts, rows, k = w.shape
    n = rows // 2 if gated else rows
    block_n, block_k, warps, stages = _tiles(cfg, gated)
    w2d = w.view(experts * rows, k)
    if tma:  # NOTE: host-side descriptors: passed by value, so a CUDA graph keeps them
        from triton.tools.tensor_descriptor import TensorDescriptor

        if gated:
            w_arg = TensorDescriptor.from_tensor(w.view(experts * 2, n, k), [2, block_n, block_k])
        else:
            w_arg = TensorDescriptor.from_tensor(w2d, [block_n, block_k])
        a_arg = a if gated else TensorDescriptor.from_tensor(a, [cfg.block_m, block_k])
    else:
        w_arg, a_arg = w2d, a
    grid = (block_expert.numel() * cdiv(n, block_n),)
    _moe_gemm_kernel[grid](
        *(a_arg, w_arg, out, sorted_pairs, block_expert, weights, weights.numel(), n, k, rows),
        *(a.stride(0), k, out.stride(0)),
        TOP_K=top_k,
        GATED=gated,
        TMA=tma,
        A_TMA=tma and not gated,
        BLOCK_M=cfg.block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        num_warps=warps,
        num_stages=stages,
        **dot_flags(a.dtype),
    )


def fused_moe(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    config: MoEConfig | MoEGemvConfig | None = None,
    tma: bool | None = None,
) -> torch.Tensor:
    """Triton fused MoE (see the module docstring); same math as `fused_moe_torch`. `tma`: load
    the weight tiles (and down's A) through tensor descriptors; None: where the device has TMA."""
    require_triton()
    t, h = x.shape
    e, two_i, _ = w13.shape
    k = topk_ids.shape[1]
    n = t * k
    if n == 0:
        return torch.zeros_like(x)
    cfg = config or moe_config(n)
    assert x.stride(1) == 1 and w13.is_contiguous() and w2.is_contiguous()
    if isinstance(cfg, MoEGemvConfig):
        return fused_moe_gemv(x, w13, w2, topk_weights, topk_ids, cfg)
    if tma is None:  # NOTE: a descriptor's row stride must be a multiple of 16 bytes
        tma = tma_enabled(x.device) and (h * x.element_size()) % 16 == 0
        tma = tma and (two_i // 2 * x.element_size()) % 16 == 0
    sorted_pairs, block_expert = align_pairs(topk_ids, e, cfg.block_m)
    routing = (sorted_pairs, block_expert, topk_weights.reshape(-1).contiguous())
    # NOTE: act rows are slots (sorted, padded): the down GEMM reads its blocks contiguously
    act = torch.empty(sorted_pairs.numel(), two_i // 2, dtype=x.dtype, device=x.device)
    _gemm(x, w13, act, routing, cfg, k, gated=True, tma=tma)
    out = torch.empty(n, h, dtype=x.dtype, device=x.device)
    _gemm(act, w2, out, routing, cfg, k, gated=False, tma=tma)
    return out.view(t, k, h).sum(dim=1)


def select_moe_config(
    hidden: int, inter: int, experts: int, top_k: int, tokens: int, dtype: torch.dtype
) -> MoEConfig | MoEGemvConfig:
    """The fastest config for this layer shape at `tokens` tokens (GPU, timed once at start-up on
    random weights; ties keep the earlier candidate): the GEMV path's candidates first where
    tokens * top_k <= GEMV_MAX_PAIRS, then the sorted grouped GEMM's."""
    dev = torch.device("cuda")
    x = torch.randn(tokens, hidden, device=dev, dtype=dtype)
    w13 = torch.randn(experts, 2 * inter, hidden, device=dev, dtype=dtype) * 0.02
    w2 = torch.randn(experts, hidden, inter, device=dev, dtype=dtype) * 0.02
    ids = torch.stack([torch.randperm(experts, device=dev)[:top_k] for _ in range(tokens)])
    weights = torch.full((tokens, top_k), 1.0 / top_k, device=dev, dtype=dtype)
    small = GEMV_CANDIDATES if tokens * top_k <= GEMV_MAX_PAIRS else ()
    best: MoEConfig | MoEGemvConfig = CANDIDATES[0]
    best_ms = float("inf")
    for cfg in (*small, *CANDIDATES):
        try:
            ms = time_moe_ms(lambda cfg=cfg: fused_moe(x, w13, w2, weights, ids, cfg))
        except Exception:  # a config this device cannot run
            continue
        if ms < best_ms:
            best, best_ms = cfg, ms
    return best


def time_moe_ms(fn: Callable[[], object], calls: int = 5, rounds: int = 3) -> float:
    """GPU milliseconds of one `fn()`, replayed from a CUDA graph of `calls` calls (as a decode
    step replays it: no launch overhead), best of `rounds`."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # compile and warm up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(calls):
            fn()
    graph.replay()
    best = float("inf")
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / calls)
    return best
