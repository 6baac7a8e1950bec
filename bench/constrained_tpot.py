"""The decode-step cost of a grammar mask, for `radixlm bench constrained` (e2e section) and its
backends section: the same prompts unconstrained and with a mask on every row, on one Engine."""

from __future__ import annotations

import statistics
import time
from typing import Any

from radixlm.bench import constrained_workloads as W


def timed(engine: Any, prompts: list[str], params: dict[str, Any]) -> tuple[float, int, list]:
    f0 = engine.get_server_info()["forward_ct"]
    t = time.perf_counter()
    outs = engine.generate(prompts, [dict(params) for _ in prompts])
    wall = time.perf_counter() - t
    return wall, engine.get_server_info()["forward_ct"] - f0, outs


def bench_tpot(
    engine: Any, batch_sizes: list[int], new_tokens: int, repeats: int = 5
) -> dict[str, Any]:
    """ms per decode step, unconstrained vs a mask on every row, as `repeats` back-to-back pairs
    (the order alternating): step time = (t(new_tokens) - t(1 token)) / the forwards in between.
    Per mode the median step; the overhead is the median of the pairs' ratios, so a machine that
    drifts between pairs moves both sides of each ratio alike."""
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
        for rep in range(repeats):
            for name in list(modes)[:: 1 if rep % 2 == 0 else -1]:
                params = modes[name]
                t1, s1, _ = timed(engine, prompts, {**params, "max_new_tokens": 1})
                fixed = {**params, "max_new_tokens": new_tokens, "min_new_tokens": new_tokens}
                tn, sn, outs = timed(engine, prompts, fixed)
                steps[name].append(1e3 * (tn - t1) / max(sn - s1, 1))
                out[f"{name}_b{bs}_tokens"] = sum(o["meta_info"]["completion_tokens"] for o in outs)
        for name, values in steps.items():
            out[f"{name}_b{bs}_ms"] = statistics.median(values)
        ratios = [c / u - 1 for c, u in zip(steps["constrained"], steps["unconstrained"])]
        out[f"overhead_b{bs}"] = statistics.median(ratios)
        out[f"overhead_b{bs}_pairs"] = ratios
    return out
