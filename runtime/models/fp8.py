"""Online FP8 quantisation (`quantization="fp8"`): weights per output channel, activations per token.

At load, every decoder `Linear` (q/k/v, o, gate/up, down; not the LM head, which keeps the model
dtype like vLLM's online FP8) swaps its weight for float8_e4m3fn rows and an fp32 scale per row:
W ~= W_q * w_scale[:, None]. At run time each input row is quantised with its own dynamic scale
(`kernels.quant_fp8`) and `torch._scaled_mm` multiplies the two FP8 operands with row-wise scales
(cuBLASLt FP8 GEMMs on Hopper/Ada GPUs), accumulating in fp32.

On CPU the FP8 GEMM is emulated: the weight keeps the model dtype but holds the dequantised FP8
values (W_q * w_scale), and each input is quantised and dequantised per token, so the products
are those of the FP8 path while the GEMM runs at fp32 speed (oneDNN's FP8 `_scaled_mm` measured
30x slower than fp32 there, and converting FP8 weights per call 15x). No memory is saved on CPU.

Data flow of one layer: x [M, K] -> (x_q [M, K] fp8, x_scale [M, 1]) -> _scaled_mm(x_q, W_q^T,
x_scale, w_scale [1, N]) -> y [M, N] in the model dtype (+ bias). At decode batches of <= 8
rows `gemm_select` may give a layer the weight-only FP8 GEMV instead (`kernels/gemv.py`: x left
unquantised), where that measured faster.

# NOTE: `_scaled_mm` needs K and N to be multiples of 16; a layer whose shape is not keeps its
# original weight (and the model stays correct, just not quantised there).
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.kernels._triton import HAS_TRITON
from radixlm.kernels.quant_fp8 import FP8_DTYPE, FP8_MAX, per_token_quant_fp8_ref

logger = logging.getLogger(__name__)

_ALIGN = 16


def quantize_weight_fp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(W_q [N, K] float8_e4m3fn, scale [N] fp32) with W ~= W_q * scale[:, None]."""
    wf = w.float()
    # NOTE: a multiply, not a division: CUDA divides by a scalar through its reciprocal, so this
    # gives the same scales on every device (an FP8 checkpoint made on CPU == online on a GPU).
    scale = wf.abs().amax(dim=1) * (1.0 / FP8_MAX)
    scale = torch.where(scale > 0, scale, 1.0)  # an all-zero row
    q = (wf / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q, scale


def can_quantize(weight: torch.Tensor) -> bool:
    n, k = weight.shape
    return n % _ALIGN == 0 and k % _ALIGN == 0


def dequantize_fp8(w_q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """W_q * scale[:, None] in `dtype`."""
    return (w_q.float() * scale[:, None]).to(dtype)


def fp8_linear(
    x: torch.Tensor, weight: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """`x W^T (+ bias)` with the input quantised per token; returns [..., N] in x's dtype.

    `weight` is either W_q (float8_e4m3fn, from `quantize_weight_fp8`): one FP8 GEMM; or, for
    the CPU emulation, W_q already dequantised into x's dtype (`w_scale` then unused): the same
    products of FP8 values, accumulated by a plain GEMM.
    """
    k = x.shape[-1]
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if x2.is_cuda and HAS_TRITON:
        from radixlm.kernels.quant_fp8 import per_token_quant_fp8

        x_q, x_scale = per_token_quant_fp8(x2)
    else:
        x_q, x_scale = per_token_quant_fp8_ref(x2)
    if weight.dtype != FP8_DTYPE:
        y = F.linear((x_q.float() * x_scale).to(x.dtype), weight)
    elif x2.shape[0] == 0:
        y = x2.new_empty((0, weight.shape[0]))
    else:
        # NOTE: row-wise scaling on CUDA produces bf16 only; fp16/fp32 models cast it back.
        out_dtype = torch.bfloat16 if x.is_cuda else x.dtype
        y = torch._scaled_mm(
            x_q, weight.t(), scale_a=x_scale, scale_b=w_scale.view(1, -1), out_dtype=out_dtype
        ).to(x.dtype)
    if bias is not None:
        y = y + bias
    return y.view(*x.shape[:-1], weight.shape[0])


def quantize_linears_fp8(model: nn.Module, linear_cls: type, skip: tuple[nn.Module, ...]) -> int:
    """Quantise every `linear_cls` module of `model` except those in `skip` and those already FP8
    (from an FP8 checkpoint), in place (frees each original weight as it goes); returns how many
    were quantised."""
    done = 0
    for name, module in model.named_modules():
        if not isinstance(module, linear_cls) or module.fp8 or any(module is s for s in skip):
            continue
        if not can_quantize(module.weight):
            logger.warning("fp8: %s %s stays unquantised", name, tuple(module.weight.shape))
            continue
        module.quantize_fp8()
        done += 1
    return done


def finish_fp8_checkpoint(
    model: nn.Module, linear_cls: type, dtype: torch.dtype, native: bool
) -> int:
    """After an FP8 checkpoint is loaded (`Linear.prepare_fp8_storage`): `native` (a GPU with
    FP8 GEMMs) keeps each FP8 layer's rows and row scales, as online quantisation leaves them.
    Otherwise, and for a layer `_scaled_mm` cannot take (K or N not a multiple of 16), the
    weights are dequantised into `dtype`: on CPU the layer stays `fp8` (the emulation above:
    inputs still quantised per token); on a GPU without FP8 support it becomes a plain layer.
    Returns how many layers keep FP8 products."""
    kept = 0
    for module in model.modules():
        if not isinstance(module, linear_cls) or module.weight.dtype != FP8_DTYPE:
            continue
        cpu = module.weight.device.type == "cpu"
        if native and not cpu and can_quantize(module.weight):
            kept += 1
            continue
        w = dequantize_fp8(module.weight.data, module.weight_scale, dtype)
        module.weight = nn.Parameter(w, requires_grad=False)
        module.fp8 = cpu
        kept += int(cpu)
    return kept
