"""Small-batch linear layer (`y = x W^T`) for decode: a memory-bound GEMV over the weight rows.

At decode batch sizes (M <= 8) a linear layer reads every weight once and does almost no math,
so its speed is the share of HBM bandwidth it reaches. Each program owns BLOCK_N output features
and streams their weight rows along K in contiguous [BLOCK_N, BLOCK_K] tiles, the next tile's load
issued before the current one is reduced (two tiles in flight per program); the M activations
are re-read per tile from L1/L2 and accumulation is fp32.

Programmatic dependent launch (Hopper+, `kernels._triton.pdl_enabled`): the kernel is launched
with the PDL attribute so it can start while the previous kernel drains. It loads its first weight
tile (weights are never written by the previous kernel) and only then waits for the previous grid
(`gdc_wait`) before reading x.

Layouts:
    x: [M, K], M <= 16, last dim contiguous
    w: [N, K] row-major (the nn.Linear layout), same dtype as x (bf16/fp16/fp32), or
       float8_e4m3fn with `w_scale` [N] fp32 (a layer of `quantization="fp8"`): a weight-only FP8
       GEMV, each row's dot products scaled by its w_scale at the end, x kept in its dtype
    returns [M, N] in x's dtype; with `gated=True` (a gated MLP's gate_up: W stacks gate and up,
    N = 2 * I) returns `act(gate) * up` [M, I] instead (`activation`: "silu" or "gelu_tanh"):
    each program streams gate row j and up row I + j side by side (rows 2b and 2b + 1 of its
    tile) and applies the activation to its own accumulators before the store, so no [M, 2 * I]
    intermediate is written (the rounding is the activation kernel's, `kernels.activation`).
The runtime does not assume this beats cuBLAS: `radixlm.runtime.models.gemm_select` times both
once per weight shape on the GPU (inside CUDA graphs, weights cold in L2) and keeps the faster.
"""

from __future__ import annotations

import functools

import torch

from radixlm.kernels._triton import (
    cdiv,
    gdc_launch_dependents,
    gdc_wait,
    jit,
    next_power_of_2,
    pdl_launch_args,
    require_triton,
    tl,
)
from radixlm.kernels.activation import ACTIVATIONS, act_and_mul_ref, gated_act


def gemv_ref(
    x: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor | None = None,
    gated: bool = False,
    activation: str = "silu",
) -> torch.Tensor:
    """Reference: fp32 accumulation, result in x's dtype (then the activation, if gated)."""
    y = x.float() @ w.float().t()
    y = (y if w_scale is None else y * w_scale.float()).to(x.dtype)
    return act_and_mul_ref(y, activation) if gated else y


@jit
def _tile_rows(row_block, offs_b, N, BLOCK_N: tl.constexpr, GATED: tl.constexpr):
    """Weight rows of a row block's tile (int64). Plain: BLOCK_N consecutive rows. Gated: output
    features j of the block interleaved as (gate j, up I + j) pairs, I = N // 2.
    NOTE: rows past the end re-read the last row (in bounds) instead of masking every load."""
    if GATED:
        inter = N // 2
        j = tl.minimum(row_block * (BLOCK_N // 2) + offs_b // 2, inter - 1)
        return (j + (offs_b % 2) * inter).to(tl.int64)
    return tl.minimum(row_block * BLOCK_N + offs_b, N - 1).to(tl.int64)


@jit
def _store_tile(
    acc, Out, WScale, rows, row_block, offs_m, mask_m, N, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GATED: tl.constexpr, ACT: tl.constexpr,
    HAS_SCALE: tl.constexpr,
):  # fmt: skip
    """Scale (FP8 rows), activate (gated; ACT indexes `activation.ACTIVATIONS`) and store one row
    block's [BLOCK_M, BLOCK_N] sums."""
    if HAS_SCALE:
        acc = acc * tl.load(WScale + rows)[None, :]
    if GATED:
        gate, up = tl.split(tl.reshape(acc, (BLOCK_M, BLOCK_N // 2, 2)))
        vals = gated_act(gate, up, Out.dtype.element_ty, ACT)
        offs_n = row_block * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
        n_out = N // 2
    else:
        vals = acc
        offs_n = row_block * BLOCK_N + tl.arange(0, BLOCK_N)
        n_out = N
    out_ptrs = Out + offs_m[:, None] * stride_om + offs_n[None, :]
    tl.store(
        out_ptrs, vals.to(Out.dtype.element_ty), mask=mask_m[:, None] & (offs_n < n_out)[None, :]
    )


@jit
def _load_x(X, offs_m, offs_k, mask_m, K, stride_xm, EVEN_K: tl.constexpr):
    """[BLOCK_M, BLOCK_K] activations as fp32."""
    ptrs = X + offs_m[:, None] * stride_xm + offs_k[None, :]
    mask = mask_m[:, None] if EVEN_K else mask_m[:, None] & (offs_k < K)[None, :]
    return tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)


@jit
def _gemv_kernel(
    X,
    W,
    WScale,
    Out,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_om,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    GATED: tl.constexpr,
    ACT: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = _tile_rows(pid, tl.arange(0, BLOCK_N), N, BLOCK_N, GATED)
    offs_m = tl.arange(0, BLOCK_M)
    mask_m = offs_m < M
    offs_k = tl.arange(0, BLOCK_K)
    w_ptrs = W + rows[:, None] * stride_wn + offs_k[None, :]
    if EVEN_K:
        w = tl.load(w_ptrs)
    else:
        w = tl.load(w_ptrs, mask=(offs_k < K)[None, :], other=0.0)
    if USE_PDL:
        gdc_wait()  # x is written by the previous kernel; the first weight tile is already in flight
        gdc_launch_dependents()
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        x = _load_x(X, offs_m, k0 + offs_k, mask_m, K, stride_xm, EVEN_K)
        next_k = k0 + BLOCK_K + offs_k
        w_next = tl.load(w_ptrs + k0 + BLOCK_K, mask=(next_k < K)[None, :], other=0.0)
        acc += tl.sum(x[:, None, :] * w.to(tl.float32)[None, :, :], axis=2)
        w = w_next
    _store_tile(
        acc, Out, WScale, rows, pid, offs_m, mask_m, N, stride_om,
        BLOCK_M, BLOCK_N, GATED, ACT, HAS_SCALE,
    )  # fmt: skip


@jit
def _gemv_persistent_kernel(
    X,
    W,
    WScale,
    Out,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_om,
    NUM_ROW_BLOCKS,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    K_TILES: tl.constexpr,
    EVEN_K: tl.constexpr,
    GATED: tl.constexpr,
    ACT: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """A fixed grid of a few programs per SM, each streaming a contiguous run of row blocks as
    one sequence of [BLOCK_N, BLOCK_K] tiles; the next tile (possibly of the next row block) is
    always in flight, so a program never drains between row blocks and no tail wave is left."""
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    t = (pid * NUM_ROW_BLOCKS // programs) * K_TILES
    t_end = ((pid + 1) * NUM_ROW_BLOCKS // programs) * K_TILES
    offs_m = tl.arange(0, BLOCK_M)
    mask_m = offs_m < M
    offs_b = tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    rows = _tile_rows(t // K_TILES, offs_b, N, BLOCK_N, GATED)
    # NOTE: the grid never exceeds the row blocks, so every program owns at least one tile.
    w = tl.load(
        W + rows[:, None] * stride_wn + offs_k[None, :], mask=(offs_k < K)[None, :], other=0.0
    )
    if USE_PDL:
        gdc_wait()  # x is written by the previous kernel; the first weight tile is in flight
        gdc_launch_dependents()
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    while t < t_end:
        k0 = (t % K_TILES) * BLOCK_K
        x = _load_x(X, offs_m, k0 + offs_k, mask_m, K, stride_xm, EVEN_K)
        nt = t + 1
        n_rows = _tile_rows(nt // K_TILES, offs_b, N, BLOCK_N, GATED)
        n_k = (nt % K_TILES) * BLOCK_K + offs_k
        w_next = tl.load(
            W + n_rows[:, None] * stride_wn + n_k[None, :],
            mask=(n_k < K)[None, :] & (nt + 0 * offs_b < t_end)[:, None],
            other=0.0,
        )
        acc += tl.sum(x[:, None, :] * w.to(tl.float32)[None, :, :], axis=2)
        w = w_next
        if t % K_TILES == K_TILES - 1:
            block = t // K_TILES
            rows = _tile_rows(block, offs_b, N, BLOCK_N, GATED)
            _store_tile(
                acc, Out, WScale, rows, block, offs_m, mask_m, N, stride_om,
                BLOCK_M, BLOCK_N, GATED, ACT, HAS_SCALE,
            )  # fmt: skip
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        t = nt


@functools.cache
def _num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _resident_per_sm(compiled: object, index: int) -> int:
    """How many programs of a compiled kernel fit on one SM at once (registers, warps, shared
    memory), from the compiled kernel's resource use."""
    props = torch.cuda.get_device_properties(index)
    warps = compiled.metadata.num_warps
    regs_per_warp = cdiv(max(1, compiled.n_regs) * 32, 256) * 256  # allocated per warp, by 256
    fits = [
        getattr(props, "regs_per_multiprocessor", 65536) // (regs_per_warp * warps),
        props.max_threads_per_multi_processor // (32 * warps),
    ]
    if compiled.metadata.shared:
        fits.append(props.shared_memory_per_multiprocessor // (compiled.metadata.shared + 1024))
    return max(1, min(fits))


# (device index, launch constants) -> programs per SM that are resident together
_RESIDENT: dict[tuple, int] = {}


def gemv(
    x: torch.Tensor,
    w: torch.Tensor,
    block_n: int = 8,
    block_k: int = 512,
    num_warps: int = 4,
    per_sm: int = 0,
    num_stages: int | None = None,
    w_scale: torch.Tensor | None = None,
    gated: bool = False,
    activation: str = "silu",
) -> torch.Tensor:
    """`x @ w.T` for small M (times `w_scale` per output feature for an FP8 `w`; then
    `act(gate) * up` over its two halves if `gated`, act named by `activation`).

    `per_sm` > 0 launches the persistent kernel with that many programs per SM, at most as many
    as can be resident together (off CUDA, e.g. in the interpreter, `per_sm` programs in all)."""
    require_triton()
    m = x.shape[0]
    n, k = w.shape
    assert x.shape[1] == k, (x.shape, w.shape)
    assert m <= 16 and x.stride(1) == 1 and w.stride(1) == 1
    if w_scale is None:
        assert x.dtype == w.dtype
    else:
        assert w.dtype == torch.float8_e4m3fn and w_scale.shape == (n,), "FP8 rows and a scale each"
    if gated:
        assert n % 2 == 0 and block_n >= 2, "gated: W stacks gate and up; pairs per tile"
    out = x.new_empty((m, n // 2 if gated else n))
    block_k = min(block_k, next_power_of_2(k))
    common = dict(
        BLOCK_M=max(1, next_power_of_2(m)), BLOCK_N=block_n, BLOCK_K=block_k,
        EVEN_K=k % block_k == 0, GATED=gated, ACT=ACTIVATIONS.index(activation),
        HAS_SCALE=w_scale is not None, num_warps=num_warps,
        **pdl_launch_args(x.device),
        **({} if num_stages is None else {"num_stages": num_stages}),
    )  # fmt: skip
    scale = w if w_scale is None else w_scale  # NOTE: never read without HAS_SCALE
    args = (x, w, scale, out, m, n, k, x.stride(0), w.stride(0), out.stride(0))
    row_blocks = cdiv(n, block_n)  # NOTE: gated, a block of block_n rows makes block_n / 2 outputs
    if per_sm > 0 and x.device.type != "cuda":
        grid = (min(row_blocks, per_sm),)
        _gemv_persistent_kernel[grid](*args, row_blocks, K_TILES=cdiv(k, block_k), **common)
    elif per_sm > 0:
        # NOTE: a persistent grid must be resident all at once: programs waiting for a free SM
        # would run as a tail wave, and with PDL the next kernel could not start (its programs
        # launch only once every program here has started). per_sm is capped at what fits.
        index = x.device.index or 0
        key = (index, cdiv(k, block_k), x.dtype, w.dtype, *sorted(common.items()))
        per_sm = min(per_sm, _RESIDENT.get(key, per_sm))
        grid = (min(row_blocks, _num_sms(index) * per_sm),)
        compiled = _gemv_persistent_kernel[grid](
            *args, row_blocks, K_TILES=cdiv(k, block_k), **common
        )
        if key not in _RESIDENT:
            _RESIDENT[key] = _resident_per_sm(compiled, index)
    else:
        _gemv_kernel[(row_blocks,)](*args, **common)
    return out


# Candidate launch configurations tried by the runtime's per-shape selection (GPU only): the best
# few of a 75-config sweep on the H200 over Llama-3-8B's shapes at M = 1, plus the best of a
# 60-config sweep of the gated gate_up GEMV (4 rows, 2048-wide tiles, 8 programs per SM: 54.3 us
# against 55.9 for the best config before it and 56.1 for cuBLAS + activation; docs/benchmarks.md,
# run 38).
GEMV_CONFIGS = (
    {"block_n": 2, "block_k": 2048, "num_warps": 4, "per_sm": 8},
    {"block_n": 2, "block_k": 2048, "num_warps": 4, "per_sm": 16},
    {"block_n": 4, "block_k": 1024, "num_warps": 4, "per_sm": 16},
    {"block_n": 4, "block_k": 2048, "num_warps": 4, "per_sm": 8},
    {"block_n": 2, "block_k": 1024, "num_warps": 2},
    {"block_n": 4, "block_k": 1024, "num_warps": 4},
    {"block_n": 8, "block_k": 1024, "num_warps": 4},
)
# FP8 weights: the same, and each with twice the K tile (the same bytes per tile as bf16).
FP8_GEMV_CONFIGS = GEMV_CONFIGS + tuple({**c, "block_k": 2 * c["block_k"]} for c in GEMV_CONFIGS)
