"""The CPU rotary kernel (kernels/cpu/rotary.cpp) against the torch path of
runtime/models/rotary.py: bitwise, in place on views of a fused qkv, full and partial rotary."""

from __future__ import annotations

import pytest
import torch

from radixlm.kernels.cpu import build
from radixlm.kernels.cpu.rotary import rotary_inplace
from radixlm.runtime.models.rotary import _rotate

needs_lib = pytest.mark.skipif(
    build.isa() is None or build.compiler() is None, reason="no AVX2 CPU or no C++ compiler"
)


@needs_lib
@pytest.mark.parametrize(("head_dim", "rotary_dim"), [(64, 64), (128, 96)])
@pytest.mark.parametrize("t", [1, 40])  # 40: the threaded loop
def test_rotary_inplace_equals_torch_bitwise(head_dim: int, rotary_dim: int, t: int) -> None:
    heads, kv_heads, max_pos = 3, 1, 512
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim))
    freqs = torch.arange(max_pos).float()[:, None] * inv_freq[None, :]
    cos, sin = freqs.cos(), freqs.sin()
    qkv = torch.randn(t, (heads + 2 * kv_heads) * head_dim)
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    positions = torch.randint(0, max_pos, (t,))
    c, s = cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)
    want_q, want_k, want_v = _rotate(q, c, s, head_dim), _rotate(k, c, s, head_dim), v.clone()
    assert rotary_inplace(positions, q, k, cos, sin, head_dim)
    assert torch.equal(q, want_q) and torch.equal(k, want_k) and torch.equal(v, want_v)


@needs_lib
def test_rotary_inplace_declines_other_dtypes() -> None:
    cos = sin = torch.zeros(8, 32)
    q, k = torch.zeros(2, 64, dtype=torch.bfloat16), torch.zeros(2, 64, dtype=torch.bfloat16)
    assert not rotary_inplace(torch.zeros(2, dtype=torch.int64), q, k, cos, sin, 64)
