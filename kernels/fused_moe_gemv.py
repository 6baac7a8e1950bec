"""Fused MoE for a handful of tokens (decode): two GEMV-style kernels, no sorting.

At T * top_k <= a few dozen (token, expert) pairs the grouped GEMM of fused_moe.py wastes its
tiles (a BLOCK_M block per expert holding one real row) and its sort takes a dozen small launches;
what bounds the step is reading the routed experts' weights once. Here every weight row is read by
exactly one program, in long contiguous [BLOCK_N, BLOCK_K] tiles, and only the routed experts'
rows are read:

1. `_moe_gemv_gate_up_kernel`, grid (T * k pairs, cdiv(I, BLOCK_N)): program (p, j) reads the
   gate and up rows j*BLOCK_N.. of expert ids[p] against x[p // k] and stores
   `silu(gate) * up` -> act `[T * k, I]` (the rounding of fused_moe.py's gated epilogue).
2. `_moe_gemv_down_kernel`, grid (T, cdiv(H, BLOCK_N)): program (t, j) reads rows j*BLOCK_N..
   of token t's k experts' down projections as one [k, BLOCK_N, BLOCK_K] tile against their act
   rows, scales each product (rounded to the dtype) by the routing weight and sums the k of them
   in fp32 -> out `[T, H]` (no [T * k, H] intermediate, no separate sum, no atomics:
   deterministic).
Two launches in all, no host sync, grids fixed by T: capturable in CUDA graphs. On Hopper both are
launched with programmatic dependent launch (kernels/_triton.py `pdl_enabled`): the down kernel's
programs start while gate_up's last wave drains and load their first weight tile before waiting. A pair whose
expert is shared with another token's pair reads that expert again: above a few tokens the sorted
grouped GEMM wins, which the start-up timing (`fused_moe.select_moe_config`) decides.
Inputs and reference: see fused_moe.py (`fused_moe_torch` in runtime/models/moe.py).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from radixlm.kernels._triton import (
    cdiv,
    gdc_launch_dependents,
    gdc_wait,
    jit,
    next_power_of_2,
    pdl_launch_args,
    pdl_prologue,
    tl,
)


class MoEGemvConfig(NamedTuple):
    """Launch parameters of the two kernels (each tuned on its own: their shapes differ)."""

    block_n: int  # gate_up: output features per program
    block_k: int  # gate_up: reduction tile (long: few loop trips, many bytes in flight)
    num_warps: int
    down_block_n: int  # the same three for the down kernel
    down_block_k: int
    down_num_warps: int


# Candidates timed at start-up for the small-T buckets (GPU); small BLOCK_N = many programs, as the
# dense GEMV (kernels/gemv.py) found best for decode-sized reads. On an H200 (2026-12-02, Qwen3-30B-A3B
# experts, bf16, CUDA-graph replay, weights cold; one smoke run, not a published number): at T = 1
# gate_up (4, 1024, 2) and down (2, 1024, 4) were the fastest of 36 configs each; (16, 256, 8) for
# both kernels at T = 4 to 16.
GEMV_CANDIDATES = (
    MoEGemvConfig(4, 1024, 2, 2, 1024, 4),
    MoEGemvConfig(2, 1024, 4, 2, 1024, 4),
    MoEGemvConfig(16, 256, 8, 16, 256, 8),
    MoEGemvConfig(4, 512, 4, 4, 512, 4),
    MoEGemvConfig(8, 1024, 2, 1, 1024, 2),
    MoEGemvConfig(4, 1024, 2, 1, 1024, 4),
    MoEGemvConfig(4, 1024, 4, 4, 1024, 8),
)
GEMV_INTERPRET_CONFIG = MoEGemvConfig(16, 32, 4, 16, 32, 4)
GEMV_MAX_PAIRS = 128  # T * k above this: the sorted grouped GEMM only


@jit
def _moe_gemv_gate_up_kernel(
    X,
    W13,
    Act,
    Ids,
    N,
    K,
    stride_xt,
    stride_we,
    stride_wn,
    stride_at,
    TOP_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    # NOTE: x and the routed ids may come from the kernel just before: wait for it first.
    pdl_prologue(USE_PDL)
    p = tl.program_id(0).to(tl.int64)
    pid_n = tl.program_id(1)
    t = p // TOP_K
    e = tl.load(Ids + p).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    g_ptrs = W13 + e * stride_we + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    u_ptrs = g_ptrs + N * stride_wn  # the up rows sit N rows below the gate rows
    x_ptrs = X + t * stride_xt + offs_k
    acc_g = tl.zeros([BLOCK_N], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        mask_k = offs_k < K - k0
        mask = mask_n[:, None] & mask_k[None, :]
        xv = tl.load(x_ptrs, mask=mask_k, other=0.0).to(tl.float32)
        g = tl.load(g_ptrs, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(u_ptrs, mask=mask, other=0.0).to(tl.float32)
        acc_g += tl.sum(g * xv[None, :], axis=1)
        acc_u += tl.sum(u * xv[None, :], axis=1)
        x_ptrs += BLOCK_K
        g_ptrs += BLOCK_K
        u_ptrs += BLOCK_K
    out_ty = Act.dtype.element_ty
    # NOTE: fused_moe.py's gated epilogue: gate and up rounded, silu rounded, product rounded.
    g = acc_g.to(out_ty).to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(out_ty).to(tl.float32)
    res = (act * acc_u.to(out_ty).to(tl.float32)).to(out_ty)
    tl.store(Act + p * stride_at + offs_n, res, mask=mask_n)


@jit
def _moe_gemv_down_kernel(
    Act,
    W2,
    Out,
    Ids,
    TopkWeights,
    N,
    K,
    stride_at,
    stride_we,
    stride_wn,
    stride_ot,
    TOP_K: tl.constexpr,
    TOP_K_P2: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """Program (t, j): rows j*BLOCK_N.. of token t's k experts as one [k, BLOCK_N, BLOCK_K] tile
    per step, so that all k experts' weight loads are in flight together. With PDL the first
    tile is loaded before waiting for the gate_up kernel (the ids and weights it reads were
    written before that kernel started); only `Act` is read after the wait."""
    t = tl.program_id(0).to(tl.int64)
    pid_n = tl.program_id(1)
    offs_j = tl.arange(0, TOP_K_P2)
    mask_j = offs_j < TOP_K
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    p = t * TOP_K + offs_j
    e = tl.load(Ids + p, mask=mask_j, other=0).to(tl.int64)
    wt = tl.load(TopkWeights + p, mask=mask_j, other=0.0).to(tl.float32)
    w_ptrs = (
        W2
        + e[:, None, None] * stride_we
        + offs_n[None, :, None].to(tl.int64) * stride_wn
        + offs_k[None, None, :]
    )
    mask_jn = mask_j[:, None, None] & mask_n[None, :, None]
    w = tl.load(w_ptrs, mask=mask_jn & (offs_k < K)[None, None, :], other=0.0)
    if USE_PDL:
        gdc_wait()  # Act is written by the gate_up kernel
        gdc_launch_dependents()
    a_ptrs = Act + p[:, None] * stride_at + offs_k[None, :]
    acc = tl.zeros([TOP_K_P2, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        mask_k = offs_k < K - k0
        a = tl.load(a_ptrs, mask=mask_j[:, None] & mask_k[None, :], other=0.0).to(tl.float32)
        next_k = offs_k < K - k0 - BLOCK_K
        w_next = tl.load(w_ptrs + BLOCK_K, mask=mask_jn & next_k[None, None, :], other=0.0)
        acc += tl.sum(w.to(tl.float32) * a[:, None, :], axis=2)
        w = w_next
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    out_ty = Out.dtype.element_ty
    # NOTE: as fused_moe.py: each expert's output rounded, times its weight, rounded; the k
    # terms summed in fp32 and rounded once (what torch's sum over k does).
    terms = (acc.to(out_ty).to(tl.float32) * wt[:, None]).to(out_ty).to(tl.float32)
    tl.store(Out + t * stride_ot + offs_n, tl.sum(terms, axis=0).to(out_ty), mask=mask_n)


def fused_moe_gemv(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    cfg: MoEGemvConfig,
) -> torch.Tensor:
    """The small-T fused MoE (module docstring); same math as `fused_moe_torch`."""
    t, h = x.shape
    inter = w13.shape[1] // 2
    k = topk_ids.shape[1]
    ids = topk_ids.contiguous()
    weights = topk_weights.contiguous()
    act = torch.empty(t * k, inter, dtype=x.dtype, device=x.device)
    pdl = pdl_launch_args(x.device)  # USE_PDL (and launch_pdl on Hopper)
    _moe_gemv_gate_up_kernel[(t * k, cdiv(inter, cfg.block_n))](
        *(x, w13, act, ids, inter, h),
        *(x.stride(0), w13.stride(0), w13.stride(1), act.stride(0)),
        TOP_K=k,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        num_warps=cfg.num_warps,
        **pdl,
    )
    out = torch.empty(t, h, dtype=x.dtype, device=x.device)
    _moe_gemv_down_kernel[(t, cdiv(h, cfg.down_block_n))](
        *(act, w2, out, ids, weights, h, inter),
        *(act.stride(0), w2.stride(0), w2.stride(1), out.stride(0)),
        TOP_K=k,
        TOP_K_P2=next_power_of_2(k),
        BLOCK_N=cfg.down_block_n,
        BLOCK_K=cfg.down_block_k,
        num_warps=cfg.down_num_warps,
        **pdl,
    )
    return out
