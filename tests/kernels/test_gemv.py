"""Small-batch GEMV kernel against its reference (odd sizes, split-K, fp32/bf16)."""

from __future__ import annotations

import pytest
import torch

from radixlm.kernels.gemv import GEMV_CONFIGS, gemv, gemv_ref


@pytest.mark.parametrize("m", [1, 3, 8])
@pytest.mark.parametrize(("n", "k"), [(40, 96), (33, 300)])
@pytest.mark.parametrize("config", [GEMV_CONFIGS[0], GEMV_CONFIGS[3]])
def test_gemv_matches_reference(device, m, n, k, config) -> None:
    x = torch.randn(m, k, device=device)
    w = torch.randn(n, k, device=device)
    small = {
        **config,
        "block_k": min(config["block_k"], 64),
    }  # several K tiles even when k is small
    out = gemv(x, w, **small)
    torch.testing.assert_close(out, gemv_ref(x, w), rtol=1e-4, atol=1e-4)


def test_gemv_bf16(device) -> None:
    x = torch.randn(2, 128, device=device).bfloat16()
    w = torch.randn(64, 128, device=device).bfloat16()
    out = gemv(x, w, block_n=16, block_k=64)
    torch.testing.assert_close(out.float(), gemv_ref(x, w).float(), rtol=2e-2, atol=2e-2)


def test_linear_uses_the_selected_small_batch_kernel(device) -> None:
    import functools

    from radixlm.runtime.models.llama import Linear

    layer = Linear(96, 40, bias=True).to(device)
    layer.weight.data.normal_()
    layer.bias.data.normal_()
    x = torch.randn(3, 96, device=device)
    expected = layer(x)
    calls = []

    def traced(x, **kw):
        calls.append(x.shape[0])
        return gemv(x, **kw)

    layer.small_m_impl = [None, functools.partial(traced, w=layer.weight, block_k=64), None]
    torch.testing.assert_close(layer(x), expected, rtol=1e-4, atol=1e-4)
    assert calls == [3]
    layer(torch.randn(1, 96, device=device))  # bucket 0 keeps the default path
    assert calls == [3]
