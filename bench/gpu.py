"""`radixlm bench gpu`: the H200 suite in one command (prints JSON results; --json saves them).

Sections (`--sections`, comma-separated, all by default):
  parity    greedy tokens of the engine (triton backend + CUDA graphs) == transformers on small
            dummy-weight Llamas (fp32), and CUDA-graph replay == eager; small-llama-hd128 also
            decodes a 4500-token prompt
  hf        transformers `generate` on Llama-3-8B shapes (dummy bf16): batch 1, and batch 64 on
            the offline workload's lengths (1024 input / 256 new tokens by default)
  decode    radixlm batch-1 decode vs the bandwidth roofline (weights + KV bytes per step over the
            copy bandwidth measured in this run), batch 8 / 64, CUDA graphs on vs off; the model
            alone at batch 1 with FP8 weights against its own (halved-weight) roofline
            (`--decode-batch-sizes 1 --decode-graphs-only`: batch 1 with graphs only)
  offline   512 requests x 1024 random input tokens / 256 output tokens, throughput vs `hf`;
            in bf16, with FP8 weights, an FP8 KV cache, and both (`--offline-variants`); next to
            the workload's bound from the sustained GEMM rate and the copy bandwidth (gpu_offline)
  gemv      cuBLAS vs the Triton small-batch GEMV on the model's linear shapes (the engine keeps
            the faster per shape; see runtime/models/gemm_select.py)
  startup   start-up time with the extend warm-up, then the first three 64 x 512-token batches
            (bench/gpu_startup.py)
  moe       the fused-MoE kernel against its bound (bench/gpu_moe.py)
  spec      speculative decoding's verify step on the model runner, forced acceptance: cost per
            accepted token at k = 2..8 drafts (batch 1) and the crossover batch size 1..64 where
            verifying k + 1 rows per request stops paying; the verify forward is the step's tree
            verify batch, replaying its verify CUDA graph (`mode` says so) (bench/gpu_spec.py)
  kernels   `radixlm bench kernels --sections check,decode,extend` (full-shape checks, attention
            vs roofline and SDPA)
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import time
import traceback
from typing import Any

from radixlm.bench.gpu_common import (
    RESULTS,
    copy_bandwidth_gbs,
    engine,
    kv_bytes_per_token,
    log,
    random_prompts,
    weight_bytes,
)
from radixlm.bench.gpu_offline import INPUT_LEN, OFFLINE_VARIANTS, OUTPUT_LEN, section_offline


def section_parity(args: argparse.Namespace) -> None:
    import torch

    from radixlm.runtime.models.hf_reference import HFReference

    out: dict[str, Any] = {}
    for preset in ("small-llama", "small-llama-hd128"):
        ref = HFReference.load(preset, torch.float32, "dummy", device="cuda")
        vocab = ref.config.vocab_size
        rng = random.Random(1)
        prompts = [[rng.randrange(3, vocab) for _ in range(n)] for n in (5, 17, 33, 64, 100, 257)]
        prompts.append(prompts[4][:50] + prompts[1])  # shares a prefix (radix cache hit mid-block)
        if preset == "small-llama-hd128":  # a context past 4096 tokens
            prompts.append([rng.randrange(3, vocab) for _ in range(4500)])
        expected = [ref.greedy(p, 32) for p in prompts]
        del ref
        gc.collect()
        torch.cuda.empty_cache()
        params = {"max_new_tokens": 32, "temperature": 0, "ignore_eos": True}
        results = {}
        runs = [("graphs_fp32", {"dtype": "float32"})]
        runs.append(("eager_fp32", {"dtype": "float32", "disable_cuda_graph": True}))
        for name, kw in runs:
            eng = engine(preset, mem_fraction_static=0.3, cuda_graph_max_bs=16, **kw)
            try:
                first = eng.generate(input_ids=prompts, sampling_params=params)
                again = eng.generate(input_ids=prompts, sampling_params=params)  # warm cache
                results[name] = [o["output_ids"] for o in first]
                results[name + "_warm"] = [o["output_ids"] for o in again]
            finally:
                eng.shutdown()
        out[preset] = {
            f"{name}_vs_transformers": f"{sum(a == b for a, b in zip(got, expected))}/{len(prompts)}"
            for name, got in results.items()
        }
        if "eager_fp32" in results:
            out[preset]["graphs_equal_eager"] = results["graphs_fp32"] == results["eager_fp32"]
        log(f"parity {preset}: {out[preset]}")
    RESULTS["parity"] = out


def _decode_rate(eng: Any, batch: int, prompt_len: int, new: int, vocab: int) -> float:
    """Decode tokens/s at `batch`: total time minus prefill time (a 1-token run), per token."""
    prompts = random_prompts(batch, prompt_len, vocab, seed=batch)
    warm = {"max_new_tokens": 4, "ignore_eos": True, "temperature": 0}
    eng.generate(input_ids=random_prompts(batch, prompt_len, vocab, seed=99), sampling_params=warm)
    eng.flush_cache()
    t = time.perf_counter()
    eng.generate(
        input_ids=prompts,
        sampling_params={"max_new_tokens": 1, "ignore_eos": True, "temperature": 0},
    )
    prefill = time.perf_counter() - t
    eng.flush_cache()
    params = {"max_new_tokens": new, "ignore_eos": True, "temperature": 0}
    t = time.perf_counter()
    eng.generate(input_ids=prompts, sampling_params=params)
    total = time.perf_counter() - t
    return batch * (new - 1) / max(1e-9, total - prefill)


def _runner_decode_tok_s(
    model: str, batch: int, ctx: int, steps: int = 200, **variant: Any
) -> float:
    """Decode tokens/s of the model alone: graph replay + lm_head + argmax, back to back with no
    scheduler in between (what the GPU can do; the engine's rate over it is the host's share)."""
    import torch

    from radixlm.kernels.decode_inputs import decode_inputs
    from radixlm.runtime.executor.forward_batch import ForwardBatch, ForwardMode
    from radixlm.runtime.executor.model_runner import ModelRunner
    from radixlm.runtime.models.loader import resolve_model
    from radixlm.runtime.sampling.sampler import argmax
    from radixlm.runtime.server_args import ServerArgs

    args = ServerArgs(
        model_path=model,
        load_format="dummy",
        skip_tokenizer_init=True,
        max_running_requests=batch,
        max_total_tokens=batch * (ctx + 1) + 16,
        cuda_graph_max_bs=batch,
        **variant,
    )
    runner = ModelRunner(args, resolve_model(model, "dummy"))
    dev = runner.device
    rows = torch.arange(batch, device=dev)
    for b in range(batch):  # each request holds ctx + 1 slots of its own (slot 0 is padding)
        slots = torch.arange(1 + b * (ctx + 1), 1 + (b + 1) * (ctx + 1), device=dev)
        runner.req_to_token.write(b, 0, slots)
    pos = torch.full((batch,), ctx, dtype=torch.int64, device=dev)
    ids = torch.randint(0, runner.config.vocab_size, (batch,), device=dev)
    slots = runner.req_to_token.table[rows, pos].to(torch.int64)
    # assembled in the graphs' static inputs, as the scheduler does (replay copies nothing)
    inputs = decode_inputs(
        torch.stack([rows, pos, ids]), None, slots, runner.req_to_token.table,
        runner.decode_input_buffer(batch),
    )  # fmt: skip
    fb = ForwardBatch(ForwardMode.DECODE, batch, *inputs, [ctx + 1] * batch)

    def step() -> None:
        argmax(runner.compute_logits(runner.forward(fb)))

    for _ in range(10):
        step()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return batch * steps / (time.perf_counter() - t)


def section_decode(args: argparse.Namespace) -> None:
    import torch

    from radixlm.runtime.models.config import ModelConfig
    from radixlm.runtime.models.presets import PRESETS

    cfg = ModelConfig.from_hf_dict(PRESETS[args.model])
    bw = RESULTS.setdefault("copy_bandwidth_gbs", copy_bandwidth_gbs())
    out: dict[str, Any] = {"copy_bandwidth_gbs": round(bw, 1)}
    prompt_len, new = 128, 256
    avg_ctx = prompt_len + new / 2
    step_bytes = weight_bytes(cfg) + avg_ctx * kv_bytes_per_token(cfg)
    roofline = bw * 1e9 / step_bytes
    out["batch1_roofline_tok_s"] = round(roofline, 1)
    sizes = [int(b) for b in args.decode_batch_sizes.split(",")]
    for graphs in (True, False)[: 1 if args.decode_graphs_only else 2]:
        eng = engine(args.model, disable_cuda_graph=not graphs, cuda_graph_max_bs=max(sizes))
        try:
            for bs in sizes:
                rate = _decode_rate(eng, bs, prompt_len, new, cfg.vocab_size)
                key = f"decode_bs{bs}_{'graphs' if graphs else 'eager'}_tok_s"
                out[key] = round(rate, 1)
                log(f"{key}: {rate:.1f}")
        finally:
            eng.shutdown()
    out["batch1_fraction_of_roofline"] = round(out["decode_bs1_graphs_tok_s"] / roofline, 3)
    for bs in sorted({1, 64} & {1, *sizes}):
        rate = _runner_decode_tok_s(args.model, bs, int(avg_ctx))
        gc.collect()  # the runner's weights, KV pool and graphs go with it
        torch.cuda.empty_cache()
        out[f"decode_bs{bs}_model_only_tok_s"] = round(rate, 1)
        log(f"decode_bs{bs}_model_only_tok_s: {rate:.1f}")
    out["batch1_model_only_fraction_of_roofline"] = round(
        out["decode_bs1_model_only_tok_s"] / roofline, 3
    )
    # FP8 weights (`quantization="fp8"`): half the linear bytes, so their own roofline.
    fp8_roofline = bw * 1e9 / (weight_bytes(cfg, 2, 1) + avg_ctx * kv_bytes_per_token(cfg))
    rate = _runner_decode_tok_s(args.model, 1, int(avg_ctx), quantization="fp8")
    gc.collect()
    torch.cuda.empty_cache()
    out["decode_bs1_model_only_fp8_tok_s"] = round(rate, 1)
    out["batch1_fp8_roofline_tok_s"] = round(fp8_roofline, 1)
    out["batch1_model_only_fp8_fraction_of_fp8_roofline"] = round(rate / fp8_roofline, 3)
    log(f"decode_bs1_model_only_fp8_tok_s: {rate:.1f} (fp8 roofline {fp8_roofline:.1f})")
    RESULTS["decode"] = out


def section_hf(args: argparse.Namespace) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from radixlm.runtime.models.presets import PRESETS

    config = AutoConfig.for_model(**PRESETS[args.model])
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    out: dict[str, Any] = {}
    try:
        for bs, inp, new in ((1, 128, 64), (64, INPUT_LEN, args.hf_new_tokens)):
            ids = torch.tensor(random_prompts(bs, inp, config.vocab_size, seed=bs), device="cuda")
            gen_kw = dict(do_sample=False, pad_token_id=0, attention_mask=torch.ones_like(ids))
            with torch.no_grad():
                model.generate(ids[:, :16], max_new_tokens=4, min_new_tokens=4, **gen_kw)  # warm-up
                torch.cuda.synchronize()
                t = time.perf_counter()
                model.generate(ids, max_new_tokens=1, min_new_tokens=1, **gen_kw)
                torch.cuda.synchronize()
                prefill = time.perf_counter() - t
                t = time.perf_counter()
                model.generate(ids, max_new_tokens=new, min_new_tokens=new, **gen_kw)
                torch.cuda.synchronize()
                total = time.perf_counter() - t
            out[f"bs{bs}_output_tok_s"] = round(bs * new / total, 1)
            out[f"bs{bs}_decode_tok_s"] = round(bs * (new - 1) / max(1e-9, total - prefill), 1)
            log(f"transformers bs{bs}: {out}")
    finally:
        del model
        gc.collect()
        torch.cuda.empty_cache()
    RESULTS["hf"] = out


def section_gemv(args: argparse.Namespace) -> None:
    """cuBLAS vs the Triton small-batch GEMV on the model's linear shapes (what the engine picks),
    timed as the engine times them: CUDA graphs over enough copies of each weight to be cold in L2.
    """
    import torch

    from radixlm.runtime.models.config import ModelConfig
    from radixlm.runtime.models.gemm_select import select_decode_gemms
    from radixlm.runtime.models.llama import Linear
    from radixlm.runtime.models.presets import PRESETS

    cfg = ModelConfig.from_hf_dict(PRESETS[args.model])
    h, inter = cfg.hidden_size, cfg.intermediate_size
    shapes = [  # (in, out, gated: gate_up with the activation kernel after it)
        (h, cfg.q_size + 2 * cfg.kv_size, False),
        (cfg.q_size, h, False),
        (h, inter, True),
        (inter, h, False),
        (h, cfg.vocab_size, False),
    ]
    layers = torch.nn.ModuleList()
    with torch.device("cuda"):
        for k, n, gated in shapes:
            copies = max(2, -(-(512 << 20) // (n * k * 2)))  # >= 512 MiB: 10x the L2
            layers.extend(Linear(k, n, gated_output=gated, fused=True) for _ in range(copies))
    layers.to(torch.bfloat16)
    for layer in layers:
        layer.weight.data.uniform_(-0.02, 0.02)
    summary = select_decode_gemms(layers, Linear)
    del layers
    torch.cuda.empty_cache()
    bw = RESULTS.setdefault("copy_bandwidth_gbs", copy_bandwidth_gbs())
    rows = {}
    for key, report in summary.items():
        n, k = map(int, key.split("_")[0].split("x"))
        for r in report:
            gbs = {name: n * k * 2 / (r[name] * 1e-6) / 1e9 for name in ("cublas_us", "best_us")}
            row = rows[f"{key}_m{r['m']}"] = {
                **r,
                "cublas_bw_frac": round(gbs["cublas_us"] / bw, 3),
                "best_bw_frac": round(gbs["best_us"] / bw, 3),
            }
            log(f"gemv {key}_m{r['m']}: {row}")
    RESULTS["gemv"] = rows


def section_kernels(args: argparse.Namespace) -> None:
    from radixlm.bench import kernels as bench_kernels

    bench_kernels.main(["--sections", "check,decode,extend"])


def section_startup(args: argparse.Namespace) -> None:
    from radixlm.bench.gpu_startup import section_startup as run

    run(args, RESULTS)


def section_moe(args: argparse.Namespace) -> None:
    from radixlm.bench.gpu_moe import section_moe as run

    run(args, RESULTS)


def section_spec(args: argparse.Namespace) -> None:
    from radixlm.bench.gpu_spec import section_spec as run

    run(args, RESULTS)


SECTIONS = {
    "startup": section_startup,
    "moe": section_moe,
    "spec": section_spec,
    "gemv": section_gemv,
    "parity": section_parity,
    "hf": section_hf,
    "decode": section_decode,
    "offline": section_offline,
    "kernels": section_kernels,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="radixlm bench gpu",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--sections", default="parity,decode,offline,hf")
    parser.add_argument(
        "--model",
        default="llama-3-8b",
        help="dummy preset for the speed sections (also qwen3-8b, qwen3-30b-a3b, gemma-3-12b)",
    )
    parser.add_argument("--offline-requests", type=int, default=512)
    parser.add_argument(
        "--offline-variants",
        default=",".join(OFFLINE_VARIANTS),
        help=f"comma-separated, of {', '.join(OFFLINE_VARIANTS)}",
    )
    parser.add_argument(
        "--hf-new-tokens",
        type=int,
        default=OUTPUT_LEN,
        help="new tokens of transformers' batch-64 run (the offline workload's, by default)",
    )
    parser.add_argument(
        "--decode-batch-sizes", default="1,8,64", help="decode section: batch sizes (1 always)"
    )
    parser.add_argument(
        "--decode-graphs-only", action="store_true", help="decode section: skip the eager pass"
    )
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if "1" not in args.decode_batch_sizes.split(","):
        args.decode_batch_sizes = "1," + args.decode_batch_sizes
    import torch

    if not torch.cuda.is_available():
        print("radixlm bench gpu needs a CUDA device")
        return 1
    RESULTS["env"] = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "transformers": __import__("transformers").__version__,
    }
    log(f"env: {RESULTS['env']}")
    failed = []
    for name in args.sections.split(","):
        t = time.perf_counter()
        try:
            SECTIONS[name](args)
        except Exception:  # report and go on: one broken section must not cost the others
            failed.append(name)
            traceback.print_exc()
        log(f"section {name}: {time.perf_counter() - t:.1f} s")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(RESULTS, f, indent=2)
    hf = RESULTS.get("hf", {}).get("bs64_output_tok_s")
    for key, res in RESULTS.items():
        if hf and key.startswith("offline"):  # runs and their bounds
            res["speedup_vs_transformers_bs64"] = round(res["output_tok_s"] / hf, 2)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(RESULTS, f, indent=2)
    print(json.dumps(RESULTS, indent=2))
    if failed:
        print("FAILED sections:", ", ".join(failed))
    return 1 if failed else 0
