"""Split-KV planning for decode attention: how many splits, and the fp32 workspace they need.

Pure python/torch (no triton), so the runtime can size CUDA-graph buffers anywhere.

Workspace layout (fp32, owned by the caller, contents are scratch between the two stages):
    mid_o:   [B, num_heads, max_kv_splits, head_dim] per-split output, already normalised
    mid_lse: [B, num_heads, max_kv_splits]           per-split natural-log sum-exp of scores
"""

from __future__ import annotations

import torch

from radixlm.kernels._triton import cdiv
from radixlm.kernels.store_kv import check_kv_scales, is_fp8

MAX_KV_SPLITS = 256  # largest split dim the kernels accept


def choose_num_kv_splits(
    batch_size: int,
    max_seq_len: int,
    num_kv_heads: int,
    num_sms: int | None = None,
    min_split_len: int = 128,
    max_splits: int = 32,
) -> int:
    """Heuristic number of KV splits: about 4 programs per SM up to batch 8 and 8 above, splits
    >= min_split_len tokens, capped at `max_splits`.

    Rounded down to a power of two (fewer distinct values to capture, and it measured better
    than odd counts on H200). Pure python, no device sync: use it for a CUDA graph's fixed
    `max_kv_splits` too (with the graph's batch size and the longest context it may see).

    # NOTE: from a split sweep on the H200 (bf16, 8 KV heads, contexts 1k-32k, docs/benchmarks.md
    # run 18): up to batch 8 the best counts gave ~512 programs (batch 8 at 4k: 8 splits 81 % of
    # copy bandwidth, 16 splits 74 %); from batch 12 up fewer than ~8 per SM starved the GPU
    # (batch 32 at 4k: 4 splits 94 %, 2 splits 84 %). Splits of 128 tokens beat 256 at batch
    # 1-8 and contexts of 1k-4k.
    """
    if num_sms is None:
        num_sms = 132
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(torch.cuda.current_device())
            num_sms = props.multi_processor_count
    programs = max(1, batch_size * num_kv_heads)
    per_sm = 4 if batch_size <= 8 else 8
    for_occupancy = cdiv(per_sm * num_sms, programs)
    for_length = cdiv(max(1, max_seq_len), min_split_len)
    splits = max(1, min(for_occupancy, for_length, max_splits, MAX_KV_SPLITS))
    return 1 << (splits.bit_length() - 1)


def decode_workspace_numel(
    batch_size: int, num_heads: int, head_dim: int, max_kv_splits: int
) -> int:
    """fp32 elements of one (mid_o, mid_lse) workspace."""
    return batch_size * num_heads * max_kv_splits * (head_dim + 1)


def alloc_decode_workspace(
    batch_size: int,
    num_heads: int,
    head_dim: int,
    max_kv_splits: int,
    device: torch.device | str | None = None,
    buffer: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(mid_o, mid_lse) fp32 scratch for `decode_attention_fwd`.

    With `buffer` (a contiguous fp32 tensor of >= `decode_workspace_numel(...)` elements) both are
    views into it, so CUDA graphs captured for several batch sizes (each with its own split count)
    can share one allocation sized for the largest batch_size * max_kv_splits.
    """
    n_o = batch_size * num_heads * max_kv_splits * head_dim
    n_lse = batch_size * num_heads * max_kv_splits
    if buffer is None:
        buffer = torch.empty(n_o + n_lse, dtype=torch.float32, device=device)
    assert (
        buffer.dtype == torch.float32 and buffer.is_contiguous() and buffer.numel() >= n_o + n_lse
    )
    mid_o = buffer[:n_o].view(batch_size, num_heads, max_kv_splits, head_dim)
    mid_lse = buffer[n_o : n_o + n_lse].view(batch_size, num_heads, max_kv_splits)
    return mid_o, mid_lse


def check_split_inputs(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    out: torch.Tensor,
    mid_o: torch.Tensor,
    mid_lse: torch.Tensor,
    req_to_token: torch.Tensor,
    k_scale: float,
    v_scale: float,
) -> None:
    """The layout checks shared by the split-K attention kernels (decode, tree verify): q / out
    `[rows, H, D]`, the pool, and the `[>= rows, H, splits(, D)]` fp32 workspace."""
    rows, num_heads, head_dim = q.shape
    assert num_heads % k_buffer.shape[1] == 0, "num_heads must be a multiple of num_kv_heads"
    assert k_buffer.shape[2] == head_dim and v_buffer.shape == k_buffer.shape
    assert k_buffer.dtype == v_buffer.dtype
    assert q.dtype == k_buffer.dtype or is_fp8(k_buffer.dtype), "pool: q's dtype or fp8"
    check_kv_scales(k_buffer.dtype, k_scale, v_scale)
    assert out.shape == q.shape and out.stride(2) == 1
    num_splits = mid_o.shape[2]
    assert 1 <= num_splits <= MAX_KV_SPLITS
    assert mid_o.shape[0] >= rows and mid_o.shape[1] == num_heads and mid_o.shape[3] == head_dim
    assert mid_lse.shape[0] >= rows and mid_lse.shape[1:] == (num_heads, num_splits)
    assert mid_o.dtype == mid_lse.dtype == torch.float32
    assert mid_o.stride(3) == 1 and mid_lse.stride(2) == 1
    for t in (q, k_buffer, v_buffer):
        assert t.stride(2) == 1, "last dim must be contiguous"
    assert req_to_token.stride(1) == 1
