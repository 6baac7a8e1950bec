"""The gated MLP activation on CPU (`activation.cpp`): `silu(gate) * up` of a gate_up output.

`silu_mul(y)`: y `[..., 2I]` fp32 -> `[..., I]`, the same element function as the one-call decode
step's MLP (`activation.h`), so that the layer path (prefill, verify) and a decode step agree
bitwise; None where the kernel cannot run (library missing, not fp32), and callers keep torch's
`F.silu(gate) * up` (within ~1 ulp of it).
"""

from __future__ import annotations

import torch

from radixlm.kernels.cpu.linear import _lib


def silu_mul(y: torch.Tensor) -> torch.Tensor | None:
    lib = _lib()
    if lib is None or y.dtype != torch.float32 or y.device.type != "cpu":
        return None
    i = y.shape[-1] // 2
    y2 = y.reshape(-1, 2 * i).contiguous()
    out = torch.empty(y2.shape[0], i, dtype=torch.float32)
    assert lib.rl_silu_mul(y2.data_ptr(), y2.shape[0], i, out.data_ptr()) == 0
    return out.view(*y.shape[:-1], i)
