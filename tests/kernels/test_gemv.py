"""Small-batch GEMV kernels (plain and persistent, optionally with Llama's fused silu * up) against
their reference, and the Linear layer's use of a selected kernel."""

from __future__ import annotations

import functools

import pytest
import torch

from radixlm.kernels._triton import pdl_enabled, pdl_launch_args
from radixlm.kernels.gemv import GEMV_CONFIGS, gemv, gemv_ref

PERSISTENT = next(c for c in GEMV_CONFIGS if c.get("per_sm"))
PLAIN = next(c for c in GEMV_CONFIGS if not c.get("per_sm"))


@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize(("n", "k"), [(40, 96), (33, 300)])
@pytest.mark.parametrize("config", [PERSISTENT, PLAIN], ids=["persistent", "plain"])
@pytest.mark.parametrize("silu_mul", [False, True])
def test_gemv_matches_reference(device, m, n, k, config, silu_mul) -> None:
    x = torch.randn(m, 2 * k if silu_mul else k, device=device)
    w = torch.randn(n, k, device=device)
    # Several K tiles (and, persistent, several row blocks per program) even at small sizes.
    small = {**config, "block_k": 64}
    out = gemv(x, w, silu_mul=silu_mul, **small)
    torch.testing.assert_close(out, gemv_ref(x, w, silu_mul), rtol=1e-4, atol=1e-4)


def test_gemv_bf16(device) -> None:
    x = torch.randn(2, 256, device=device).bfloat16()
    w = torch.randn(64, 128, device=device).bfloat16()
    out = gemv(x, w, block_n=16, block_k=64, silu_mul=True)
    expected = gemv_ref(x, w, silu_mul=True)
    torch.testing.assert_close(out.float(), expected.float(), rtol=2e-2, atol=5e-2)


def test_pdl_is_off_off_cuda() -> None:
    assert not pdl_enabled(torch.device("cpu"))
    assert pdl_launch_args(torch.device("cpu")) == {"USE_PDL": False}


@pytest.mark.parametrize("gated", [False, True])
def test_linear_uses_the_selected_small_batch_kernel(device, gated) -> None:
    from radixlm.runtime.models.llama import Linear

    layer = Linear(96, 40, bias=not gated, gated_input=gated).to(device)
    layer.weight.data.normal_()
    if layer.bias is not None:
        layer.bias.data.normal_()
    x = torch.randn(3, 192 if gated else 96, device=device)
    expected = layer(x)  # no kernel selected: the torch path
    calls = []

    def traced(x, **kw):
        calls.append(x.shape[0])
        return gemv(x, **kw)

    impl = functools.partial(traced, w=layer.weight, block_k=64, silu_mul=gated)
    layer.small_m_impl = [None, impl, None]
    torch.testing.assert_close(layer(x), expected, rtol=1e-4, atol=1e-4)
    assert calls == [3]
    layer(x[:1])  # bucket 0 keeps the default path
    assert calls == [3]
