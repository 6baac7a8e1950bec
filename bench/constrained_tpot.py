"""The decode-step cost of a grammar mask, for `radixlm bench constrained` (e2e section) and its
backends section: the same prompts unconstrained and with a mask on every row, on one Engine."""

from __future__ import annotations

import statistics
import time
from typing import Any

from radixlm.bench import constrained_workloads as W


def timed(engine: Any, prompts: list[str], params: dict[str, Any]) -> tuple[float, int, list]:
    wall, info, outs = timed_info(engine, prompts, params)
    return wall, info["forward_ct"], outs


def timed_info(
    engine: Any, prompts: list[str], params: dict[str, Any]
) -> tuple[float, dict[str, float], list]:
    """(wall seconds, what the server's counters moved by, outputs) of one generate call."""
    keys = ("forward_ct", "grammar_mask_seconds", "grammar_mask_rows")
    keys += ("decode_seconds", "decode_iterations", "decode_model_seconds")
    before = engine.get_server_info()
    t = time.perf_counter()
    outs = engine.generate(prompts, [dict(params) for _ in prompts])
    wall = time.perf_counter() - t
    after = engine.get_server_info()
    return wall, {k: after[k] - before[k] for k in keys}, outs


def bench_tpot(
    engine: Any, batch_sizes: list[int], new_tokens: int, repeats: int = 5
) -> dict[str, Any]:
    """ms per decode step, unconstrained vs a mask on every row, as `repeats` back-to-back pairs
    (the order alternating): step time = (t(new_tokens) - t(1 token)) / the forwards in between.
    Per mode the median step; the overhead is the median of the pairs' ratios, so a machine that
    drifts between pairs moves both sides of each ratio alike. `constrained_b*_mask_ms`: the
    scheduler's own time in grammar masks per forward of the constrained runs.
    `overhead_b*_host`: the same pairs, counting only the scheduler's decode-iteration time
    outside the model's forward and logits calls: the two modes run the same forwards, so this
    is the grammar's cost without the forwards' noise (meaningful on CPU, where the forward is
    synchronous), divided by the unconstrained decode iteration."""
    modes = {
        "unconstrained": {"temperature": 0, "ignore_eos": True},
        # NOTE: a mask on every row every step; min_new_tokens keeps the length fixed.
        "constrained": {"temperature": 0, "regex": "[a-z ,.]+"},
    }
    out: dict[str, Any] = {}
    for bs in batch_sizes:
        prompts = W.extraction_prompts(bs)
        for params in modes.values():  # warm: the prefix, the grammar and its lexer states
            timed(engine, prompts, {**params, "max_new_tokens": new_tokens})
        steps: dict[str, list[float]] = {name: [] for name in modes}
        # per run: (ms per decode iteration, of it ms outside the model's calls)
        iters: dict[str, list[tuple[float, float]]] = {name: [] for name in modes}
        mask_ms: list[float] = []  # the constrained runs'
        for rep in range(repeats):
            for name in list(modes)[:: 1 if rep % 2 == 0 else -1]:
                params = modes[name]
                t1, s1, _ = timed(engine, prompts, {**params, "max_new_tokens": 1})
                fixed = {**params, "max_new_tokens": new_tokens, "min_new_tokens": new_tokens}
                tn, moved, outs = timed_info(engine, prompts, fixed)
                steps[name].append(1e3 * (tn - t1) / max(moved["forward_ct"] - s1, 1))
                n_iter = max(moved["decode_iterations"], 1)
                outside = moved["decode_seconds"] - moved["decode_model_seconds"]
                iters[name].append((1e3 * moved["decode_seconds"] / n_iter, 1e3 * outside / n_iter))
                if name == "constrained":
                    mask_ms.append(1e3 * moved["grammar_mask_seconds"] / moved["forward_ct"])
                out[f"{name}_b{bs}_tokens"] = sum(o["meta_info"]["completion_tokens"] for o in outs)
        for name, values in steps.items():
            out[f"{name}_b{bs}_ms"] = statistics.median(values)
        # NOTE: the mask work the scheduler timed itself (fills and one-token checks) per forward:
        # a noise-free share of the step, beside the wall-clock pairs
        out[f"constrained_b{bs}_mask_ms"] = statistics.median(mask_ms)
        ratios = [c / u - 1 for c, u in zip(steps["constrained"], steps["unconstrained"])]
        out[f"overhead_b{bs}"] = statistics.median(ratios)
        out[f"overhead_b{bs}_pairs"] = ratios
        host = [(c[1] - u[1]) / u[0] for c, u in zip(iters["constrained"], iters["unconstrained"])]
        out[f"overhead_b{bs}_host"] = statistics.median(host)
        out[f"overhead_b{bs}_host_pairs"] = host
    return out
