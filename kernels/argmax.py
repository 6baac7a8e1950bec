"""Row-wise argmax of logits (greedy sampling) in two stages.

torch's argmax reduces a [1, 128K] row with a handful of blocks (25 us on the H200, a
sixth of the lm_head GEMV); here every row is split into chunks that many programs reduce at once.

    stage 1, grid (B, chunks): each program reduces BLOCK columns of one row to its maximum and
        the first column holding it;
    stage 2, grid (B,): each row's chunk maxima reduce to the first chunk holding the row's
        maximum, whose column is the answer.

Ties go to the lowest column, as `torch.argmax`.

Layouts: x: [B, V] float (last dim contiguous); returns int64 [B].

# NOTE: a NaN logit is not ordered here (torch treats NaN as the maximum); logits are finite or
# -inf (masked) in practice. A row of only -inf gives column 0, as torch.
"""

from __future__ import annotations

import torch

from radixlm.kernels._triton import (
    cdiv,
    jit,
    next_power_of_2,
    pdl_launch_args,
    pdl_prologue,
    require_triton,
    tl,
)


def argmax_rows_ref(x: torch.Tensor) -> torch.Tensor:
    return x.argmax(dim=-1)


@jit
def _argmax_chunks_kernel(
    X, MaxOut, IdxOut, V, stride_x, chunks, BLOCK: tl.constexpr, USE_PDL: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    offs = chunk * BLOCK + tl.arange(0, BLOCK)
    pdl_prologue(USE_PDL)
    x = tl.load(X + row * stride_x + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
    best, where = tl.max(x, 0, return_indices=True, return_indices_tie_break_left=True)
    tl.store(MaxOut + row * chunks + chunk, best)
    tl.store(IdxOut + row * chunks + chunk, chunk * BLOCK + where)


@jit
def _argmax_rows_kernel(MaxIn, IdxIn, Out, chunks, BLOCK_C: tl.constexpr, USE_PDL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_C)
    pdl_prologue(USE_PDL)
    best = tl.load(MaxIn + row * chunks + offs, mask=offs < chunks, other=float("-inf"))
    _, first = tl.max(best, 0, return_indices=True, return_indices_tie_break_left=True)
    tl.store(Out + row, tl.load(IdxIn + row * chunks + first).to(tl.int64))


def argmax_rows(x: torch.Tensor, block: int = 4096) -> torch.Tensor:
    """Triton version of `argmax_rows_ref` for a 2-D x."""
    require_triton()
    assert x.dim() == 2 and x.stride(1) == 1, "x must be [B, V] with a contiguous last dim"
    batch, vocab = x.shape
    if batch == 0 or vocab == 0:
        return torch.zeros(batch, dtype=torch.int64, device=x.device)
    out = torch.empty(batch, dtype=torch.int64, device=x.device)
    block = min(block, next_power_of_2(vocab))
    chunks = cdiv(vocab, block)
    maxes = torch.empty(batch, chunks, dtype=torch.float32, device=x.device)
    idx = torch.empty(batch, chunks, dtype=torch.int32, device=x.device)
    pdl = pdl_launch_args(x.device)
    _argmax_chunks_kernel[(batch, chunks)](
        x, maxes, idx, vocab, x.stride(0), chunks, BLOCK=block, num_warps=8, **pdl
    )
    _argmax_rows_kernel[(batch,)](
        maxes, idx, out, chunks, BLOCK_C=next_power_of_2(chunks), num_warps=1, **pdl
    )
    return out
