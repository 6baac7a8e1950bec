"""`radixlm bench gpu --sections offline`: the issue's offline workload (512 requests x 1024 random
input tokens / 256 output tokens) through the engine, per variant (bf16, FP8 weights, FP8 KV
cache, both), next to the workload's own bound.

The bound is the batch-1 roofline's counterpart for this workload: the fewest seconds any
schedule could take on this GPU, run back to back, from two rates measured in the same run:
- the sustained bf16 GEMM rate of one decoder layer's linears at prefill's 8192 rows (run for
  ten seconds: under the H200's 700 W cap the clock settles near 1.45 GHz within a second or two,
  and the rate drops from ~800 to ~675 TFLOP/s; docs/benchmarks.md, run 42);
- the copy bandwidth (what decode attention can stream its KV cache at).
It counts the prefill's FLOPs (linears, causal attention, the LM head of each prompt's last row;
the last layer only projects K/V for the other rows) at the GEMM rate, the decode steps' linears (at least one read of the weights per step; of a mixture of experts, the
experts a batch of all the requests routes to), and
the KV bytes the decode steps read. It leaves out every elementwise kernel and all launch,
scheduling and sampling time, so no run can reach it.
"""

from __future__ import annotations

import argparse
import time
from typing import Any, NamedTuple

from radixlm.bench.gpu_common import (
    RESULTS,
    copy_bandwidth_gbs,
    engine,
    kv_bytes_per_token,
    linear_params_per_layer,
    log,
    random_prompts,
    weight_bytes,
)

INPUT_LEN, OUTPUT_LEN = 1024, 256

# Offline variants: the ServerArgs each one adds (results under "offline" + suffix).
OFFLINE_VARIANTS: dict[str, dict[str, Any]] = {
    "bf16": {},
    "fp8_w": {"quantization": "fp8"},
    "fp8_kv": {"kv_cache_dtype": "fp8_e4m3"},
    "fp8": {"quantization": "fp8", "kv_cache_dtype": "fp8_e4m3"},
}


class OfflineBound(NamedTuple):
    """Lower bounds, in seconds, of the three parts of an offline run."""

    prefill_s: float  # prefill FLOPs / GEMM rate
    decode_linear_s: float  # max(decode linears' FLOPs / GEMM rate, weight reads / bandwidth)
    decode_kv_s: float  # KV bytes read by the decode steps / bandwidth

    @property
    def seconds(self) -> float:
        return self.prefill_s + self.decode_linear_s + self.decode_kv_s


def offline_bound(
    cfg: Any,
    requests: int,
    input_len: int,
    output_len: int,
    gemm_flop_s: float,
    copy_byte_s: float,
    kv_dtype_bytes: int = 2,
) -> OfflineBound:
    """The bound of `requests` prompts of `input_len` tokens, `output_len` new tokens each (bf16
    linears at `gemm_flop_s`, bytes at `copy_byte_s`; see the module docstring)."""
    layers, hidden, vocab = cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size
    per_layer = linear_params_per_layer(cfg)
    linear = layers * per_layer
    # The last layer runs only its K/V projections for all but each prompt's last row (see
    # `LlamaForCausalLM.forward`).
    kv_proj = 2 * cfg.kv_size * hidden
    pairs = input_len * (input_len + 1) // 2  # causal (query, key) pairs of one prompt
    attention = 4 * cfg.q_size * ((layers - 1) * pairs + input_len)  # q.k, p.v: 2 FLOPs each
    prefill_linear = ((layers - 1) * per_layer + kv_proj) * input_len + per_layer - kv_proj
    prefill = requests * (2 * prefill_linear + attention + 2 * vocab * hidden)
    steps = output_len - 1  # the first new token comes out of the prefill
    decode_flops = requests * steps * 2 * (linear + vocab * hidden)
    # NOTE: a mixture of experts reads the experts the whole batch routes to (all requests decode
    # together here), not just the k of one token
    step_bytes = weight_bytes(cfg, batch=requests)
    decode_linear = max(decode_flops / gemm_flop_s, steps * step_bytes / copy_byte_s)
    # Decode step j (1 .. steps) attends over input_len + j tokens of each request.
    kv_tokens = requests * (steps * input_len + steps * (steps + 1) // 2)
    kv_bytes = kv_tokens * kv_bytes_per_token(cfg, kv_dtype_bytes)
    return OfflineBound(prefill / gemm_flop_s, decode_linear, kv_bytes / copy_byte_s)


def sustained_gemm_tflops(cfg: Any, seconds: float = 10.0, rows: int = 8192) -> float:
    """bf16 TFLOP/s of one decoder layer's four linears at `rows` tokens, run back to back for
    `seconds`; the mean over the second half (after the clock has settled under the power cap)."""
    import torch

    h, q, i = cfg.hidden_size, cfg.q_size, cfg.intermediate_size
    shapes = [(q + 2 * cfg.kv_size, h), (h, q), (2 * i, h), (h, i)]  # (out, in): qkv o gate_up down
    inputs = {k: torch.randn(rows, k, dtype=torch.bfloat16, device="cuda") for _, k in shapes}
    weights = [torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02 for n, k in shapes]
    flop = 2 * rows * sum(n * k for n, k in shapes) * 16
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    rates: list[float] = []
    t = time.perf_counter()
    while time.perf_counter() - t < seconds:
        start.record()
        for _ in range(16):
            for w in weights:
                torch.mm(inputs[w.shape[1]], w.t())
        end.record()
        end.synchronize()
        rates.append(flop / (start.elapsed_time(end) * 1e-3))
    del inputs, weights
    torch.cuda.empty_cache()
    tail = rates[len(rates) // 2 :]
    return sum(tail) / len(tail) / 1e12


def section_offline(args: argparse.Namespace) -> None:
    from radixlm.runtime.models.config import ModelConfig
    from radixlm.runtime.models.presets import PRESETS

    cfg = ModelConfig.from_hf_dict(PRESETS[args.model])
    n = args.offline_requests
    bw = RESULTS.setdefault("copy_bandwidth_gbs", copy_bandwidth_gbs())
    tflops = sustained_gemm_tflops(cfg)
    bounds = {}
    for kv_bytes in (2, 1):
        b = offline_bound(cfg, n, INPUT_LEN, OUTPUT_LEN, tflops * 1e12, bw * 1e9, kv_bytes)
        bounds[kv_bytes] = b
        name = "offline_bound" if kv_bytes == 2 else "offline_bound_fp8_kv"
        RESULTS[name] = {
            "gemm_tflops_sustained": round(tflops, 1),
            "copy_bandwidth_gbs": round(bw, 1),
            **{k: round(v, 2) for k, v in b._asdict().items()},
            "seconds": round(b.seconds, 2),
            "output_tok_s": round(n * OUTPUT_LEN / b.seconds, 1),
        }
        log(f"{name}: {RESULTS[name]}")
    for variant in args.offline_variants.split(","):
        key = "offline" if variant == "bf16" else f"offline_{variant}"
        settings = OFFLINE_VARIANTS[variant]
        res = RESULTS[key] = offline_run(args.model, n, settings)
        if "quantization" not in settings:  # the bound assumes bf16 GEMMs
            bound = bounds[1 if "kv_cache_dtype" in settings else 2]
            res["fraction_of_bound"] = round(bound.seconds / res["seconds"], 3)
        log(f"{key}: {res}")


def offline_run(model: str, n: int, variant: dict[str, Any]) -> dict[str, Any]:
    from radixlm.runtime.models.config import ModelConfig
    from radixlm.runtime.models.presets import PRESETS

    cfg = ModelConfig.from_hf_dict(PRESETS[model])
    prompts = random_prompts(n, INPUT_LEN, cfg.vocab_size, seed=7)
    eng = engine(model, cuda_graph_max_bs=512, max_running_requests=512, **variant)
    try:
        eng.generate(
            input_ids=prompts[:8], sampling_params={"max_new_tokens": 8, "ignore_eos": True}
        )
        eng.flush_cache()
        before = eng.get_server_info()
        t = time.perf_counter()
        outs = eng.generate(
            input_ids=prompts,
            sampling_params={"max_new_tokens": OUTPUT_LEN, "ignore_eos": True, "temperature": 0},
        )
        dt = time.perf_counter() - t
        after = eng.get_server_info()
        gen = sum(o["meta_info"]["completion_tokens"] for o in outs)
    finally:
        eng.shutdown()
    kinds = ("forward_ct", "extend_iterations", "extend_seconds", "decode_seconds")
    spent = {k: after[k] - before[k] for k in kinds}
    steps = spent["forward_ct"] - spent["extend_iterations"]  # decode forwards
    return {
        **variant,
        "requests": n,
        "seconds": round(dt, 2),
        "output_tok_s": round(gen / dt, 1),
        "total_tok_s": round((gen + n * INPUT_LEN) / dt, 1),
        # where the time went: extend (prefill) vs decode iterations of the scheduler
        "extend_batches": spent["extend_iterations"],
        "extend_seconds": round(spent["extend_seconds"], 2),
        "decode_steps": steps,
        "decode_seconds": round(spent["decode_seconds"], 2),
        "decode_avg_batch": round((gen - n) / max(1, steps), 1),
    }
