"""Extend attention (Triton) against its torch reference on small paged batches (also FP8 pools)."""

from __future__ import annotations

import pytest
import torch

from radixlm.kernels._triton import HAS_TRITON
from radixlm.kernels.extend_attention import extend_attention, extend_attention_ref
from radixlm.kernels.store_kv import quantize_kv
from radixlm.kernels.testing import assert_close, make_paged_batch

pytestmark = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")

# (prefix_lens, extend_lens): empty prefixes, prefixes ending mid-block, extend length 1,
# odd lengths and a request longer than one query block, mixed in one batch.
MIXED = ([0, 37, 5, 65], [70, 1, 33, 2])


@pytest.mark.parametrize(
    ("head_dim", "num_heads", "num_kv_heads", "dtype"),
    [
        (64, 4, 4, torch.float32),  # MHA
        (128, 8, 2, torch.float16),  # GQA 4
        (80, 8, 1, torch.bfloat16),  # GQA 8, non-power-of-2 head_dim
        (64, 8, 1, torch.float32),  # GQA 8
    ],
)
def test_extend_matches_reference(
    device: str, head_dim: int, num_heads: int, num_kv_heads: int, dtype: torch.dtype
) -> None:
    batch = make_paged_batch(*MIXED, num_heads, num_kv_heads, head_dim, dtype, device)
    args = batch.extend_args()
    out = torch.full_like(batch.q, float("nan"))
    extend_attention(*args, batch.max_extend_len, out=out)
    assert_close(out, extend_attention_ref(*args), dtype, "extend attention")


@pytest.mark.parametrize(
    ("fp8", "dtype"), [(torch.float8_e4m3fn, torch.float32), (torch.float8_e5m2, torch.bfloat16)]
)
def test_extend_fp8_pool_matches_reference(
    device: str, fp8: torch.dtype, dtype: torch.dtype
) -> None:
    """The cached prefix from an FP8 pool (scales != 1), the new tokens from k/v_extend."""
    batch = make_paged_batch([0, 37, 5], [20, 1, 9], 4, 2, 64, dtype, device, seed=4)
    k_scale, v_scale = 0.37, 1.7
    k_buf = quantize_kv(batch.k_buffer, fp8, k_scale)
    v_buf = quantize_kv(batch.v_buffer, fp8, v_scale)
    args = list(batch.extend_args())
    args[3:5] = k_buf, v_buf
    out = torch.full_like(batch.q, float("nan"))
    scales = {"k_scale": k_scale, "v_scale": v_scale}
    extend_attention(*args, batch.max_extend_len, out=out, **scales)
    assert_close(out, extend_attention_ref(*args, **scales), dtype, "extend attention (fp8)")


@pytest.mark.parametrize(
    ("prefix_lens", "extend_lens", "config"),
    [
        (
            [0, 0],
            [45, 16],
            (32, 16, 32, 4, 1),
        ),  # pure prefill, several full blocks before the diagonal
        ([23, 50], [1, 1], (32, 16, 16, 4, 1)),  # extend length 1 (decode through extend)
        ([65], [40], (16, 16, 64, 4, 1)),  # BLOCK_M == BLOCK_N, wide prefix tile
    ],
)
def test_extend_block_shapes(
    device: str,
    prefix_lens: list[int],
    extend_lens: list[int],
    config: tuple[int, int, int, int, int],
) -> None:
    batch = make_paged_batch(prefix_lens, extend_lens, 4, 2, 64, torch.float32, device, seed=3)
    args = batch.extend_args()
    out = torch.full_like(batch.q, float("nan"))
    extend_attention(*args, batch.max_extend_len, sm_scale=0.3, out=out, config=config)
    assert_close(out, extend_attention_ref(*args, sm_scale=0.3), torch.float32, "extend attention")


def test_extend_grid_larger_than_needed(device: str) -> None:
    """max_extend_len may overestimate (e.g. a padded capture size): extra blocks do nothing."""
    batch = make_paged_batch([3, 0], [5, 9], 4, 4, 64, torch.float32, device, seed=5)
    args = batch.extend_args()
    out = torch.full_like(batch.q, float("nan"))
    extend_attention(*args, 100, out=out)
    assert_close(out, extend_attention_ref(*args), torch.float32, "extend attention")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize(
    ("dtype", "kv_dtype"),
    [
        (torch.bfloat16, torch.bfloat16),
        (torch.float32, torch.float32),
        (torch.bfloat16, torch.float8_e4m3fn),
    ],
)
def test_extend_llama8b_shapes(dtype: torch.dtype, kv_dtype: torch.dtype) -> None:
    """Default (tuned) configs at full shapes; fp32 tiles must still fit in shared memory, and
    so must the converted tiles of an fp8 prefix."""
    batch = make_paged_batch([0, 1000, 4096, 7], [1024, 1, 513, 300], 32, 8, 128, dtype, "cuda")
    scales = {"k_scale": 0.5, "v_scale": 1.5} if kv_dtype != dtype else {}
    args = list(batch.extend_args())
    args[3] = quantize_kv(batch.k_buffer, kv_dtype, scales.get("k_scale", 1.0))
    args[4] = quantize_kv(batch.v_buffer, kv_dtype, scales.get("v_scale", 1.0))
    out = torch.full_like(batch.q, float("nan"))
    extend_attention(*args, batch.max_extend_len, out=out, **scales)
    expected = extend_attention_ref(*args, **scales)
    assert_close(out, expected, dtype, "extend attention (8B shapes)")
