"""Small-batch linear layer (`y = x W^T`) for decode: a memory-bound GEMV over the weight rows.

At decode batch sizes (M <= 8) a linear layer reads every weight once and does almost no math,
so its speed is the share of HBM bandwidth it reaches. Each program owns BLOCK_N output features
and streams their weight rows along K in contiguous BLOCK_K tiles (16-byte vector loads), keeping
the M activations in registers; accumulation is fp32. `SPLIT_K` > 1 splits K across programs
that add into an fp32 output (for layers with few output features, e.g. Llama's o_proj).

Layouts:
    x: [M, K] (M <= 16), w: [N, K] row-major (the nn.Linear layout), same dtype (bf16/fp16/fp32)
    returns [M, N] in x's dtype.
The runtime does not assume this beats cuBLAS: `radixlm.runtime.models.llama.Linear` times both
once per weight shape on the GPU and keeps the faster (see `pick_decode_gemm`).
"""

from __future__ import annotations

import torch

from radixlm.kernels._triton import cdiv, jit, next_power_of_2, require_triton, tl


def gemv_ref(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Reference: fp32 accumulation, result in x's dtype."""
    return (x.float() @ w.float().t()).to(x.dtype)


@jit
def _gemv_kernel(
    X,
    W,
    Out,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_om,
    K_PER_SPLIT,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    ATOMIC: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    mask_n = offs_n < N
    mask_m = offs_m < M
    k_start = pid_k * K_PER_SPLIT
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_start, k_start + K_PER_SPLIT, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < K
        w = tl.load(
            W + offs_n[:, None] * stride_wn + offs_k[None, :],
            mask=mask_n[:, None] & mask_k[None, :],
            other=0.0,
        ).to(tl.float32)  # [BLOCK_N, BLOCK_K]
        x = tl.load(
            X + offs_m[:, None] * stride_xm + offs_k[None, :],
            mask=mask_m[:, None] & mask_k[None, :],
            other=0.0,
        ).to(tl.float32)  # [BLOCK_M, BLOCK_K]
        # [BLOCK_M, 1, BLOCK_K] * [1, BLOCK_N, BLOCK_K] summed over K
        acc += tl.sum(x[:, None, :] * w[None, :, :], axis=2)
    out_ptrs = Out + offs_m[:, None] * stride_om + offs_n[None, :]
    out_mask = mask_m[:, None] & mask_n[None, :]
    if ATOMIC:
        tl.atomic_add(out_ptrs, acc, mask=out_mask)
    else:
        tl.store(out_ptrs, acc.to(Out.dtype.element_ty), mask=out_mask)


def gemv(
    x: torch.Tensor,
    w: torch.Tensor,
    block_n: int = 16,
    block_k: int = 256,
    split_k: int = 1,
    num_warps: int = 4,
) -> torch.Tensor:
    """`x @ w.T` for small M. With `split_k` > 1 the partial sums are added atomically into an
    fp32 buffer and cast at the end (one extra elementwise kernel)."""
    require_triton()
    m, k = x.shape
    n = w.shape[0]
    assert w.shape[1] == k and x.dtype == w.dtype and m <= 16
    assert x.stride(1) == 1 and w.stride(1) == 1
    block_m = max(1, next_power_of_2(m))
    k_per_split = cdiv(cdiv(k, split_k), block_k) * block_k
    splits = cdiv(k, k_per_split)
    atomic = splits > 1
    out = (
        torch.zeros((m, n), dtype=torch.float32, device=x.device) if atomic else x.new_empty((m, n))
    )
    _gemv_kernel[(cdiv(n, block_n), splits)](
        x, w, out, m, n, k, x.stride(0), w.stride(0), out.stride(0), k_per_split,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, ATOMIC=atomic, num_warps=num_warps,
    )  # fmt: skip
    return out.to(x.dtype) if atomic else out


# Candidate launch configurations tried by the runtime's per-shape selection (GPU only).
GEMV_CONFIGS = (
    {"block_n": 16, "block_k": 256, "split_k": 1, "num_warps": 4},
    {"block_n": 8, "block_k": 512, "split_k": 1, "num_warps": 4},
    {"block_n": 32, "block_k": 128, "split_k": 1, "num_warps": 4},
    {"block_n": 16, "block_k": 256, "split_k": 4, "num_warps": 4},
    {"block_n": 8, "block_k": 512, "split_k": 2, "num_warps": 8},
)
