"""The inputs of one decode step, assembled on the device in one kernel.

A decode step needs five int64 columns per request (`DECODE_INPUT_ROWS`) and the new token's KV
slot written into `req_to_token`. The scheduler knows the request rows and positions on the host
(one host-to-device copy, `cols`), the new slots come from the device-side allocator, and the
input ids are either host values (a third row of `cols`) or the previous step's device-side
tokens (`ids`, overlapped decode). One launch writes all five columns into `out` (typically the
CUDA-graph runner's static input buffer, so that replay copies nothing) and the table entries.

Layouts:
    cols:  [2 or 3, B] int64: request rows, positions (, input ids when `ids` is None)
    ids:   [B] int64 or None
    slots: [B] int64 (the new tokens' KV slots)
    req_to_token: [rows, max_context] int32; req_to_token[row_b, pos_b] = slot_b is written
    out:   [5, >= B] int64, last dim contiguous; rows in `DECODE_INPUT_ROWS` order
"""

from __future__ import annotations

import torch

from radixlm.kernels._triton import cdiv, jit, require_triton, tl

DECODE_INPUT_ROWS = ("input_ids", "positions", "out_cache_loc", "req_pool_indices", "seq_lens")


def decode_inputs_ref(
    cols: torch.Tensor,
    ids: torch.Tensor | None,
    slots: torch.Tensor,
    req_to_token: torch.Tensor,
    out: torch.Tensor,
) -> torch.Tensor:
    bs = slots.shape[0]
    rows, positions = cols[0], cols[1]
    req_to_token[rows, positions] = slots.to(req_to_token.dtype)
    out[0, :bs] = cols[2] if ids is None else ids
    out[1, :bs] = positions
    out[2, :bs] = slots
    out[3, :bs] = rows
    out[4, :bs] = positions + 1
    return out


# NOTE: one compile for every batch: its size, and the alignment of views into packed buffers
@jit(do_not_specialize=("Cols", "Ids", "Slots", "ReqToToken", "Out", "bs", "stride_cols",
                        "stride_r2t", "stride_out"))  # fmt: skip
def _decode_inputs_kernel(
    Cols,
    Ids,
    Slots,
    ReqToToken,
    Out,
    bs,
    stride_cols,
    stride_r2t,
    stride_out,
    IDS_FROM_COLS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < bs
    rows = tl.load(Cols + offs, mask=mask, other=0)
    positions = tl.load(Cols + stride_cols + offs, mask=mask, other=0)
    if IDS_FROM_COLS:
        ids = tl.load(Cols + 2 * stride_cols + offs, mask=mask, other=0)
    else:
        ids = tl.load(Ids + offs, mask=mask, other=0)
    slots = tl.load(Slots + offs, mask=mask, other=0)
    tl.store(ReqToToken + rows * stride_r2t + positions, slots.to(tl.int32), mask=mask)
    tl.store(Out + offs, ids, mask=mask)
    tl.store(Out + stride_out + offs, positions, mask=mask)
    tl.store(Out + 2 * stride_out + offs, slots, mask=mask)
    tl.store(Out + 3 * stride_out + offs, rows, mask=mask)
    tl.store(Out + 4 * stride_out + offs, positions + 1, mask=mask)


def decode_inputs(
    cols: torch.Tensor,
    ids: torch.Tensor | None,
    slots: torch.Tensor,
    req_to_token: torch.Tensor,
    out: torch.Tensor,
    block: int = 128,
) -> torch.Tensor:
    """Triton version of `decode_inputs_ref`: fills `out[:, :B]` and the new tokens'
    `req_to_token` entries (see the module docstring). Returns `out`."""
    require_triton()
    bs = slots.shape[0]
    assert cols.shape[0] == (2 if ids is not None else 3) and cols.shape[1] == bs
    assert out.shape[0] == len(DECODE_INPUT_ROWS) and out.shape[1] >= bs
    assert cols.dtype == slots.dtype == out.dtype == torch.int64
    assert req_to_token.dtype == torch.int32 and req_to_token.stride(1) == 1
    assert cols.stride(1) == 1 and out.stride(1) == 1 and slots.is_contiguous()
    assert ids is None or (ids.dtype == torch.int64 and ids.is_contiguous())
    if bs == 0:
        return out
    _decode_inputs_kernel[(cdiv(bs, block),)](
        cols,
        slots if ids is None else ids,
        slots,
        req_to_token,
        out,
        bs,
        cols.stride(0),
        req_to_token.stride(0),
        out.stride(0),
        IDS_FROM_COLS=ids is None,
        BLOCK=block,
        num_warps=4,
    )
    return out
