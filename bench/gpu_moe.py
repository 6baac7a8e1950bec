"""`radixlm bench gpu --sections moe`: the fused-MoE kernel against its bound, on a preset's
expert shape (default: qwen3-30b-a3b, 128 experts, 8 active, dummy weights).

Batch 1: the bytes of the 8 active experts (gate_up + down) over the run's copy bandwidth, for
the config start-up picks (the sorting-free GEMV path or the sorted grouped GEMM), timed eagerly
(`us`, launch gaps included) and replayed from a CUDA graph as decode runs it (`graph_us`,
`graph_bw_frac`); up to T * k = 128 pairs also the other path's best (`other_path_graph_us`).
Large batch (4096 tokens, and 8192: a GPU prefill chunk; every expert busy): FLOPs
2 * T * k * 3 * H * I over the run's sustained GEMM rate (a cuBLAS bf16 matmul of the same run).
`graph_roofline_frac`: the larger of the two bounds (weight bytes, FLOPs) over the replayed time:
at 4096 tokens of Qwen3-30B-A3B the two are about equal. Each timed as the median of CUDA-event runs.
"""

from __future__ import annotations

import argparse
from typing import Any

from radixlm.bench.gpu_common import copy_bandwidth_gbs, log


def _time_ms(fn: Any, reps: int = 20) -> float:
    import torch

    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def _gemm_tflops() -> float:
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = _time_ms(lambda: a @ b)
    return 2 * 8192**3 / (ms * 1e-3) / 1e12


def section_moe(args: argparse.Namespace, results: dict[str, Any]) -> None:
    import torch

    from radixlm.kernels.fused_moe import (
        CANDIDATES,
        fused_moe,
        select_moe_config,
        time_moe_ms,
    )
    from radixlm.kernels.fused_moe_gemv import GEMV_CANDIDATES, GEMV_MAX_PAIRS, MoEGemvConfig
    from radixlm.runtime.models.config import ModelConfig
    from radixlm.runtime.models.moe import fused_moe_torch, route
    from radixlm.runtime.models.presets import PRESETS

    model = args.model if PRESETS[args.model].get("num_experts") else "qwen3-30b-a3b"
    cfg = ModelConfig.from_hf_dict(PRESETS[model])
    e, k, h, i = (
        cfg.num_experts,
        cfg.num_experts_per_tok,
        cfg.hidden_size,
        cfg.moe_intermediate_size,
    )
    dt = torch.bfloat16
    copies = 8  # distinct weight sets, cycled: cold in L2 like the model's 48 layers
    w13 = [torch.randn(e, 2 * i, h, device="cuda", dtype=dt) * 0.02 for _ in range(copies)]
    w2 = [torch.randn(e, h, i, device="cuda", dtype=dt) * 0.02 for _ in range(copies)]
    bw = results.setdefault("copy_bandwidth_gbs", copy_bandwidth_gbs())
    tflops = _gemm_tflops()
    out: dict[str, Any] = {"model": model, "gemm_tflops": round(tflops, 1)}
    for tokens in (1, 4, 8, 16, 64, 512, 4096, 8192):
        x = torch.randn(tokens, h, device="cuda", dtype=dt)
        weights, ids = route(torch.randn(tokens, e, device="cuda"), k, True, dt)
        kcfg = select_moe_config(h, i, e, k, tokens, dt)

        def runner(cfg: Any, x=x, weights=weights, ids=ids) -> Any:
            state = {"n": 0}

            def run() -> None:
                n = state["n"] = (state["n"] + 1) % copies
                fused_moe(x, w13[n], w2[n], weights, ids, cfg)

            return run

        ms = _time_ms(runner(kcfg))
        # NOTE: a decode step replays the MoE layers from a CUDA graph: time that too (one graph
        # of `copies` calls, each on other weights, so they come cold from HBM as across layers)
        graph_ms = time_moe_ms(runner(kcfg), calls=copies)
        active = int(ids.unique().numel())
        bytes_read = active * 3 * h * i * 2
        flops = 2 * tokens * k * 3 * h * i
        row = {
            "path": "gemv" if isinstance(kcfg, MoEGemvConfig) else "sorted",
            "config": list(kcfg),
            "us": round(ms * 1e3, 1),
            "graph_us": round(graph_ms * 1e3, 1),
            "bw_frac": round(bytes_read / (ms * 1e-3) / 1e9 / bw, 3),
            "graph_bw_frac": round(bytes_read / (graph_ms * 1e-3) / 1e9 / bw, 3),
            "flops_frac": round(flops / (ms * 1e-3) / 1e12 / tflops, 3),
        }
        row["graph_flops_frac"] = round(flops / (graph_ms * 1e-3) / 1e12 / tflops, 3)
        row["graph_roofline_frac"] = max(row["graph_bw_frac"], row["graph_flops_frac"])
        if tokens * k <= GEMV_MAX_PAIRS:  # the other path at its best, for comparison
            other = CANDIDATES if isinstance(kcfg, MoEGemvConfig) else GEMV_CANDIDATES
            row["other_path_graph_us"] = round(
                min(time_moe_ms(runner(c), calls=copies) for c in other) * 1e3, 1
            )
        if tokens <= 64:  # the torch reference, for scale
            row["torch_ref_us"] = round(
                _time_ms(
                    lambda x=x, weights=weights, ids=ids: fused_moe_torch(
                        x, w13[0], w2[0], weights, ids
                    ),
                    reps=5,
                )
                * 1e3,
                1,
            )
        out[f"t{tokens}"] = row
        log(f"fused moe {model} T={tokens}: {row}")
    results["moe"] = out
