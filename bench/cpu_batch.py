"""`python -m radixlm.bench.cpu_batch`: the CPU decode step's time at 1 row and at B rows.

Drives a `ModelRunner` directly (no scheduler, no server): B requests with `--prompt-len`-token
prompts are prefilled, then the same DECODE batch (of 1 request, then of all B) runs `--steps`
times; the median time of a step (the one-call C++ decode step where it applies, plus the LM head)
and the implied throughput ratio `B * t(1) / t(B)` (issue 20's "8 streams vs one" at kernel level,
before the server's own work per token) are printed. A speed figure only on a quiet machine.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from radixlm.runtime.executor.forward_batch import ForwardBatch, ForwardMode
from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.models.loader import resolve_model
from radixlm.runtime.server_args import ServerArgs


def _t(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def _prefill(runner: ModelRunner, prompt: list[int]) -> tuple[int, torch.Tensor]:
    """The prompt's K/V into the pool (one EXTEND); returns its req_to_token row and slots (one
    more than the prompt: the decode token's)."""
    n = len(prompt)
    row = runner.req_to_token.alloc()
    slots = runner.kv_pool.allocator.alloc(n + 1)
    runner.req_to_token.write(row, 0, slots)
    batch = ForwardBatch(
        ForwardMode.EXTEND, 1, _t(prompt), _t(list(range(n))), slots[:n], _t([row]), _t([n]),
        [n], [0], [n], _t([0]), _t([n]), _t([0]), _t([n - 1]), [n - 1],
    )  # fmt: skip
    runner.forward(batch)
    return row, slots


def step_ms(runner: ModelRunner, reqs: list[tuple[int, torch.Tensor]], n: int, steps: int) -> float:
    """Median ms of one DECODE step (+ logits) over the requests `reqs` (prompts of n tokens)."""
    b = len(reqs)
    batch = ForwardBatch(
        ForwardMode.DECODE, b, _t([11 + i for i in range(b)]), _t([n] * b),
        torch.stack([s[n] for _, s in reqs]), _t([r for r, _ in reqs]), _t([n + 1] * b),
        [n + 1] * b,
    )  # fmt: skip
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        runner.compute_logits(runner.forward(batch))
        times.append(time.perf_counter() - start)
    return statistics.median(times[2:]) * 1e3


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="radixlm.bench.cpu_batch", description=__doc__)
    p.add_argument("--model-path", default=None)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--steps", type=int, default=30)
    a = p.parse_args(argv)
    args = ServerArgs(
        model_path=a.model_path, dtype=a.dtype, device="cpu", max_total_tokens=8192,
        max_running_requests=max(a.batch, 2),
    )  # fmt: skip
    runner = ModelRunner(args, resolve_model(a.model_path))
    prompts = [
        [(i * 7919 + 31 * r) % 1000 + 10 for i in range(a.prompt_len)] for r in range(a.batch)
    ]
    reqs = [_prefill(runner, prompt) for prompt in prompts]
    one = step_ms(runner, reqs[:1], a.prompt_len, a.steps)
    many = step_ms(runner, reqs, a.prompt_len, a.steps)
    print(
        f"{runner.weight_mode}: decode step 1 row {one:.2f} ms, {a.batch} rows {many:.2f} ms: "
        f"{a.batch} streams / 1 stream = {a.batch * one / many:.2f}x"
    )


if __name__ == "__main__":
    main()
