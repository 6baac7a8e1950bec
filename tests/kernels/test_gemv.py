"""Small-batch GEMV kernels (plain and persistent) against their reference, the gated MLP
activation kernels (SiLU, tanh GELU) against torch, and the Linear layer's use of a selected kernel."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixlm.kernels._triton import pdl_enabled, pdl_launch_args
from radixlm.kernels.activation import act_and_mul, act_and_mul_ref
from radixlm.kernels.gemv import GEMV_CONFIGS, gemv, gemv_ref

PERSISTENT = next(c for c in GEMV_CONFIGS if c.get("per_sm"))
PLAIN = next(c for c in GEMV_CONFIGS if not c.get("per_sm"))


@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize(("n", "k"), [(40, 96), (33, 300)])
@pytest.mark.parametrize("config", [PERSISTENT, PLAIN], ids=["persistent", "plain"])
def test_gemv_matches_reference(device, m, n, k, config) -> None:
    x = torch.randn(m, k, device=device)
    w = torch.randn(n, k, device=device)
    # Several K tiles (and, persistent, several row blocks per program) even at small sizes.
    out = gemv(x, w, **{**config, "block_k": 64})
    torch.testing.assert_close(out, gemv_ref(x, w), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("inter", [40, 37])
@pytest.mark.parametrize("config", [PERSISTENT, PLAIN], ids=["persistent", "plain"])
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
def test_gated_gemv_is_the_product_then_the_activation(
    device, m, inter, config, activation
) -> None:
    """`gated=True` (a gated MLP's gate_up, odd I included): the activation of the plain product,
    the same roundings as the GEMV followed by the activation kernel."""
    x = (0.3 * torch.randn(m, 96, device=device)).bfloat16()
    w = (0.3 * torch.randn(2 * inter, 96, device=device)).bfloat16()
    cfg = {**config, "block_n": 4, "block_k": 32}  # 2 outputs per tile: a ragged last tile
    out = gemv(x, w, **cfg, gated=True, activation=activation)
    assert out.shape == (m, inter) and out.dtype == torch.bfloat16
    # The same sums as the plain GEMV's, rounded the same: the activation kernel's output on it.
    torch.testing.assert_close(out, act_and_mul(gemv(x, w, **cfg), activation), rtol=0, atol=0)
    # Another summation order may move a product one bf16 ulp (then amplified by the activation).
    ref = gemv_ref(x, w, gated=True, activation=activation)
    torch.testing.assert_close(out, ref, rtol=4e-2, atol=1e-2)


def test_gemv_bf16(device) -> None:
    x = torch.randn(2, 128, device=device).bfloat16()
    w = torch.randn(64, 128, device=device).bfloat16()
    out = gemv(x, w, block_n=16, block_k=64)
    torch.testing.assert_close(out.float(), gemv_ref(x, w).float(), rtol=2e-2, atol=5e-2)


@pytest.mark.parametrize("shape", [(3, 2 * 40), (2, 5, 2 * 1100), (0, 2 * 8)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
def test_act_and_mul_matches_torch(device, shape, dtype, activation) -> None:
    x = (4 * torch.randn(shape, device=device)).to(dtype)
    out = act_and_mul(x, activation)
    assert out.shape == (*shape[:-1], shape[-1] // 2) and out.dtype == dtype
    # Same roundings as torch (SiLU bit-equal on the H200); the interpreter's bf16 casts may land
    # one ulp away, and GELU's tanh (from exp here, torch's own tanh there) a few fp32 ulps.
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1.6e-2, "atol": 1e-3}
    torch.testing.assert_close(out, act_and_mul_ref(x, activation), **tol)


def test_pdl_is_off_off_cuda() -> None:
    assert not pdl_enabled(torch.device("cpu"))
    assert pdl_launch_args(torch.device("cpu")) == {"USE_PDL": False}


@pytest.fixture
def gemv_calls(monkeypatch) -> list[tuple[int, dict]]:
    """(rows, config) of every `kernels.gemv.gemv` call made through the module."""
    from radixlm.kernels import gemv as gv

    calls: list[tuple[int, dict]] = []

    def traced(x, w, **cfg):
        calls.append((x.shape[0], cfg))
        return gemv(x, w, **cfg)

    monkeypatch.setattr(gv, "gemv", traced)
    return calls


def test_linear_uses_the_selected_small_batch_kernel(device, gemv_calls) -> None:
    from radixlm.runtime.models.llama import Linear

    layer = Linear(96, 40, bias=True).to(device)
    layer.weight.data.normal_()
    layer.bias.data.normal_()
    x = torch.randn(3, 96, device=device)
    expected = layer(x)  # no kernel selected: the torch path
    cfg = {**PERSISTENT, "block_k": 64}
    layer.small_m_cfg = [None, cfg, None]
    torch.testing.assert_close(layer(x), expected, rtol=1e-4, atol=1e-4)
    assert gemv_calls == [(3, cfg)]
    layer(x[:1])  # bucket 0 keeps the default path
    assert gemv_calls == [(3, cfg)]


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
def test_gated_linear_uses_the_gated_small_batch_kernel(device, gemv_calls, activation) -> None:
    from radixlm.runtime.models.llama import Linear

    layer = Linear(96, 40, gated_output=True, fused=True, activation=activation).to(device)
    layer.weight.data.normal_()
    x = torch.randn(1, 96, device=device)
    expected = layer(x)  # cuBLAS, then the activation kernel
    cfg = {**PLAIN, "block_k": 64}
    layer.small_m_cfg = [cfg, None, None]
    out = layer(x)
    assert gemv_calls == [(1, {**cfg, "gated": True, "activation": activation})]
    assert out.shape == (1, 40)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
def test_gated_linear_fused_activation_matches_torch(device, activation) -> None:
    from radixlm.runtime.models.llama import Linear

    plain = Linear(96, 40, gated_output=True, activation=activation).to(device)
    plain.weight.data.normal_()
    fused = Linear(96, 40, gated_output=True, fused=True, activation=activation).to(device)
    fused.weight.data.copy_(plain.weight.data)
    x = torch.randn(5, 96, device=device)
    out = fused(x)
    assert out.shape == (5, 40)
    torch.testing.assert_close(out, plain(x), rtol=1e-5, atol=1e-5)
    gate, up = F.linear(x, plain.weight).chunk(2, dim=-1)  # the activation named, from torch
    act = F.silu(gate) if activation == "silu" else F.gelu(gate, approximate="tanh")
    torch.testing.assert_close(out, act * up, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("config", [PERSISTENT, PLAIN], ids=["persistent", "plain"])
def test_gemv_fp8_weights(device, config) -> None:
    """FP8 rows with a scale each (`quantization="fp8"`): the dequantised weights' product; gated,
    each of the interleaved gate / up rows keeps its own scale."""
    from radixlm.runtime.models.fp8 import dequantize_fp8, quantize_weight_fp8

    x = torch.randn(3, 300, device=device).bfloat16()
    w_q, scale = quantize_weight_fp8(torch.randn(34, 300, device=device))
    cfg = {**config, "block_k": 64}
    out = gemv(x, w_q, w_scale=scale, **cfg)
    assert out.dtype == torch.bfloat16 and out.shape == (3, 34)
    expected = x.float() @ dequantize_fp8(w_q, scale, torch.float32).T
    torch.testing.assert_close(out.float(), expected, rtol=2e-2, atol=5e-2)
    torch.testing.assert_close(out, gemv_ref(x, w_q, scale))
    gated = gemv(x, w_q, w_scale=scale, **cfg, gated=True)
    torch.testing.assert_close(gated, act_and_mul(out), rtol=0, atol=0)
