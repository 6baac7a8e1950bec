"""store_kv (Triton) against its torch reference, into pools of the model dtype and FP8 pools."""

from __future__ import annotations

import pytest
import torch

from radixlm.kernels._triton import HAS_TRITON
from radixlm.kernels.store_kv import dequantize_kv, store_kv, store_kv_ref

pytestmark = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("num_kv_heads", "head_dim"), [(2, 64), (1, 80), (4, 128)])
def test_store_kv_matches_reference(
    device: str, dtype: torch.dtype, num_kv_heads: int, head_dim: int
) -> None:
    num_slots, tokens = 40, 9
    k_buf = torch.randn(num_slots, num_kv_heads, head_dim, device=device).to(dtype)
    v_buf = torch.randn(num_slots, num_kv_heads, head_dim, device=device).to(dtype)
    # k/v as strided views into one fused projection, as a model produces them.
    fused = torch.randn(tokens, 3, num_kv_heads, head_dim, device=device).to(dtype)
    k, v = fused[:, 1], fused[:, 2]
    loc = (torch.randperm(num_slots - 1)[:tokens] + 1).to(device)
    k_ref, v_ref = k_buf.clone(), v_buf.clone()
    store_kv(k_buf, v_buf, loc, k, v)
    store_kv_ref(k_ref, v_ref, loc, k, v)
    assert torch.equal(k_buf, k_ref) and torch.equal(v_buf, v_ref)
    assert torch.equal(k_buf[loc.long()], k) and torch.equal(v_buf[loc.long()], v)


def test_store_kv_padding_lanes_only_touch_slot_0(device: str) -> None:
    k_buf = torch.randn(10, 2, 64, device=device)
    v_buf = torch.randn(10, 2, 64, device=device)
    before_k, before_v = k_buf.clone(), v_buf.clone()
    k = torch.randn(4, 2, 64, device=device)
    v = torch.randn(4, 2, 64, device=device)
    loc = torch.tensor([5, 0, 0, 2], dtype=torch.int32, device=device)  # two padding lanes
    store_kv(k_buf, v_buf, loc, k, v)
    assert torch.equal(k_buf[5], k[0]) and torch.equal(v_buf[2], v[3])
    untouched = torch.tensor([1, 3, 4, 6, 7, 8, 9], device=device)
    assert torch.equal(k_buf[untouched], before_k[untouched])
    assert torch.equal(v_buf[untouched], before_v[untouched])


def test_store_kv_casts_to_pool_dtype(device: str) -> None:
    k_buf = torch.zeros(6, 1, 64, dtype=torch.float16, device=device)
    v_buf = torch.zeros_like(k_buf)
    k = torch.randn(2, 1, 64, device=device)
    v = torch.randn(2, 1, 64, device=device)
    loc = torch.tensor([4, 1], device=device)
    store_kv(k_buf, v_buf, loc, k, v)
    torch.testing.assert_close(k_buf[4], k[0].half(), atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(v_buf[1], v[1].half(), atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_store_kv_fp8_quantises_like_reference(device: str, fp8: torch.dtype) -> None:
    """Into an FP8 pool: x * (1 / scale), clamped to +-finfo.max, rounded to nearest even, bit for
    bit as the reference; values beyond the range saturate instead of becoming NaN / inf."""
    num_slots, tokens, heads, dim = 12, 5, 2, 64
    k_scale, v_scale = 0.37, 4.0
    info = torch.finfo(fp8)
    fused = torch.randn(tokens, 3, heads, dim, device=device).to(torch.bfloat16)
    k, v = fused[:, 1], fused[:, 2]  # strided bf16 views, as the model produces them
    k[0, 0, :3] = torch.tensor([1e5, -1e5, 0.0])  # 1e5 / 0.37 is beyond both fp8 ranges
    v[1, 1, :2] = torch.tensor([1e6, -1e6])
    k_buf = torch.zeros(num_slots, heads, dim, device=device).to(fp8)
    v_buf = torch.zeros_like(k_buf)
    k_ref, v_ref = k_buf.clone(), v_buf.clone()
    loc = torch.tensor([3, 7, 1, 10, 5], device=device)
    store_kv(k_buf, v_buf, loc, k, v, k_scale, v_scale)
    store_kv_ref(k_ref, v_ref, loc, k, v, k_scale, v_scale)
    assert torch.equal(k_buf.view(torch.uint8), k_ref.view(torch.uint8))
    assert torch.equal(v_buf.view(torch.uint8), v_ref.view(torch.uint8))
    k_deq = dequantize_kv(k_buf[loc], torch.float32, k_scale)
    v_deq = dequantize_kv(v_buf[loc], torch.float32, v_scale)
    assert torch.isfinite(k_deq).all() and torch.isfinite(v_deq).all()
    saturated = torch.tensor([info.max, -info.max, 0.0])
    assert torch.equal(k_deq[0, 0, :3].cpu(), saturated * k_scale)
    assert torch.equal(v_deq[1, 1, :2].cpu(), saturated[:2] * v_scale)
    # In range, a stored value is the input to within half an fp8 step.
    for x, deq, scale in ((k, k_deq, k_scale), (v, v_deq, v_scale)):
        ok = x.float().abs() <= info.max * scale
        torch.testing.assert_close(
            deq[ok], x.float()[ok], rtol=info.eps / 2, atol=info.tiny * info.eps * scale
        )
