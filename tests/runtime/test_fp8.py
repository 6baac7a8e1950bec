"""Online FP8 weights (`quantization="fp8"`): the per-channel weight quantisation, the FP8 linear
against the products it stands for, and a quantised model against its model-dtype twin."""

from __future__ import annotations

import torch

from radixlm.kernels.quant_fp8 import FP8_DTYPE, FP8_MAX, per_token_quant_fp8_ref
from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.models.fp8 import dequantize_fp8, fp8_linear, quantize_weight_fp8
from radixlm.runtime.models.llama import Linear
from radixlm.runtime.models.loader import resolve_model
from radixlm.runtime.server_args import ServerArgs
from tests_helpers import runner_logits


def test_weight_quantization_is_per_output_channel() -> None:
    w = torch.randn(6, 64) * torch.tensor([1e-4, 1e-2, 1.0, 3.0, 100.0, 1e4])[:, None]
    w_q, scale = quantize_weight_fp8(w)
    assert w_q.dtype == FP8_DTYPE and scale.shape == (6,) and scale.dtype == torch.float32
    assert torch.equal(w_q.float().abs().amax(1), torch.full((6,), FP8_MAX))
    err = (dequantize_fp8(w_q, scale, torch.float32) - w).abs()
    assert (err <= w.abs() * 2.0**-4 + scale[:, None] * 2.0**-9).all()


def test_fp8_gemm_equals_the_emulated_products() -> None:
    """`torch._scaled_mm` on FP8 operands (the GPU path) == the CPU emulation's plain GEMM over
    dequantised values == the formula x_q W_q^T * x_scale * w_scale, and all stay close to the
    unquantised product."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 64, generator=gen)
    w = torch.randn(48, 64, generator=gen)
    bias = torch.randn(48, generator=gen)
    w_q, w_scale = quantize_weight_fp8(w)
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # cuBLASLt on a GPU, else oneDNN
    real = fp8_linear(*(t.to(dev) for t in (x, w_q, w_scale, bias))).cpu()
    emulated = fp8_linear(x, dequantize_fp8(w_q, w_scale, torch.float32), w_scale, bias)
    x_q, x_scale = per_token_quant_fp8_ref(x.reshape(6, 64))
    formula = (x_q.float() @ w_q.float().T * x_scale * w_scale + bias).view(2, 3, 48)
    assert real.shape == (2, 3, 48)
    tol = 2e-2 if dev == "cuda" else 1e-5  # CUDA's row-wise scaled GEMM rounds to bf16
    torch.testing.assert_close(real, formula, rtol=tol, atol=tol)
    torch.testing.assert_close(emulated, formula, rtol=1e-5, atol=1e-5)
    exact = x @ w.T + bias
    assert (real - exact).norm() / exact.norm() < 0.06


def _runner(**kwargs) -> ModelRunner:
    args = ServerArgs(
        model_path="tiny-llama",
        load_format="dummy",
        max_total_tokens=256,
        max_running_requests=2,
        dtype="float32",
        random_seed=0,
        **kwargs,
    )
    return ModelRunner(args, resolve_model("tiny-llama", "dummy"))


def test_quantized_model_tracks_the_unquantized_one() -> None:
    plain, fp8 = _runner(), _runner(quantization="fp8")
    linears = [m for m in fp8.model.modules() if isinstance(m, Linear)]
    assert len(linears) == 2 * 4 and all(m.fp8 for m in linears)  # qkv, o, gate_up, down
    assert not any(m.fp8 for m in plain.model.modules() if isinstance(m, Linear))
    # Same dummy weights (same seed), rounded onto the FP8 grid of each row: stored as FP8 on a
    # GPU, dequantised on CPU (the emulation).
    w, w_fp8 = plain.model.layers[0].mlp.down_proj.weight, linears[3].weight
    scale = linears[3].weight_scale[:, None]
    if w_fp8.is_cuda:
        assert w_fp8.dtype == FP8_DTYPE
        w_fp8 = dequantize_fp8(w_fp8, scale[:, 0], w.dtype)
    else:
        assert torch.equal((w_fp8 / scale).to(FP8_DTYPE).float() * scale, w_fp8)
    assert not torch.equal(w, w_fp8)
    torch.testing.assert_close(w_fp8, w, rtol=2.0**-4, atol=float(scale.max()) * 2.0**-9)
    ids = torch.randint(3, 500, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    ref, got = runner_logits(plain, ids), runner_logits(fp8, ids)
    assert (got - ref).norm() / ref.norm() < 0.1
    cos = torch.nn.functional.cosine_similarity(got, ref, dim=-1)
    assert cos.min() > 0.99
