"""Guarded Triton import shared by every kernel module.

`import radixlm.kernels.<x>` must work where Triton is missing (the torch references are used on
CPU by the runtime), so kernel modules never import triton directly; they import `triton`, `tl`
and `jit` from here. Without Triton, `jit` turns a kernel into a stub that raises on launch and
`HAS_TRITON` is False.

# NOTE: kernel modules use `from __future__ import annotations`, so `BLOCK: tl.constexpr`
# annotations stay strings (Triton parses them) and are never evaluated when `tl` is None.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Hashable
from typing import Any

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover - exercised only where triton is absent
    triton = None
    tl = None
    HAS_TRITON = False


class _MissingTritonKernel:
    """Stands in for a `@triton.jit` kernel when Triton is not installed."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.__name__ = getattr(fn, "__name__", "kernel")

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        raise RuntimeError(f"Triton is not installed: cannot launch {self.__name__}")


def jit(fn: Callable[..., Any] | None = None, *, do_not_specialize: tuple[str, ...] = ()) -> Any:
    """`triton.jit` when Triton is importable, else a stub that raises on launch. Used bare
    (`@jit`) or with `do_not_specialize`: integer arguments that change from call to call (batch
    sizes, strides that follow them) and would otherwise compile one variant per value class
    (== 1, divisible by 16, other) at run time, and pointers to views whose 16-byte alignment
    depends on the batch (a row of a packed `[k, n]` buffer)."""
    if fn is None:
        return lambda f: jit(f, do_not_specialize=do_not_specialize)
    if HAS_TRITON:
        names = list(do_not_specialize)
        return triton.jit(fn, do_not_specialize=names, do_not_specialize_on_alignment=names)
    return _MissingTritonKernel(fn)


def interpreting() -> bool:
    """True when kernels run in Triton's CPU interpreter (`TRITON_INTERPRET=1`)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def require_triton() -> None:
    if not HAS_TRITON:
        raise RuntimeError("Triton is not installed; use the *_ref torch functions instead")


_FELL_BACK: set[Hashable] = set()


def launch_with_fallback(
    key: Hashable, launch: Callable[[Any], None], config: Any, fallback: Any
) -> None:
    """`launch(config)`; if the GPU lacks shared memory for it, use `fallback` from then on.

    # NOTE: tuned configs are chosen per (head_dim, dtype) but an untested combination could
    # still exceed shared memory; Triton raises OutOfResources at the first launch (eager warm-up,
    # before any CUDA-graph capture), and every later launch with the same `key` skips straight
    # to the fallback.
    """
    if key in _FELL_BACK:
        config = fallback
    try:
        launch(config)
    except Exception as exc:
        if type(exc).__name__ != "OutOfResources" or config == fallback:
            raise
        _FELL_BACK.add(key)
        launch(fallback)


@functools.cache
def _pdl_supported(device_index: int) -> bool:
    import torch

    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:
        return False
    if "launch_pdl" not in getattr(CUDAOptions, "__dataclass_fields__", {}):
        return False
    return torch.cuda.get_device_capability(device_index)[0] >= 9


@functools.cache
def _tma_supported(device_index: int) -> bool:
    import torch

    try:
        from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.get_device_capability(device_index)[0] >= 9


def tma_enabled(device: Any) -> bool:
    """Load GEMM tiles through host-side TMA tensor descriptors on this device? True on CUDA
    devices of compute capability >= 9 (Hopper) where Triton has `TensorDescriptor`, unless
    RADIXLM_DISABLE_TMA=1. (The interpreter runs descriptors too: tests pass `tma` explicitly.)"""
    if not HAS_TRITON or getattr(device, "type", None) != "cuda" or interpreting():
        return False
    if os.environ.get("RADIXLM_DISABLE_TMA", "0") not in ("", "0"):
        return False
    return _tma_supported(device.index if device.index is not None else 0)


def pdl_enabled(device: Any) -> bool:
    """Launch kernels with programmatic dependent launch (PDL) on this device?

    True on CUDA devices of compute capability >= 9 (Hopper) when Triton knows `launch_pdl`,
    unless RADIXLM_DISABLE_PDL=1. A kernel launched so may start before the previous kernel in
    the stream has finished: it must call `gdc_wait()` before it reads anything that kernel wrote.
    """
    if not HAS_TRITON or getattr(device, "type", None) != "cuda" or interpreting():
        return False
    if os.environ.get("RADIXLM_DISABLE_PDL", "0") not in ("", "0"):
        return False
    return _pdl_supported(device.index if device.index is not None else 0)


@jit
def gdc_wait():
    """Block until the previous grid in the stream has finished and its writes are visible (PTX
    `griddepcontrol.wait`; a no-op for a kernel not launched with PDL)."""
    tl.inline_asm_elementwise(
        "griddepcontrol.wait; // $0", "=r", [], dtype=tl.int32, is_pure=False, pack=1
    )


@jit
def gdc_launch_dependents():
    """Let the next PDL-launched kernel in the stream start now (PTX
    `griddepcontrol.launch_dependents`); it still waits for this grid in its own `gdc_wait`."""
    tl.inline_asm_elementwise(
        "griddepcontrol.launch_dependents; // $0", "=r", [], dtype=tl.int32, is_pure=False, pack=1
    )


@jit
def pdl_prologue(USE_PDL: tl.constexpr):
    """First statement of a kernel launched with `pdl_launch_args`: wait for the previous grid,
    then let the next one start."""
    if USE_PDL:
        gdc_wait()
        gdc_launch_dependents()


def pdl_launch_args(device: Any) -> dict[str, bool]:
    """Launch kwargs for a kernel with a `USE_PDL: tl.constexpr` parameter (see `pdl_enabled`)."""
    if pdl_enabled(device):
        return {"USE_PDL": True, "launch_pdl": True}
    return {"USE_PDL": False}


def next_power_of_2(n: int) -> int:
    """Smallest power of two >= n (n >= 1); pure python so heuristics work without Triton."""
    return 1 << max(0, int(n) - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@jit
def mma(a, b, PREC: tl.constexpr, UPCAST: tl.constexpr):
    """`tl.dot(a, b)` with fp32 accumulation.

    # NOTE: Triton's CPU interpreter computes bf16 dots on the raw uint16 bits (garbage), so
    # kernels pass UPCAST=True there (see `dot_flags`) to multiply in fp32 instead.
    """
    if UPCAST:
        acc = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        acc = tl.dot(a, b, input_precision=PREC)
    return acc


@jit
def online_softmax(qk, m_i, l_i):
    """One tile of an online (flash) softmax over the rows of `qk` [M, N] (log2 units; masked
    entries -inf): returns (p = exp2(qk - m_new), alpha = exp2(m_i - m_new), m_new, l_new), where
    m is the running row max and l the running sum of p; the caller rescales its accumulator
    by alpha before adding p's products."""
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(qk - m_new[:, None])
    return p, alpha, m_new, l_i * alpha + tl.sum(p, 1)


@jit
def soft_cap(x, cap):
    """`cap * tanh(x / cap)` (attention-logit soft-capping), tanh written as 2 sigmoid(2y) - 1."""
    return cap * (2.0 * tl.sigmoid(2.0 * x / cap) - 1.0)


# NOTE: a finite "minus infinity" (written as a literal in the kernels) for keys outside a window: a row whose tile holds only
# such keys gets finite garbage that the first real key's rescale (alpha = 0) wipes; every query
# row sees its own key, so one always comes. -inf there could give exp2(-inf - -inf) = NaN.
WINDOW_MASKED = -1.0e30


def dot_flags(dtype: object) -> dict[str, object]:
    """Constexpr kwargs (PREC, UPCAST) for `mma` given the operand torch dtype."""
    import torch

    is_fp32 = dtype == torch.float32
    return {
        "PREC": "ieee" if is_fp32 else "tf32",
        "UPCAST": interpreting() and dtype == torch.bfloat16,
    }


@jit
def quantize_fp8(
    x,
    inv_scale,
    FP8_MAX: tl.constexpr,
    FP8_MANT: tl.constexpr,
    FP8_TINY: tl.constexpr,
    FP8_EMULATE: tl.constexpr,
):
    """fp32 `clamp(x * inv_scale, -FP8_MAX, FP8_MAX)` (NaN stays NaN); cast the result to the fp8
    dtype described by the constexprs (see `fp8_flags`) with `.to(...)`.

    # NOTE: clamped explicitly because a cast of an out-of-range value gives NaN (e4m3fn) or inf
    # (e5m2) in torch. On the GPU the cast (`cvt.rn.satfinite`) rounds to nearest even; Triton's
    # CPU interpreter instead rounds half up without carrying into the exponent (7.94 -> 4.0), so
    # there (FP8_EMULATE) the value is first rounded to nearest even on the fp8 grid in fp32, which
    # the interpreter's cast then converts exactly. NaN is not converted faithfully there.
    """
    x = tl.clamp(x.to(tl.float32) * inv_scale, -FP8_MAX, FP8_MAX, propagate_nan=tl.PropagateNan.ALL)
    if FP8_EMULATE:
        SHIFT: tl.constexpr = 23 - FP8_MANT  # fp32 mantissa bits dropped
        bits = x.to(tl.int32, bitcast=True)
        # normal range: round the fp32 bits to nearest even (a carry into the exponent is right)
        rounded = (bits + ((1 << (SHIFT - 1)) - 1) + ((bits >> SHIFT) & 1)) & -(1 << SHIFT)
        # subnormal range (|x| < FP8_TINY): adding 2^k with ulp(2^k) = the fp8 subnormal step
        # rounds |x| to a multiple of that step (fp32 addition rounds to nearest even)
        magic = FP8_TINY * (1 << SHIFT)
        sub = (tl.abs(x) + magic) - magic
        sub = tl.where(bits < 0, -sub, sub)  # bits < 0: the sign bit (also for -0.0)
        y = tl.where(tl.abs(x) < FP8_TINY, sub, rounded.to(tl.float32, bitcast=True))
        x = tl.where(x == x, y, x)
    return x


_NOT_FP8: dict[str, object] = {"FP8_MAX": 0.0, "FP8_MANT": 0, "FP8_TINY": 0.0, "FP8_EMULATE": False}


def fp8_flags(dtype: object) -> dict[str, object]:
    """Constexpr kwargs (FP8_MAX, FP8_MANT, FP8_TINY, FP8_EMULATE) for `quantize_fp8` when a kernel
    stores into a tensor of torch `dtype`; FP8_MAX is 0.0 when `dtype` is not an fp8 dtype (the
    kernel then stores by a plain cast)."""
    import torch

    if dtype not in (torch.float8_e4m3fn, torch.float8_e5m2):
        return _NOT_FP8
    info = torch.finfo(dtype)
    return {
        "FP8_MAX": float(info.max),
        "FP8_MANT": round(-math.log2(info.eps)),
        "FP8_TINY": float(info.tiny),
        "FP8_EMULATE": interpreting(),
    }
