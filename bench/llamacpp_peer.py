"""`radixlm bench offline --peer llama.cpp`: radixlm vs llama.cpp (llama-cpp-python) on one GGUF.

Both sides load the same GGUF file (`--model-path`, default: the default model's Q4_1 file), use
the same thread count (torch's, i.e. all cores unless `--num-threads`), see the same prompts and
run in the same benchmark run, alternating: for each repetition radixlm then llama.cpp, and the
median of `--repeats` (>= 3) repetitions is reported, with the ratio radixlm / llama.cpp.

Workloads: `decode1` (batch-1 greedy decode tokens/s, prefill excluded), `decode1-sampled` (the
same with llama.cpp's default sampler settings on both sides: temperature 0.8, top-k 40, top-p
0.95, min-p 0.05) and `prefill` (a prompt of `--prefill-tokens` tokens, tokens/s; radixlm's radix
cache is flushed before each run).
llama-cpp-python is never a dependency: where `llama_cpp` cannot be found this prints how to get it
and returns 2. llama.cpp runs in a child process of its own (spawned, torch never imported there), so that its
OpenMP runtime is not torch's bundled libgomp and a crash in it ends with a message, not the run.
radixlm's mode is the Engine's default for the file (a Q4_1 file: its blocks; an F32 file: fp32)
unless `--dtype` says otherwise (e.g. `--dtype float16` against the F16 GGUF of the same model).
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from typing import Any

from radixlm.bench.common import print_table

_MISSING = (
    "llama.cpp peer unavailable: {err}. Install llama-cpp-python "
    "(it builds llama.cpp from source, ~12 min on 2 cores): pip install llama-cpp-python, or put "
    "an existing build on PYTHONPATH."
)
_PROMPT = "Write a long story about a lighthouse keeper and the sea."
# llama-cpp-python's `generate` defaults
SAMPLED = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}


def _ours_decode(engine: Any, ids: list[int], n: int, sampled: bool = False) -> float:
    params = {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}
    if sampled:
        params.update(SAMPLED, seed=0)
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


class _Peer:
    """llama.cpp in a spawned child process; `call(op, *args)` runs `_OPS[op]` there."""

    def __init__(
        self, path: str, threads: int, n_ctx: int, n_batch: int, no_repack: bool = False
    ) -> None:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=_peer_main, args=(child, path, threads, n_ctx, n_batch, no_repack), daemon=True
        )
        self.proc.start()
        self.call("ping")

    def call(self, op: str, *args: Any) -> Any:
        try:
            self.conn.send((op, args))
            ok, value = self.conn.recv()
        except (EOFError, BrokenPipeError):
            self.proc.join(5)
            raise RuntimeError(
                f"llama.cpp peer process died during {op!r} (exit code {self.proc.exitcode})"
            ) from None
        if not ok:
            raise RuntimeError(f"llama.cpp peer: {value}")
        return value

    def close(self) -> None:
        if self.proc.is_alive():
            with contextlib.suppress(BrokenPipeError):
                self.conn.send(("stop", ()))
            self.proc.join(30)
        if self.proc.is_alive():
            self.proc.kill()


def _peer_main(
    conn: Any, path: str, threads: int, n_ctx: int, n_batch: int, no_repack: bool
) -> None:
    import llama_cpp

    if no_repack:  # NOTE: llama.cpp's extra buffer types (AMX / CPU weight repacking) off
        default = llama_cpp.llama_model_default_params

        def params() -> Any:
            p = default()
            p.use_extra_bufts = False
            return p

        llama_cpp.llama_model_default_params = params
        llama_cpp.llama_cpp.llama_model_default_params = params  # what `Llama()` calls

    llm = llama_cpp.Llama(
        model_path=path, n_ctx=n_ctx, n_batch=n_batch, n_threads=threads,
        n_threads_batch=threads, verbose=False,
    )  # fmt: skip
    ops = {
        "ping": lambda: True,
        "tokenize": lambda text: llm.tokenize(text.encode(), add_bos=False),
        "decode": lambda ids, n, sampled=False: _peer_decode(llm, ids, n, sampled),
        "prefill": lambda ids: _peer_prefill(llm, ids),
    }
    while True:
        op, args = conn.recv()
        if op == "stop":
            return
        try:
            conn.send((True, ops[op](*args)))
        except Exception as e:  # reported to the parent, which raises
            conn.send((False, repr(e)))


def _peer_decode(llm: Any, ids: list[int], n: int, sampled: bool) -> float:
    llm.reset()
    kwargs = {"temp": 0.0, "top_k": 1}
    if sampled:
        kwargs = {"temp": SAMPLED["temperature"], "top_k": SAMPLED["top_k"]}
        kwargs.update(top_p=SAMPLED["top_p"], min_p=SAMPLED["min_p"])
    stamps = []
    for i, _ in enumerate(llm.generate(ids, **kwargs, reset=True)):
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
    no_repack: bool = False,
) -> list[dict[str, Any]] | None:
    """Rows of the comparison, or None (message printed) when llama_cpp cannot be imported."""
    import importlib.util

    if importlib.util.find_spec("llama_cpp") is None:  # NOTE: never a dependency
        print(_MISSING.format(err="no module named 'llama_cpp'"))
        return None
    from radixlm.runtime.models.default_model import default_model_path

    path = model_path or default_model_path()
    threads = num_threads or len(os.sched_getaffinity(0))
    repeats = max(repeats, 3)
    n_ctx, n_batch = max(2048, prefill_tokens + 64), max(prefill_tokens, 512)
    peer = _Peer(path, threads, n_ctx, n_batch, no_repack)
    try:
        return _compare(peer, path, threads, workloads, repeats, decode_tokens, prefill_tokens,
                        engine_kwargs or {})  # fmt: skip
    finally:
        peer.close()


def _compare(
    peer: _Peer,
    path: str,
    threads: int,
    workloads: list[str],
    repeats: int,
    decode_tokens: int,
    prefill_tokens: int,
    engine_kwargs: dict[str, Any],
) -> list[dict[str, Any]]:
    from radixlm.runtime.frontend.engine import Engine

    prompt_ids = peer.call("tokenize", _PROMPT)
    filler = peer.call("tokenize", "the sea and the light " * prefill_tokens)
    long_ids = filler[:prefill_tokens]
    rows = []
    kwargs = {"model_path": path, "num_threads": threads, "log_level": "warning"}
    with Engine(**kwargs, **engine_kwargs) as engine:
        mode = engine.get_server_info().get("weight_mode", "?")
        cases = []
        if "decode1" in workloads:
            cases.append(
                ("batch-1 decode", lambda: _ours_decode(engine, prompt_ids, decode_tokens),
                 lambda: peer.call("decode", prompt_ids, decode_tokens))
            )  # fmt: skip
        if "decode1-sampled" in workloads:
            n = decode_tokens
            cases.append(
                ("batch-1 decode, sampled", lambda: _ours_decode(engine, prompt_ids, n, True),
                 lambda: peer.call("decode", prompt_ids, n, True))
            )  # fmt: skip
        if "prefill" in workloads:
            cases.append(
                (f"prefill {len(long_ids)} tokens", lambda: _ours_prefill(engine, long_ids),
                 lambda: peer.call("prefill", long_ids))
            )  # fmt: skip
        for name, ours_fn, peer_fn in cases:
            ours_fn(), peer_fn()  # warm-up (kernel builds, caches)
            ours_runs, peer_runs = [], []
            for _ in range(repeats):  # alternating
                ours_runs.append(ours_fn())
                peer_runs.append(peer_fn())
            o, p = statistics.median(ours_runs), statistics.median(peer_runs)
            rows.append({
                "workload": name, "radixlm_mode": mode, "threads": threads,
                "radixlm_tok_s": o, "llama_cpp_tok_s": p, "ratio": o / p, "repeats": repeats,
            })  # fmt: skip
    print_table(f"radixlm vs llama.cpp ({os.path.basename(path)}, median of {repeats})", rows)
    return rows
