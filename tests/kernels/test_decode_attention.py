"""Decode attention (split-KV, GQA-grouped Triton) against its torch reference, also over FP8 pools."""

from __future__ import annotations

import pytest
import torch

from radixlm.kernels._triton import HAS_TRITON
from radixlm.kernels.decode_attention import decode_attention, decode_attention_fwd
from radixlm.kernels.decode_attention_ref import decode_attention_ref
from radixlm.kernels.decode_workspace import (
    MAX_KV_SPLITS,
    alloc_decode_workspace,
    choose_num_kv_splits,
    decode_workspace_numel,
)
from radixlm.kernels.extend_attention import extend_attention
from radixlm.kernels.store_kv import quantize_kv
from radixlm.kernels.testing import assert_close, make_paged_batch

needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")

# Sequence lengths (incl. the new token): length 1, odd lengths, one ending mid-block, one longer
# than a few blocks. seq_len = prefix + 1 since the pool already holds the new token.
MIXED_LENS = [1, 37, 100, 64, 33]


def _decode_batch(lens: list[int], heads: int, kv_heads: int, dim: int, dtype, device, seed=0):
    return make_paged_batch(
        [n - 1 for n in lens], [1] * len(lens), heads, kv_heads, dim, dtype, device, seed
    )


@needs_triton
@pytest.mark.parametrize(
    ("head_dim", "num_heads", "num_kv_heads", "dtype", "num_kv_splits"),
    [
        (64, 4, 4, torch.float32, None),  # MHA, heuristic splits
        (128, 8, 2, torch.float16, 3),  # GQA 4
        (80, 8, 1, torch.bfloat16, 4),  # GQA 8, non-power-of-2 head_dim
        (64, 16, 2, torch.float32, 1),  # GQA 8, a single split
        (64, 4, 1, torch.float32, MAX_KV_SPLITS),  # far more splits than blocks
    ],
)
def test_decode_matches_reference(
    device: str,
    head_dim: int,
    num_heads: int,
    num_kv_heads: int,
    dtype: torch.dtype,
    num_kv_splits: int | None,
) -> None:
    batch = _decode_batch(MIXED_LENS, num_heads, num_kv_heads, head_dim, dtype, device)
    args = batch.decode_args()
    out = torch.full_like(batch.q, float("nan"))
    decode_attention(*args, num_kv_splits=num_kv_splits, out=out)
    assert_close(out, decode_attention_ref(*args), dtype, "decode attention")


@needs_triton
@pytest.mark.parametrize("fused_merge", [True, False])
def test_decode_fwd_preallocated_workspace(device: str, fused_merge: bool) -> None:
    """The graph-safe entry: workspace for a larger batch, poisoned; a padding lane (seq_len 0);
    splits merged in stage 1 (arrival counters, left zeroed) or by the stage-2 kernel."""
    lens = [9, 1, 70]
    batch = _decode_batch(lens, 8, 2, 64, torch.float32, device, seed=7)
    batch.seq_lens[1] = 0  # padding lane of a padded CUDA-graph batch: output must be zeros
    args = batch.decode_args()
    mid_o, mid_lse = alloc_decode_workspace(6, 8, 64, 5, device)
    mid_o.fill_(float("nan"))
    mid_lse.fill_(float("nan"))
    out = torch.full_like(batch.q, float("nan"))
    arrivals = torch.zeros(6 * 8, dtype=torch.int32, device=device) if fused_merge else None
    for _ in range(2):  # the counters must be back at zero for the second launch
        decode_attention_fwd(*args, out, mid_o, mid_lse, sm_scale=0.2, arrivals=arrivals)
    expected = decode_attention_ref(*args, sm_scale=0.2)
    assert arrivals is None or not arrivals.any()
    assert torch.all(out[1] == 0)
    assert_close(out, expected, torch.float32, "decode attention (preallocated)")


@needs_triton
@pytest.mark.parametrize(
    ("fp8", "dtype", "fused_merge"),
    [(torch.float8_e4m3fn, torch.bfloat16, True), (torch.float8_e5m2, torch.float16, False)],
)
def test_decode_fp8_pool_matches_reference(
    device: str, fp8: torch.dtype, dtype: torch.dtype, fused_merge: bool
) -> None:
    """An FP8 pool with scales != 1 under bf16/fp16 queries: one request in a single split
    (v_scale applied at its direct output) and two split across 3 (v_scale per split, merged by
    stage 1 or by the stage-2 kernel)."""
    batch = _decode_batch([1, 37, 70], 8, 2, 64, dtype, device, seed=3)
    k_scale, v_scale = 0.37, 1.7
    k_buf = quantize_kv(batch.k_buffer, fp8, k_scale)  # NaN-poisoned unused slots stay NaN
    v_buf = quantize_kv(batch.v_buffer, fp8, v_scale)
    args = (batch.q, k_buf, v_buf, batch.req_to_token, batch.req_pool_indices, batch.seq_lens)
    out = torch.full_like(batch.q, float("nan"))
    scales = {"k_scale": k_scale, "v_scale": v_scale}
    decode_attention(*args, num_kv_splits=3, out=out, fused_merge=fused_merge, **scales)
    assert_close(out, decode_attention_ref(*args, **scales), dtype, "decode attention (fp8)")


@needs_triton
def test_decode_fp8_pool_with_a_query_past_fp16_range(device: str) -> None:
    """A bf16 q over an FP8 pool is multiplied in fp16, clamped to its range: a q element past
    65504 (finite in bf16) gives the attention of the clamped query, not inf/NaN."""
    batch = _decode_batch([9, 40], 4, 2, 64, torch.bfloat16, device, seed=5)
    fp8 = torch.float8_e4m3fn
    k_buf, v_buf = quantize_kv(batch.k_buffer, fp8), quantize_kv(batch.v_buffer, fp8)
    q = batch.q.clone()
    q[0, 1, 3], q[1, 2, 0] = 1e6, -3e5
    args = (k_buf, v_buf, batch.req_to_token, batch.req_pool_indices, batch.seq_lens)
    out = decode_attention(q, *args, num_kv_splits=2)
    assert torch.isfinite(out).all()
    expected = decode_attention_ref(q.float().clamp(-65504, 65504).bfloat16(), *args)
    assert_close(out, expected, torch.bfloat16, "decode attention (fp8, clamped q)")


@needs_triton
def test_decode_equals_extend_of_one_token(device: str) -> None:
    """Decode and extend-with-one-new-token are the same math on the same batch."""
    batch = _decode_batch([5, 48, 31], 8, 2, 64, torch.float32, device, seed=11)
    dec = decode_attention(*batch.decode_args(), num_kv_splits=2)
    batch_ext = make_paged_batch([4, 47, 30], [1, 1, 1], 8, 2, 64, torch.float32, device, seed=11)
    ext = extend_attention(*batch_ext.extend_args(), batch_ext.max_extend_len)
    assert_close(dec, ext, torch.float32, "decode vs extend")


def test_choose_num_kv_splits() -> None:
    # Short sequences: one split per min_split_len (128) tokens, rounded down to a power of two.
    assert choose_num_kv_splits(1, 100, 8, num_sms=132) == 1
    assert choose_num_kv_splits(1, 1024, 8, num_sms=132) == 8
    assert choose_num_kv_splits(1, 4096, 8, num_sms=132) == 32
    # Long sequence, one request: capped at 32 splits by default.
    assert choose_num_kv_splits(1, 32768, 8, num_sms=132) == 32
    assert choose_num_kv_splits(1, 32768, 8, num_sms=132, max_splits=MAX_KV_SPLITS) == 64
    # Up to batch 8 ~4 programs per SM, then ~8: the batch fills the GPU, few splits.
    assert choose_num_kv_splits(4, 32768, 8, num_sms=132) == 16
    assert choose_num_kv_splits(8, 32768, 8, num_sms=132) == 8
    assert choose_num_kv_splits(12, 32768, 8, num_sms=132) == 8
    assert choose_num_kv_splits(32, 4096, 8, num_sms=132) == 4
    assert choose_num_kv_splits(64, 32768, 8, num_sms=132) == 2
    assert choose_num_kv_splits(256, 32768, 8, num_sms=132) == 1
    for bs in (1, 3, 64):
        for length in (1, 500, 4096, 32768):
            splits = choose_num_kv_splits(bs, length, 8)
            assert 1 <= splits <= MAX_KV_SPLITS and splits & (splits - 1) == 0


def test_workspace_views_share_one_buffer() -> None:
    numel = decode_workspace_numel(8, 4, 64, 16)
    buffer = torch.empty(numel)
    mid_o, mid_lse = alloc_decode_workspace(8, 4, 64, 16, buffer=buffer)
    assert mid_o.shape == (8, 4, 16, 64) and mid_lse.shape == (8, 4, 16)
    assert mid_o.data_ptr() == buffer.data_ptr()
    small_o, _ = alloc_decode_workspace(2, 4, 64, 64, buffer=buffer)  # another (bs, splits)
    assert small_o.data_ptr() == buffer.data_ptr()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_decode_llama8b_long_context_cuda_graph(kv_dtype: torch.dtype) -> None:
    lens = [32768, 1, 4097, 900, 77, 16000, 2, 300]
    batch = _decode_batch(lens, 32, 8, 128, torch.bfloat16, "cuda", seed=2)
    scales = {"k_scale": 0.5, "v_scale": 1.5} if kv_dtype != torch.bfloat16 else {}
    k_buf = quantize_kv(batch.k_buffer, kv_dtype, scales.get("k_scale", 1.0))
    v_buf = quantize_kv(batch.v_buffer, kv_dtype, scales.get("v_scale", 1.0))
    args = (batch.q, k_buf, v_buf, batch.req_to_token, batch.req_pool_indices, batch.seq_lens)
    splits = choose_num_kv_splits(len(lens), max(lens), 8)
    mid_o, mid_lse = alloc_decode_workspace(len(lens), 32, 128, splits, "cuda")
    out = torch.full_like(batch.q, float("nan"))
    arrivals = torch.zeros(len(lens) * 32, dtype=torch.int32, device="cuda")
    decode_attention_fwd(*args, out, mid_o, mid_lse, arrivals=arrivals, **scales)  # compile
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        decode_attention_fwd(*args, out, mid_o, mid_lse, arrivals=arrivals, **scales)
    batch.seq_lens[0] = 20000  # data changes between replays, shapes do not
    out.fill_(float("nan"))
    graph.replay()
    graph.replay()
    torch.cuda.synchronize()
    expected = decode_attention_ref(*args, **scales)
    assert_close(out, expected, torch.bfloat16, "decode attention (graph)")
    assert not arrivals.any()
