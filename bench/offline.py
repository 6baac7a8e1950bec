"""`radixlm bench offline`: radixlm vs Hugging Face `transformers` generate, side by side in one
run, on the same model (identical weights) and prompts.

Workloads:
  mixed     32 prompts of mixed lengths with mixed output lengths (16..128 tokens, EOS ignored so
            both sides produce exactly the same number of tokens). transformers runs them as one
            padded batch up to the longest output (static batching), radixlm as one `generate`
            call (continuous batching).
  decode1   batch-1 decode tokens/s of both, against this machine's bandwidth ceiling (weight
            bytes per step over the read bandwidth measured in this run).
  --peer llama.cpp: decode1, decode1-sampled and prefill against llama.cpp on the same GGUF
            (bench/llamacpp_peer.py).
  prefix    one ~1k-token few-shot prefix + 32 different questions (short answers): radixlm with
            the radix cache on vs off; prints the cache hit rate against its theoretical maximum.
"""

from __future__ import annotations

import argparse
import random
import time
from typing import Any

from radixlm.bench.common import memory_read_bandwidth_gbs, print_table, synthetic_text, write_json


def mixed_workload(n: int, seed: int = 0) -> tuple[list[str], list[int]]:
    rng = random.Random(seed)
    prompts = [synthetic_text(rng, rng.randint(8, 300)) for _ in range(n)]
    outputs = [rng.choice([16, 32, 64, 96, 128]) for _ in range(n)]
    return prompts, outputs


def prefix_workload(n: int, prefix_words: int = 700) -> tuple[str, list[str]]:
    rng = random.Random(1)
    header = "Read the notes, then answer each question in a few words.\n\n"
    notes = synthetic_text(rng, prefix_words)
    questions = [
        f"\n\nQuestion {i}: what is the {rng.choice(['first', 'last', 'main'])} word about {synthetic_text(rng, 6)}?\nAnswer:"
        for i in range(n)
    ]
    return header + notes, questions


def _hf_generate(ref: Any, prompts: list[list[int]], new_tokens: int) -> float:
    """One padded batch (left padding), exactly `new_tokens` each; returns seconds."""
    import torch

    width = max(map(len, prompts))
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    t = time.perf_counter()
    with torch.no_grad():
        ref.model.generate(
            ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
            do_sample=False, pad_token_id=0,
        )  # fmt: skip
    return time.perf_counter() - t


def bench_mixed(engine: Any, ref: Any, n: int) -> dict[str, Any]:
    prompts, outputs = mixed_workload(n)
    params = [{"max_new_tokens": m, "temperature": 0, "ignore_eos": True} for m in outputs]
    engine.flush_cache()
    t = time.perf_counter()
    outs = engine.generate(prompts, params)
    ours = time.perf_counter() - t
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
    theirs = _hf_generate(ref, [ref.tokenizer.encode(p) for p in prompts], max(outputs))
    return {
        "workload": f"mixed ({n} prompts)",
        "output_tokens": tokens,
        "radixlm_s": ours,
        "transformers_s": theirs,
        "radixlm_tok_s": tokens / ours,
        "transformers_tok_s": tokens / theirs,
        "speedup": theirs / ours,
    }


def bench_decode1(engine: Any, ref: Any, new_tokens: int) -> dict[str, Any]:
    import torch

    prompt = "Write a long story about a lighthouse keeper and the sea."
    params = {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}
    engine.generate(prompt, {**params, "max_new_tokens": 4})
    times = []
    for chunk in engine.generate(prompt, params, stream=True):
        times.append(time.perf_counter())
        n = len(chunk["output_ids"])
    ours = (n - 1) / (times[-1] - times[0])
    ids = ref.tokenizer.encode(prompt)
    prefill = _hf_generate(ref, [ids], 1)
    total = _hf_generate(ref, [ids], new_tokens)
    theirs = (new_tokens - 1) / (total - prefill)
    weights = sum(p.numel() * p.element_size() for p in ref.model.parameters())
    embed = ref.model.get_input_embeddings().weight
    # Per step: every weight once (the tied embedding matrix is read by the LM head), not twice.
    step_bytes = (
        weights
        if ref.config.tie_word_embeddings
        else weights - embed.numel() * embed.element_size()
    )
    bw = memory_read_bandwidth_gbs()
    ceiling = bw * 1e9 / step_bytes
    del torch
    return {
        "workload": "batch-1 decode",
        "radixlm_tok_s": ours,
        "transformers_tok_s": theirs,
        "speedup": ours / theirs,
        "read_bw_gbs": bw,
        "ceiling_tok_s": ceiling,
        "radixlm_of_ceiling": ours / ceiling,
    }


def bench_prefix(n: int, answer_tokens: int) -> list[dict[str, Any]]:
    from radixlm.runtime.frontend.engine import Engine

    prefix, questions = prefix_workload(n)
    prompts = [prefix + q for q in questions]
    params = {"max_new_tokens": answer_tokens, "temperature": 0, "ignore_eos": True}
    rows = []
    for radix in (True, False):
        with Engine(disable_radix_cache=not radix, log_level="warning") as eng:
            eng.generate("warm up", {"max_new_tokens": 2})
            eng.flush_cache()
            t = time.perf_counter()
            outs = eng.generate(prompts, params)
            dt = time.perf_counter() - t
            tok = eng.tokenizer
        prompt_tokens = sum(o["meta_info"]["prompt_tokens"] for o in outs)
        cached = sum(o["meta_info"]["cached_tokens"] for o in outs)
        lens = [tok.encode(p) for p in prompts]
        shared = min(_common_prefix(lens[0], ids) for ids in lens[1:])
        max_cached = shared * (n - 1)
        rows.append(
            {
                "workload": f"shared prefix ({n} q, {shared}-token prefix)",
                "radix_cache": "on" if radix else "off",
                "seconds": dt,
                "hit_rate": cached / prompt_tokens,
                "hit_rate_of_max": (cached / max_cached) if max_cached else 0.0,
            }
        )
    rows[0]["speedup_from_cache"] = rows[1]["seconds"] / rows[0]["seconds"]
    return rows


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="radixlm bench offline", description=__doc__)
    parser.add_argument("--workloads", default="mixed,decode1,prefix")
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--decode-tokens", type=int, default=128)
    parser.add_argument("--answer-tokens", type=int, default=8)
    parser.add_argument("--json", default=None)
    parser.add_argument("--peer", default="transformers", choices=["transformers", "llama.cpp"])
    parser.add_argument("--model-path", default=None, help="GGUF file (llama.cpp peer)")
    parser.add_argument("--repeats", type=int, default=3, help="llama.cpp peer: median of N")
    parser.add_argument("--prefill-tokens", type=int, default=1024)
    parser.add_argument("--num-threads", type=int, default=None)
    parser.add_argument(
        "--dtype", default=None, help="radixlm's dtype (default: the GGUF's blocks on CPU)"
    )
    parser.add_argument(
        "--llamacpp-no-repack",
        action="store_true",
        help="llama.cpp peer without its extra buffer types (AMX / weight repacking): "
        "llama-cpp-python 0.3.36's AMX repack crashed in llama_decode on an AMX machine here",
    )
    args = parser.parse_args(argv)
    workloads = args.workloads.split(",")
    results: dict[str, Any] = {}
    if args.peer == "llama.cpp":  # NOTE: decode1, decode1-sampled, prefill (llamacpp_peer.py)
        from radixlm.bench.llamacpp_peer import run

        rows = run(
            workloads, args.model_path, args.repeats, args.decode_tokens, args.prefill_tokens,
            args.num_threads, {"dtype": args.dtype} if args.dtype else None,
            args.llamacpp_no_repack,
        )  # fmt: skip
        if rows is None:
            return 2
        write_json(args.json, {"vs_llama_cpp": rows})
        return 0
    if "mixed" in workloads or "decode1" in workloads:
        from radixlm.runtime.frontend.engine import Engine
        from radixlm.runtime.models.hf_reference import HFReference

        ref = HFReference.default()
        with Engine(log_level="warning", **({"dtype": args.dtype} if args.dtype else {})) as engine:
            mode = engine.get_server_info().get("weight_mode", "?")
            rows = []
            if "mixed" in workloads:
                rows.append(bench_mixed(engine, ref, args.num_prompts))
            if "decode1" in workloads:
                rows.append(bench_decode1(engine, ref, args.decode_tokens))
        results["vs_transformers"] = rows
        print_table(f"radixlm ({mode}) vs transformers fp32 (same model, same prompts, CPU)", rows)
    if "prefix" in workloads:
        results["shared_prefix"] = bench_prefix(args.num_prompts, args.answer_tokens)
        print_table("shared-prefix workload: radix cache on vs off", results["shared_prefix"])
    write_json(args.json, results)
    return 0
