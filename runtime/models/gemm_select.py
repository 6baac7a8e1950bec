"""Per-shape choice between cuBLAS and the Triton small-batch GEMV for decode-sized linears.

Run once on the GPU after the weights are loaded (before CUDA-graph capture): for every distinct
weight shape it times `F.linear` and each `kernels.gemv.GEMV_CONFIGS` entry at M = 1, 4 and 8 and
keeps a Triton config only where it is clearly faster (>= 3 %), so the choice can never make a
layer slower than cuBLAS on the machine it runs on. Larger batches always use cuBLAS.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)

BUCKETS = (1, 4, 8)  # a batch of m rows uses the first bucket >= m
MIN_GAIN = 0.97


def bucket_of(m: int) -> int | None:
    for i, upper in enumerate(BUCKETS):
        if m <= upper:
            return i
    return None


def _time_choices(w: torch.Tensor, m: int) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """(best Triton config or None for cuBLAS, timing report) for `m` rows against weight `w`."""
    from triton.testing import do_bench

    from radixlm.kernels.gemv import GEMV_CONFIGS, gemv

    x = torch.randn(m, w.shape[1], device=w.device, dtype=w.dtype)
    base = do_bench(lambda: F.linear(x, w), warmup=5, rep=20, return_mode="median")
    best, best_ms = None, base
    for cfg in GEMV_CONFIGS:
        try:
            ms = do_bench(lambda cfg=cfg: gemv(x, w, **cfg), warmup=5, rep=20, return_mode="median")
        except Exception:  # a config that cannot run on this device is skipped
            continue
        if ms < best_ms and ms < base * MIN_GAIN:
            best, best_ms = cfg, ms
    report = {"m": m, "cublas_us": round(base * 1e3, 1), "best_us": round(best_ms * 1e3, 1)}
    return best, {**report, "triton": best is not None}


def select_decode_gemms(model: torch.nn.Module, linear_cls: type) -> dict[str, Any]:
    """Attach `small_m_impl` to every `linear_cls` module; returns a timing summary per shape."""
    from radixlm.kernels.gemv import gemv

    choices: dict[tuple[int, ...], list[dict[str, Any] | None]] = {}
    summary: dict[str, Any] = {}
    for module in model.modules():
        if not isinstance(module, linear_cls):
            continue
        w = module.weight
        key = tuple(w.shape)
        if key not in choices:
            picked = [_time_choices(w, m) for m in BUCKETS]
            choices[key] = [cfg for cfg, _ in picked]
            summary["x".join(map(str, key))] = [report for _, report in picked]
        module.small_m_impl = [
            None if cfg is None else functools.partial(gemv, w=w, **cfg) for cfg in choices[key]
        ]
    logger.info("decode GEMM choices: %s", summary)
    return summary
