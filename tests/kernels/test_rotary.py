"""Rotary embedding: the reference against HF's rotate_half formula, the kernel against the reference."""

from __future__ import annotations

import pytest
import torch

from radixlm.kernels._triton import HAS_TRITON
from radixlm.kernels.rotary import (
    build_cos_sin_cache,
    rotary_embedding,
    rotary_embedding_ref,
    rotary_store_kv,
)
from radixlm.kernels.store_kv import store_kv_ref

needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")

TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (1e-3, 1e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}


def _cache(head_dim: int, max_pos: int, device: str, base: float = 10000.0) -> torch.Tensor:
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    return build_cos_sin_cache(inv_freq.to(device), max_pos)


def _hf_apply(x: torch.Tensor, positions: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
    """HF Llama: x * cos + rotate_half(x) * sin with cos/sin = cat(freqs, freqs) (fp32 here)."""
    half = x.shape[-1] // 2
    cs = cache[positions.long()]
    cos = torch.cat([cs[:, :half], cs[:, :half]], -1)[:, None]
    sin = torch.cat([cs[:, half:], cs[:, half:]], -1)[:, None]
    xf = x.float()
    rotated = torch.cat([-xf[..., half:], xf[..., :half]], -1)
    return (xf * cos + rotated * sin).to(x.dtype)


def test_reference_matches_hf_formula() -> None:
    q = torch.randn(6, 4, 64)
    k = torch.randn(6, 2, 64)
    pos = torch.tensor([0, 5, 3, 99, 1, 42])
    cache = _cache(64, 128, "cpu")
    exp_q, exp_k = _hf_apply(q, pos, cache), _hf_apply(k, pos, cache)
    rotary_embedding_ref(pos, q, k, cache)
    torch.testing.assert_close(q, exp_q, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(k, exp_k, atol=1e-5, rtol=1e-5)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim"), [(4, 4, 64), (8, 2, 128), (6, 1, 80)]
)
def test_rotary_matches_reference(
    device: str, dtype: torch.dtype, num_heads: int, num_kv_heads: int, head_dim: int
) -> None:
    tokens = 7
    # q and k as strided views into one fused qkv projection, as a model produces them.
    qkv = torch.randn(tokens, (num_heads + 2 * num_kv_heads) * head_dim, device=device).to(dtype)
    q = qkv[:, : num_heads * head_dim].view(tokens, num_heads, head_dim)
    k = qkv[:, num_heads * head_dim : (num_heads + num_kv_heads) * head_dim].view(
        tokens, num_kv_heads, head_dim
    )
    positions = torch.randperm(64)[:tokens].to(device)
    cache = _cache(head_dim, 64, device)
    q_ref, k_ref = q.clone(), k.clone()
    v_before = qkv[:, (num_heads + num_kv_heads) * head_dim :].clone()
    rotary_embedding(positions, q, k, cache)
    rotary_embedding_ref(positions, q_ref, k_ref, cache)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(q, q_ref, atol=atol, rtol=rtol)
    torch.testing.assert_close(k, k_ref, atol=atol, rtol=rtol)
    assert torch.equal(qkv[:, (num_heads + num_kv_heads) * head_dim :], v_before)  # v untouched


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim"), [(4, 4, 64), (8, 2, 128), (6, 1, 80)]
)
def test_rotary_store_kv_matches_reference(
    device: str, dtype: torch.dtype, num_heads: int, num_kv_heads: int, head_dim: int
) -> None:
    """The fused kernel equals rotary then store_kv: q/k rotated in place, k/v in the pool at
    their slots, every other slot untouched."""
    tokens, slots = 5, 16
    qkv = torch.randn(tokens, (num_heads + 2 * num_kv_heads) * head_dim, device=device).to(dtype)
    q, k, v = qkv.split([num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], 1)
    q, k, v = (x.view(tokens, -1, head_dim) for x in (q, k, v))
    positions = torch.tensor([3, 0, 17, 9, 63], device=device)
    loc = torch.tensor([7, 2, 11, 15, 4], device=device)
    cache = _cache(head_dim, 64, device)
    k_buf = torch.randn(slots, num_kv_heads, head_dim, device=device).to(dtype)
    v_buf = torch.randn(slots, num_kv_heads, head_dim, device=device).to(dtype)
    q_ref, k_ref, k_buf_ref, v_buf_ref = q.clone(), k.clone(), k_buf.clone(), v_buf.clone()
    rotary_embedding_ref(positions, q_ref, k_ref, cache)
    store_kv_ref(k_buf_ref, v_buf_ref, loc, k_ref, v)
    rotary_store_kv(positions, q, k, v, cache, k_buf, v_buf, loc)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(q, q_ref, atol=atol, rtol=rtol)
    torch.testing.assert_close(k, k_ref, atol=atol, rtol=rtol)
    torch.testing.assert_close(k_buf, k_buf_ref, atol=atol, rtol=rtol)
    assert torch.equal(v_buf, v_buf_ref)


@needs_triton
@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_rotary_store_kv_fp8_pool(device: str, fp8: torch.dtype) -> None:
    """Into an FP8 pool the fused kernel stores exactly what `store_kv` would store for its
    rotated k (rounded to k's dtype) and v: quantised with the scales, out-of-range saturated."""
    tokens, slots, heads, kv_heads, dim, dtype = 5, 16, 4, 2, 64, torch.bfloat16
    k_scale, v_scale = 0.37, 2.0
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, device=device).to(dtype)
    q, k, v = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], 1)
    q, k, v = (x.view(tokens, -1, dim) for x in (q, k, v))
    v[2, 1, :2] = torch.tensor([1e6, -1e6])  # beyond both fp8 ranges
    positions = torch.tensor([3, 0, 17, 9, 63], device=device)
    loc = torch.tensor([7, 2, 11, 15, 4], device=device)
    cache = _cache(dim, 64, device)
    k_buf = torch.zeros(slots, kv_heads, dim, device=device).to(fp8)
    v_buf = torch.zeros_like(k_buf)
    q_ref, k_ref = q.clone(), k.clone()
    rotary_embedding_ref(positions, q_ref, k_ref, cache)
    rotary_store_kv(positions, q, k, v, cache, k_buf, v_buf, loc, k_scale, v_scale)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(q, q_ref, atol=atol, rtol=rtol)
    torch.testing.assert_close(k, k_ref, atol=atol, rtol=rtol)
    k_buf_ref, v_buf_ref = torch.zeros_like(k_buf), torch.zeros_like(v_buf)
    store_kv_ref(k_buf_ref, v_buf_ref, loc, k, v, k_scale, v_scale)
    assert torch.equal(k_buf.view(torch.uint8), k_buf_ref.view(torch.uint8))
    assert torch.equal(v_buf.view(torch.uint8), v_buf_ref.view(torch.uint8))
    fp8_max = torch.finfo(fp8).max
    assert v_buf[loc[2], 1, :2].float().tolist() == [fp8_max, -fp8_max]


def _hf_apply_partial(
    x: torch.Tensor, positions: torch.Tensor, cache: torch.Tensor
) -> torch.Tensor:
    """HF Phi-3's partial rotary: the first cache-width dims rotated, the rest passed through."""
    rot = cache.shape[1]
    return torch.cat([_hf_apply(x[..., :rot], positions, cache), x[..., rot:]], dim=-1)


def test_partial_reference_matches_hf_formula() -> None:
    q, k = torch.randn(6, 4, 32), torch.randn(6, 2, 32)
    pos = torch.tensor([0, 5, 3, 99, 1, 42])
    cache = _cache(24, 128, "cpu")  # rotary_dim 24 of head_dim 32 (Phi-4-mini: 96 of 128)
    exp_q, exp_k = _hf_apply_partial(q, pos, cache), _hf_apply_partial(k, pos, cache)
    rotary_embedding_ref(pos, q, k, cache)
    torch.testing.assert_close(q, exp_q, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(k, exp_k, atol=1e-5, rtol=1e-5)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("head_dim", "rotary_dim"), [(32, 24), (16, 12), (64, 16)])
def test_partial_rotary_store_kv_matches_reference(
    device: str, dtype: torch.dtype, head_dim: int, rotary_dim: int
) -> None:
    """Partial rotary (rotary_dim < head_dim, half not a power of two for 24 and 12): q/k rotated
    in their first rotary_dim dims only, the rest untouched, in both kernels; the pool receives
    the whole k (rotated and passed-through dims) and v."""
    tokens, slots, heads, kv_heads = 5, 16, 4, 2
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, device=device).to(dtype)
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], 1)
    q, k, v = (x.view(tokens, -1, head_dim) for x in (q, k, v))
    positions = torch.tensor([3, 0, 17, 9, 63], device=device)
    loc = torch.tensor([7, 2, 11, 15, 4], device=device)
    cache = _cache(rotary_dim, 64, device)
    q0, k0 = q.clone(), k.clone()
    q_ref, k_ref = q.clone(), k.clone()
    rotary_embedding_ref(positions, q_ref, k_ref, cache)
    assert torch.equal(q_ref[..., rotary_dim:], q0[..., rotary_dim:])
    atol, rtol = TOL[dtype]
    rotary_embedding(positions, q, k, cache)
    torch.testing.assert_close(q, q_ref, atol=atol, rtol=rtol)
    torch.testing.assert_close(k, k_ref, atol=atol, rtol=rtol)
    assert torch.equal(q[..., rotary_dim:], q0[..., rotary_dim:])
    q.copy_(q0)
    k.copy_(k0)
    k_buf = torch.randn(slots, kv_heads, head_dim, device=device).to(dtype)
    v_buf = torch.randn(slots, kv_heads, head_dim, device=device).to(dtype)
    k_buf_ref, v_buf_ref = k_buf.clone(), v_buf.clone()
    store_kv_ref(k_buf_ref, v_buf_ref, loc, k_ref, v)
    rotary_store_kv(positions, q, k, v, cache, k_buf, v_buf, loc)
    torch.testing.assert_close(q, q_ref, atol=atol, rtol=rtol)
    torch.testing.assert_close(k_buf, k_buf_ref, atol=atol, rtol=rtol)
    assert torch.equal(k_buf[loc][..., rotary_dim:], k0[..., rotary_dim:])
    assert torch.equal(v_buf, v_buf_ref)


@needs_triton
def test_partial_rotary_store_kv_fp8_pool(device: str) -> None:
    """Into an FP8 pool the passed-through k dims are quantised like the rotated ones."""
    tokens, slots, heads, kv_heads, dim, rot, dtype = 5, 16, 4, 2, 32, 24, torch.bfloat16
    k_scale, v_scale = 0.37, 2.0
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, device=device).to(dtype)
    q, k, v = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], 1)
    q, k, v = (x.view(tokens, -1, dim) for x in (q, k, v))
    positions = torch.tensor([3, 0, 17, 9, 63], device=device)
    loc = torch.tensor([7, 2, 11, 15, 4], device=device)
    cache = _cache(rot, 64, device)
    k_buf = torch.zeros(slots, kv_heads, dim, device=device).to(torch.float8_e4m3fn)
    v_buf = torch.zeros_like(k_buf)
    rotary_store_kv(positions, q, k, v, cache, k_buf, v_buf, loc, k_scale, v_scale)
    k_buf_ref, v_buf_ref = torch.zeros_like(k_buf), torch.zeros_like(v_buf)
    store_kv_ref(k_buf_ref, v_buf_ref, loc, k, v, k_scale, v_scale)
    assert torch.equal(k_buf.view(torch.uint8), k_buf_ref.view(torch.uint8))
    assert torch.equal(v_buf.view(torch.uint8), v_buf_ref.view(torch.uint8))
