"""`radixlm bench offline --peer llama.cpp`: radixlm vs llama.cpp (llama-cpp-python) on one GGUF.

Both sides load the same GGUF file (`--model-path`, default: the default model's Q4_1 file), use
the same thread count (torch's, i.e. all cores unless `--num-threads`), see the same prompts and
run in the same process run, alternating: for each repetition radixlm then llama.cpp, and the
median of `--repeats` (>= 3) repetitions is reported, with the ratio radixlm / llama.cpp.

Workloads: `decode1` (batch-1 greedy decode tokens/s, prefill excluded) and `prefill` (a prompt of
`--prefill-tokens` tokens, tokens/s; radixlm's radix cache is flushed before each run).
llama-cpp-python is never a dependency: where `import llama_cpp` fails this prints how to get it
and returns 2. radixlm's mode is the Engine's default for the file unless `--dtype` /
`--quantization` say otherwise (e.g. `--dtype float32` against the F32 GGUF of the same model).
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

from radixlm.bench.common import print_table

_MISSING = (
    "llama.cpp peer unavailable: `import llama_cpp` failed ({err}). Install llama-cpp-python "
    "(it builds llama.cpp from source, ~12 min on 2 cores): pip install llama-cpp-python, or put "
    "an existing build on PYTHONPATH."
)
_PROMPT = "Write a long story about a lighthouse keeper and the sea."


def _ours_decode(engine: Any, ids: list[int], n: int) -> float:
    params = {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}
    times = []
    for chunk in engine.generate(input_ids=ids, sampling_params=params, stream=True):
        times.append((time.perf_counter(), len(chunk["output_ids"])))
    (t0, n0), (t1, n1) = times[0], times[-1]
    return (n1 - n0) / (t1 - t0)


def _ours_prefill(engine: Any, ids: list[int]) -> float:
    engine.flush_cache()
    t = time.perf_counter()
    engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 1, "temperature": 0})
    return len(ids) / (time.perf_counter() - t)


def _peer_decode(llm: Any, ids: list[int], n: int) -> float:
    llm.reset()
    stamps = []
    for i, _ in enumerate(llm.generate(ids, temp=0.0, top_k=1, reset=True)):
        stamps.append(time.perf_counter())
        if i + 1 >= n:
            break
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])


def _peer_prefill(llm: Any, ids: list[int]) -> float:
    llm.reset()
    t = time.perf_counter()
    llm.eval(ids)
    return len(ids) / (time.perf_counter() - t)


def run(
    workloads: list[str],
    model_path: str | None,
    repeats: int = 3,
    decode_tokens: int = 128,
    prefill_tokens: int = 1024,
    num_threads: int | None = None,
    engine_kwargs: dict[str, Any] | None = None,
) -> list[dict[str, Any]] | None:
    """Rows of the comparison, or None (message printed) when llama_cpp cannot be imported."""
    try:
        import llama_cpp
    except ImportError as e:  # NOTE: never a dependency; built on the development machine only
        print(_MISSING.format(err=e))
        return None
    from radixlm.runtime.engine import Engine
    from radixlm.runtime.models.default_model import default_model_path

    path = model_path or default_model_path()
    threads = num_threads or len(os.sched_getaffinity(0))
    repeats = max(repeats, 3)
    llm = llama_cpp.Llama(
        model_path=path, n_ctx=max(2048, prefill_tokens + 64), n_batch=max(prefill_tokens, 512),
        n_threads=threads, n_threads_batch=threads, verbose=False,
    )  # fmt: skip
    prompt_ids = llm.tokenize(_PROMPT.encode(), add_bos=False)
    filler = llm.tokenize(("the sea and the light " * prefill_tokens).encode(), add_bos=False)
    long_ids = filler[:prefill_tokens]
    rows = []
    kwargs = {"model_path": path, "num_threads": threads, "log_level": "warning"}
    with Engine(**kwargs, **(engine_kwargs or {})) as engine:
        mode = engine.get_server_info().get("weight_mode", "?")
        cases = []
        if "decode1" in workloads:
            cases.append(
                ("batch-1 decode", lambda: _ours_decode(engine, prompt_ids, decode_tokens),
                 lambda: _peer_decode(llm, prompt_ids, decode_tokens))
            )  # fmt: skip
        if "prefill" in workloads:
            cases.append(
                (f"prefill {len(long_ids)} tokens", lambda: _ours_prefill(engine, long_ids),
                 lambda: _peer_prefill(llm, long_ids))
            )  # fmt: skip
        for name, ours_fn, peer_fn in cases:
            ours_fn(), peer_fn()  # warm-up (kernel builds, caches)
            ours, peer = [], []
            for _ in range(repeats):  # alternating
                ours.append(ours_fn())
                peer.append(peer_fn())
            o, p = statistics.median(ours), statistics.median(peer)
            rows.append({
                "workload": name, "radixlm_mode": mode, "threads": threads,
                "radixlm_tok_s": o, "llama_cpp_tok_s": p, "ratio": o / p, "repeats": repeats,
            })  # fmt: skip
    print_table(f"radixlm vs llama.cpp ({os.path.basename(path)}, median of {repeats})", rows)
    return rows
