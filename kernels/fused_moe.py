"""Fused mixture-of-experts MLP: grouped GEMMs over (token, expert) pairs sorted by expert.

Inputs: x `[T, H]`, w13 `[E, 2I, H]` (expert e's gate rows 0..I-1, up rows I..2I-1), w2 `[E, H, I]`,
topk_weights `[T, k]`, topk_ids `[T, k]` (the router's choice). Output `[T, H]` =
sum_k topk_weights[t, k] * w2[e] @ (silu(w13[e, :I] @ x_t) * (w13[e, I:] @ x_t)), e = topk_ids[t, k].

1. `align_pairs` (moe_align.py, Triton, no host sync): the T*k pairs p = t*k + j sorted by expert,
   each expert's group padded to a multiple of BLOCK_M with the sentinel T*k, and the expert of
   every BLOCK_M block (-1 past the last group). The buffer has a worst-case length, so grids
   depend only on shapes.
2. `_moe_gemm_kernel` with GATED=True: per (block, N tile) the gate and up tiles of one expert
   against the block's token rows, `silu(gate) * up` in the epilogue -> `act [T*k, I]` (pair rows).
3. The same kernel with GATED=False: `act @ w2[e]^T` times the pair's routing weight -> `[T*k, H]`,
   then a sum over the k pairs of each token (torch).
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

from radixlm.kernels._triton import cdiv, dot_flags, interpreting, jit, mma, require_triton, tl
from radixlm.kernels.fused_moe_gemv import (
    GEMV_CANDIDATES,
    GEMV_INTERPRET_CONFIG,
    GEMV_MAX_PAIRS,
    MoEGemvConfig,
    fused_moe_gemv,
)
from radixlm.kernels.moe_align import align_pairs


class MoEConfig(NamedTuple):
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


# Candidates timed at start-up (GPU): small blocks for decode (few pairs per expert), large for
# prefill. NOTE: (64, 256, 64, 8, 3) was the fastest of 20 configs for both GEMMs at 4096 tokens
# of Qwen3-30B-A3B on an H100 (run 59, docs/benchmarks.md).
CANDIDATES = (
    MoEConfig(16, 64, 128, 4, 3),
    MoEConfig(16, 128, 128, 4, 3),
    MoEConfig(32, 64, 64, 4, 4),
    MoEConfig(64, 128, 64, 4, 3),
    MoEConfig(128, 128, 64, 8, 3),
    MoEConfig(64, 256, 64, 8, 3),
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
    stride_am,
    stride_we,
    stride_wn,
    stride_om,
    TOP_K: tl.constexpr,
    A_PER_TOKEN: tl.constexpr,
    GATED: tl.constexpr,
    WEIGHTED: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PREC: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """Out[pair, n] for the BLOCK_M pairs of one block (one expert) and one N tile. A rows: the
    pair's token (A_PER_TOKEN: x) or the pair itself (act).

    # NOTE: the N tiles of a block are consecutive programs, so they run together and read the
    # block's A rows from L2 once; the blocks of one expert are neighbours too and share its weight
    # tiles. With the block index fastest, the down GEMM re-read all of `act` (50 MB at 4096
    # tokens of Qwen3-30B-A3B, more than L2) from HBM once per N tile.
    """
    pid = tl.program_id(0)
    n_tiles = tl.cdiv(N, BLOCK_N)
    pid_m = pid // n_tiles
    pid_n = pid % n_tiles
    e = tl.load(BlockExpert + pid_m).to(tl.int64)
    if e >= 0:
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        pairs = tl.load(SortedPairs + offs_m)
        valid = pairs < num_pairs
        rows = pairs
        if A_PER_TOKEN:  # x: the pair's token row
            rows = pairs // TOP_K
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        mask_n = offs_n < N
        offs_k = tl.arange(0, BLOCK_K)
        a_ptrs = A + rows[:, None].to(tl.int64) * stride_am + offs_k[None, :]
        w_base = W + e * stride_we + offs_k[:, None]
        w_ptrs = w_base + offs_n[None, :].to(tl.int64) * stride_wn
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        if GATED:  # the up rows sit N rows below the gate rows
            u_ptrs = w_base + (offs_n + N)[None, :].to(tl.int64) * stride_wn
            acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            mask_k = offs_k < K - k0
            a = tl.load(a_ptrs, mask=valid[:, None] & mask_k[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
            acc += mma(a, w, PREC, UPCAST)
            if GATED:
                u = tl.load(u_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
                acc_u += mma(a, u, PREC, UPCAST)
                u_ptrs += BLOCK_K
            a_ptrs += BLOCK_K
            w_ptrs += BLOCK_K
        out_ty = Out.dtype.element_ty
        if GATED:  # silu(gate) * up, rounded like the torch expression in the output dtype
            g = acc.to(out_ty).to(tl.float32)
            # NOTE: the product in fp32 of the two rounded factors, then rounded: what a 16-bit
            # torch multiply does (and the interpreter cannot multiply bf16 itself).
            act = (g / (1.0 + tl.exp(-g))).to(out_ty).to(tl.float32)
            res = (act * acc_u.to(out_ty).to(tl.float32)).to(out_ty)
        else:
            res = acc
            if WEIGHTED:
                wt = tl.load(TopkWeights + pairs, mask=valid, other=0.0).to(tl.float32)
                res = res.to(out_ty).to(tl.float32) * wt[:, None]
            res = res.to(out_ty)
        o_ptrs = Out + pairs[:, None].to(tl.int64) * stride_om + offs_n[None, :]
        tl.store(o_ptrs, res, mask=valid[:, None] & mask_n[None, :])


def fused_moe(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    config: MoEConfig | MoEGemvConfig | None = None,
) -> torch.Tensor:
    """Triton fused MoE (see the module docstring); same math as `fused_moe_torch`."""
    require_triton()
    t, h = x.shape
    e, two_i, _ = w13.shape
    inter = two_i // 2
    k = topk_ids.shape[1]
    n = t * k
    if n == 0:
        return torch.zeros_like(x)
    cfg = config or moe_config(n)
    assert x.stride(1) == 1 and w13.stride(2) == 1 and w2.stride(2) == 1
    if isinstance(cfg, MoEGemvConfig):
        return fused_moe_gemv(x, w13, w2, topk_weights, topk_ids, cfg)
    sorted_pairs, block_expert = align_pairs(topk_ids, e, cfg.block_m)
    blocks = block_expert.numel()
    act = torch.empty(n, inter, dtype=x.dtype, device=x.device)
    flags = dot_flags(x.dtype)
    common = {
        "TOP_K": k,
        "BLOCK_M": cfg.block_m,
        "BLOCK_N": cfg.block_n,
        "BLOCK_K": cfg.block_k,
        "num_warps": cfg.num_warps,
        "num_stages": cfg.num_stages,
        **flags,
    }
    _moe_gemm_kernel[(blocks * cdiv(inter, cfg.block_n),)](
        *(x, w13, act, sorted_pairs, block_expert, topk_weights, n, inter, h),
        *(x.stride(0), w13.stride(0), w13.stride(1), act.stride(0)),
        A_PER_TOKEN=True,
        GATED=True,
        WEIGHTED=False,
        **common,
    )
    out = torch.empty(n, h, dtype=x.dtype, device=x.device)
    weights = topk_weights.reshape(-1).contiguous()
    _moe_gemm_kernel[(blocks * cdiv(h, cfg.block_n),)](
        *(act, w2, out, sorted_pairs, block_expert, weights, n, h, inter),
        *(act.stride(0), w2.stride(0), w2.stride(1), out.stride(0)),
        A_PER_TOKEN=False,
        GATED=False,
        WEIGHTED=True,
        **common,
    )
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
