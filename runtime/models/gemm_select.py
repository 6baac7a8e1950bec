"""Per-shape choice between cuBLAS and the Triton small-batch GEMV for decode-sized linears.

Run once on the GPU after the weights are loaded (before CUDA-graph capture). Layers are grouped
by weight shape; for each group and each decode bucket (M = 1, 4, 8) one CUDA graph per candidate
calls every layer of the group once, the way a decode step does: weights cold in L2 (one layer's
weight is read once per step), launch overhead gone, consecutive kernels free to overlap through
programmatic dependent launch. Each candidate runs the layer's own forward (for Llama's gated
gate_up: cuBLAS then the activation kernel, or the GEMV with the activation in its epilogue):
cuBLAS, or the Triton GEMV with each `kernels.gemv.GEMV_CONFIGS` entry; a Triton config is kept
only where it is clearly faster (>= 3 %), so that timing noise cannot flip a layer away from
cuBLAS. Larger batches always use cuBLAS.
An FP8 layer (`quantization="fp8"`) chooses the same way between its FP8 GEMM (cuBLASLt, inputs
quantised per token) and the weight-only FP8 GEMV with each `FP8_GEMV_CONFIGS` entry.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import torch

logger = logging.getLogger(__name__)

BUCKETS = (1, 4, 8)  # a batch of m rows uses the first bucket >= m
MIN_GAIN = 0.97
_REPLAYS = 10
_ROUNDS = 3  # best of: a noisy round must not flip the choice


def bucket_of(m: int) -> int | None:
    for i, upper in enumerate(BUCKETS):
        if m <= upper:
            return i
    return None


def pick_config(
    base_ms: float, timed: list[tuple[dict[str, Any], float | None]]
) -> tuple[dict[str, Any] | None, float]:
    """(config, ms) of the fastest Triton config, kept only if it beats cuBLAS (`base_ms`) by
    at least 1 - MIN_GAIN; else (None, base_ms): cuBLAS. A config timed None could not run."""
    best, best_ms = None, base_ms
    for cfg, ms in timed:
        if ms is not None and ms < best_ms and ms < base_ms * MIN_GAIN:
            best, best_ms = cfg, ms
    return best, best_ms


def group_by_shape(
    model: torch.nn.Module, linear_cls: type
) -> dict[tuple[Any, ...], list[torch.nn.Module]]:
    """The `linear_cls` modules of `model` by (out, in, gated, weight dtype): one choice each."""
    groups: dict[tuple[Any, ...], list[torch.nn.Module]] = {}
    for module in model.modules():
        if isinstance(module, linear_cls):
            key = (*module.weight.shape, module.gated_output, module.weight.dtype)
            groups.setdefault(key, []).append(module)
    return groups


def graph_time_ms(calls: list[Callable[[], Any]], device: torch.device) -> float:
    """GPU time of running `calls` once each in order, replayed from a CUDA graph (the best of
    `_ROUNDS` means over `_REPLAYS` replays)."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for call in calls:  # compile and warm up outside the capture
            call()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for call in calls:
            call()
    graph.replay()
    best = float("inf")
    for _ in range(_ROUNDS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(_REPLAYS):
            graph.replay()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / _REPLAYS)
    del graph
    return best


def _layer_ms(layers: list[torch.nn.Module], x: torch.Tensor, cfg: dict[str, Any] | None) -> float:
    """Time of every layer's forward on x with the GEMV config `cfg` (None: cuBLAS)."""
    for layer in layers:
        layer.small_m_cfg = [cfg] * len(BUCKETS)
    # NOTE: a tensor-parallel layer is timed without its collective (`local_forward`): ranks
    # time different layer groups (uneven head splits), so none may wait on another here.
    calls = [functools.partial(getattr(layer, "local_forward", layer), x) for layer in layers]
    return graph_time_ms(calls, x.device)


def _choose(
    layers: list[torch.nn.Module], m: int, dtype: torch.dtype
) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """(best Triton config or None for cuBLAS, timing report) for `m` rows through `layers`."""
    from radixlm.kernels.gemv import FP8_GEMV_CONFIGS, GEMV_CONFIGS

    w = layers[0].weight
    x = torch.randn(m, w.shape[1], device=w.device, dtype=dtype)
    base = _layer_ms(layers, x, None)
    timed: list[tuple[dict[str, Any], float | None]] = []
    for cfg in FP8_GEMV_CONFIGS if layers[0].fp8 else GEMV_CONFIGS:
        try:
            timed.append((cfg, _layer_ms(layers, x, cfg)))
        except Exception:  # a config that cannot run on this device is skipped
            logger.debug("GEMV config %s failed", cfg, exc_info=True)
            timed.append((cfg, None))
    best, best_ms = pick_config(base, timed)
    per_layer = 1e3 / len(layers)
    report = {
        "m": m,
        "cublas_us": round(base * per_layer, 1),
        "best_us": round(best_ms * per_layer, 1),
        "triton": best,
    }
    return best, report


def select_decode_gemms(
    model: torch.nn.Module, linear_cls: type, dtype: torch.dtype
) -> dict[str, Any]:
    """Set `small_m_cfg` of every `linear_cls` module (inputs of `dtype`, the model's); returns a
    timing report per group."""
    summary: dict[str, Any] = {}
    for (n, k, gated, w_dtype), layers in group_by_shape(model, linear_cls).items():
        picked = [_choose(layers, m, dtype) for m in BUCKETS]
        name = f"{n}x{k}{'_gated' if gated else ''}{'_fp8' if w_dtype.itemsize == 1 else ''}"
        summary[name] = [report for _, report in picked]
        for layer in layers:
            layer.small_m_cfg = [cfg for cfg, _ in picked]
    torch.cuda.empty_cache()
    logger.info("decode GEMM choices: %s", summary)
    return summary
