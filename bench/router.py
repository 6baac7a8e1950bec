"""`radixlm bench router`: routing policies side by side on a shared-prefix workload, through the
real router (`radixlm router` processes) in front of the same workers.

    radixlm bench router --launch-workers 2 --worker-args "--num-threads 1"
    radixlm bench router --worker-urls http://127.0.0.1:31001 http://127.0.0.1:31002

Workload: `--num-prefixes` distinct long documents (`--prefix-len` words) × `--questions` each
(shuffled, all sent at once up to `--max-concurrency`), streamed through `/generate` with fixed
output lengths (bench/serving.py's generator). For each policy, every worker's cache is flushed,
a fresh router starts, the workload runs, and the router stops. The hit rate is the workers' own
`cached_tokens` / prompt tokens. "single" sends the same workload straight to the first worker;
"vs ideal" = throughput / (workers × single's throughput). Policies alternate over `--repeats`
rounds (after a warm-up pass straight to each worker) and the median of each column is printed.
Numbers only count on a quiet machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shlex
import signal
import statistics
import subprocess
import sys
import time
from typing import Any

import httpx

from radixlm.bench.serving import (
    Request,
    run_benchmark,
    shared_prefix_dataset,
    summarize,
    word_tokens,
)

READY_TIMEOUT_S = 600.0


def _free_port() -> int:
    from radixlm.router.dp import free_port

    return free_port()


def _wait_health(url: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url} exited with {proc.returncode} while starting")
        try:
            if httpx.get(url + "/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise RuntimeError(f"{url} not healthy after {READY_TIMEOUT_S:.0f} s")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _run(args: argparse.Namespace, base_url: str, reqs: list[Request]) -> dict[str, Any]:
    ns = argparse.Namespace(base_url=base_url, backend="radixlm", model="default", api_key=None,
                            max_concurrency=args.max_concurrency, request_rate=float("inf"),
                            warmup_requests=0, seed=args.seed, ignore_eos=True)  # fmt: skip
    results, duration = asyncio.run(run_benchmark(ns, reqs))
    s = summarize(results, duration)
    return {
        "hit_rate": s["cached_tokens"] / max(1, s["total_input_tokens"]),
        "request_throughput": s["request_throughput"],
        "output_throughput": s["output_throughput"],
        "total_throughput": s["total_throughput"],
        "failed": s["failed"],
    }


def _one_policy(args: argparse.Namespace, workers: list[str], policy: str,
                reqs: list[Request]) -> dict[str, Any]:  # fmt: skip
    for url in workers:
        httpx.post(url + "/flush_cache", timeout=60).raise_for_status()
    if policy == "single":
        return _run(args, workers[0], reqs)
    port = _free_port()
    cmd = [sys.executable, "-m", "radixlm.cli", "router", "--port", str(port), "--policy", policy,
           "--log-level", "warning", "--worker-urls", *workers]  # fmt: skip
    proc = subprocess.Popen(cmd)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_health(url, proc)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not all(w["healthy"] for w in httpx.get(url + "/workers").json()["workers"]):
            if time.monotonic() > deadline:
                raise RuntimeError("the router's workers never all became healthy")
            time.sleep(0.1)
        return _run(args, url, reqs)
    finally:
        _stop(proc)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="radixlm bench router", description=__doc__.split("\n\n")[0])
    p.add_argument("--worker-urls", nargs="+", default=[], help="running `radixlm serve` workers")
    p.add_argument("--launch-workers", type=int, default=0, help="start this many workers here")
    p.add_argument("--worker-args", default="", help="flags of launched workers (one string)")
    p.add_argument("--policies", nargs="+", default=["single", "cache_aware", "round_robin"],
                   choices=("single", "cache_aware", "round_robin", "random", "shortest_queue"))  # fmt: skip
    p.add_argument("--num-prefixes", type=int, default=8)
    p.add_argument("--questions", type=int, default=16)
    p.add_argument("--prefix-len", type=int, default=1024, help="words (= tokens) per document")
    p.add_argument("--question-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--max-concurrency", type=int, default=16)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--output-file", default=None, help="write the rounds and medians as JSON")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    from radixlm.runtime.frontend.tokenizer import load_server_tokenizer
    from radixlm.runtime.server_args import ServerArgs

    words = word_tokens(load_server_tokenizer(ServerArgs()))
    reqs = shared_prefix_dataset(words, random.Random(args.seed), args.num_prefixes,
                                 args.questions, args.prefix_len, args.question_len, args.output_len)  # fmt: skip
    launched: list[subprocess.Popen] = []
    workers = list(args.worker_urls)
    try:
        for _ in range(args.launch_workers):
            port = _free_port()
            cmd = [sys.executable, "-m", "radixlm.runtime.server.launch_server", "--port",
                   str(port), "--log-level", "warning", *shlex.split(args.worker_args)]  # fmt: skip
            launched.append(subprocess.Popen(cmd))
            workers.append(f"http://127.0.0.1:{port}")
        for proc, url in zip(launched, workers[len(args.worker_urls) :]):
            _wait_health(url, proc)
        if not workers:
            raise SystemExit("give --worker-urls or --launch-workers")
        for url in workers:  # NOTE: a worker's first requests run slower (one-time set-up)
            _run(args, url, reqs[: min(len(reqs), 2 * args.questions)])
        rounds: list[dict[str, dict[str, Any]]] = []
        for r in range(args.repeats):
            order = args.policies if r % 2 == 0 else args.policies[::-1]
            rounds.append({policy: _one_policy(args, workers, policy, reqs) for policy in order})
    finally:
        for proc in launched:
            _stop(proc)
    table = {p: {k: statistics.median(rd[p][k] for rd in rounds) for k in rounds[0][p]}
             for p in args.policies}  # fmt: skip
    single = table.get("single", {}).get("total_throughput")
    print(f"{'=' * 20} Router benchmark: {len(workers)} worker(s), {len(reqs)} requests "
          f"({args.num_prefixes} prefixes x {args.questions}) {'=' * 20}")  # fmt: skip
    print(f"{'policy':<16}{'hit rate':>10}{'req/s':>10}{'out tok/s':>12}{'tot tok/s':>12}"
          f"{'vs ideal':>10}{'failed':>8}")  # fmt: skip
    for policy, m in table.items():
        ideal = ""
        if single and policy != "single":
            ideal = f"{m['total_throughput'] / (len(workers) * single):.2f}"
        print(f"{policy:<16}{m['hit_rate']:>10.3f}{m['request_throughput']:>10.3f}"
              f"{m['output_throughput']:>12.1f}{m['total_throughput']:>12.1f}{ideal:>10}"
              f"{int(m['failed']):>8}")  # fmt: skip
    if "cache_aware" in table and "round_robin" in table:
        rr = table["round_robin"]["hit_rate"]
        ratio = table["cache_aware"]["hit_rate"] / rr if rr else float("inf")
        print(f"cache_aware / round_robin hit rate: {ratio:.2f}x")
    if args.output_file:
        with open(args.output_file, "w") as f:
            json.dump({"args": vars(args), "rounds": rounds, "median": table}, f, indent=1)
    return 0 if all(m["failed"] == 0 for m in table.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
