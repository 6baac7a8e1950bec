"""`Linear`: the decoder's one linear layer, whatever its weight form and kernel.

Ownership: a loader fills `weight` (and `bias`) in place (`runtime/models/weights.py`, or
`prepare_fp8_storage` first for FP8 rows); after loading, `gemm_select` may set `small_m_cfg`
(GPU), `quantize_fp8` may convert the weight, and `cpu_linear` may set `cpu_impl` (CPU). Every
model family builds its projections from this class (`llama.py` re-exports it).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.runtime.models.gemm_select import bucket_of


class Linear(nn.Module):
    """`y = x W^T (+ b)` with uninitialised parameters (weights always come from a loader).

    `gated_output`: W stacks a gated MLP's gate and up projections ([2 * out_features, in]) and
    the layer returns `act(gate) * up` ([.., out_features]), act named by `activation` ("silu":
    Llama; "gelu_tanh": Gemma); `fused` runs that activation as a Triton kernel (GPU). `small_m_cfg` (set on GPU by `gemm_select.select_decode_gemms`) holds, per
    decode batch-size bucket, the launch config of the Triton GEMV (`kernels.gemv`) that beat
    cuBLAS for this layer, or None to keep cuBLAS (gated: with `silu(gate) * up` in the GEMV's
    epilogue). After `quantize_fp8()` (`fp8`) the weight
    is float8_e4m3fn with an fp32 `weight_scale` per row (CPU: emulated) and the torch path is an
    FP8 GEMM (`runtime/models/fp8.py`); the GEMV then reads the FP8 rows (weight-only)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = False,
        gated_output: bool = False,
        fused: bool = False,
        activation: str = "silu",
    ) -> None:
        super().__init__()
        assert not (bias and gated_output), "a bias before the activation is not supported"
        rows = out_features * (2 if gated_output else 1)
        self.weight = nn.Parameter(torch.empty(rows, in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(rows), requires_grad=False) if bias else None
        self.gated_output = gated_output
        self.activation = activation
        self.fused = fused
        self.small_m_cfg: list[dict | None] | None = None
        self.fp8 = False
        self.weight_scale: torch.Tensor | None = None
        # NOTE: set on CPU after loading (runtime/models/cpu_linear.py): the kernel and weight
        # form this layer runs there; None elsewhere.
        self.cpu_impl: Callable[[torch.Tensor], torch.Tensor] | None = None

    def prepare_fp8_storage(self) -> None:
        """Make the weight receive an FP8 checkpoint's rows: float8_e4m3fn, with an fp32 scale
        per row (a part's per-tensor scale is broadcast over its rows). See
        `fp8.finish_fp8_checkpoint` for what happens after loading."""
        if self.weight.dtype == torch.float8_e4m3fn:
            return
        shape, device = self.weight.shape, self.weight.device
        self.weight = nn.Parameter(
            torch.empty(shape, dtype=torch.float8_e4m3fn, device=device), requires_grad=False
        )
        self.weight_scale = torch.ones(shape[0], dtype=torch.float32, device=device)
        self.fp8 = True

    def quantize_fp8(self) -> None:
        from radixlm.runtime.models.fp8 import dequantize_fp8, quantize_weight_fp8

        w_q, self.weight_scale = quantize_weight_fp8(self.weight.data)
        if self.weight.is_cuda:
            self.weight = nn.Parameter(w_q, requires_grad=False)
        else:  # NOTE: the CPU emulation keeps the model dtype (see runtime/models/fp8.py)
            self.weight.data = dequantize_fp8(w_q, self.weight_scale, self.weight.dtype)
        self.fp8 = True

    def gemv_cfg(self, m: int) -> dict | None:
        """The Triton GEMV config picked for a batch of m rows, None for cuBLAS."""
        bucket = None if self.small_m_cfg is None else bucket_of(m)
        return None if bucket is None else self.small_m_cfg[bucket]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.cpu_impl is not None:
            return self._activate(self.cpu_impl(x))
        cfg = self.gemv_cfg(x.shape[0])
        if cfg is None:
            return self.forward_default(x)
        from radixlm.kernels.gemv import gemv

        # NOTE: an FP8 layer's GEMV is weight-only (x unquantised); on CPU (emulated FP8) the
        # weight already holds the dequantised values.
        fp8_rows = self.weight.dtype == torch.float8_e4m3fn
        scale = {"w_scale": self.weight_scale} if fp8_rows else {}
        if self.gated_output:  # the activation runs in the GEMV's epilogue
            return gemv(x, self.weight, **cfg, **scale, gated=True, activation=self.activation)
        y = gemv(x, self.weight, **cfg, **scale)
        return y if self.bias is None else y + self.bias

    def forward_default(self, x: torch.Tensor) -> torch.Tensor:
        """The torch path (cuBLAS; an FP8 GEMM for an FP8 layer), whatever `small_m_cfg` holds."""
        if self.fp8:
            from radixlm.runtime.models.fp8 import fp8_linear

            return self._activate(fp8_linear(x, self.weight, self.weight_scale, self.bias))
        return self._activate(F.linear(x, self.weight, self.bias))

    def _activate(self, y: torch.Tensor) -> torch.Tensor:
        """`act(gate) * up` of a gated output, else y."""
        if not self.gated_output:
            return y
        from radixlm.kernels import activation

        if self.fused:
            return activation.act_and_mul(y, self.activation)
        if self.cpu_impl is not None and self.activation == "silu":
            from radixlm.kernels.cpu.activation import silu_mul

            out = silu_mul(y)  # NOTE: the one-call decode step's numbers (activation.h)
            if out is not None:
                return out
        return activation.act_and_mul_ref(y, self.activation)
