"""`python -m radixlm.bench.cpu_profile`: where one batch-1 decode step's time goes on CPU.

Drives a `ModelRunner` directly (no scheduler process): a prompt is prefilled, then `--steps`
greedy decode steps run under `torch.profiler`, and the table of operators by self CPU time is
printed, with the number of torch operators per decode step and the mean wall time per step. For
finding overhead (operator counts and shares mean something even on a loaded machine), not for
speed figures: those come from `radixlm bench offline` on a quiet machine (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import time

import torch

from radixlm.runtime.executor.forward_batch import ForwardBatch, ForwardMode
from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.models.loader import resolve_model
from radixlm.runtime.server_args import ServerArgs


def _t(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def _steps(
    runner: ModelRunner, prompt: list[int], steps: int, forced: list[int] | None
) -> tuple[list[int], list[torch.Tensor], float]:
    """Prefill `prompt`, then decode: each step feeds the last step's greedy token, or the next
    of `forced`; (greedy ids, the logits rows (copies; only when forced), seconds per step)."""
    n = len(prompt)
    row = runner.req_to_token.alloc()
    slots = runner.kv_pool.allocator.alloc(n + steps)
    runner.req_to_token.write(row, 0, slots)
    batch = ForwardBatch(
        ForwardMode.EXTEND, 1, _t(prompt), _t(list(range(n))), slots[:n], _t([row]), _t([n]),
        [n], [0], [n], _t([0]), _t([n]), _t([0]), _t([n - 1]), [n - 1],
    )  # fmt: skip
    kept: list[torch.Tensor] = []

    def pick(logits: torch.Tensor) -> int:
        if forced is not None:  # NOTE: a copy: the runner may reuse its logits buffer
            kept.append(logits[0].clone())
        return int(logits.argmax(-1)[0])

    out = [pick(runner.compute_logits(runner.forward(batch)))]
    start = time.perf_counter()
    for i in range(steps - 1):
        pos = n + i
        token = out[-1] if forced is None else forced[i]
        batch = ForwardBatch(
            ForwardMode.DECODE, 1, _t([token]), _t([pos]), slots[pos : pos + 1], _t([row]),
            _t([pos + 1]), [pos + 1],
        )  # fmt: skip
        out.append(pick(runner.compute_logits(runner.forward(batch))))
    per_step = (time.perf_counter() - start) / max(steps - 1, 1)
    runner.kv_pool.allocator.free(slots)
    runner.req_to_token.free(row)
    return out, kept, per_step


def decode_steps(runner: ModelRunner, prompt: list[int], steps: int) -> tuple[list[int], float]:
    """Prefill `prompt`, then `steps` greedy decode steps; (generated ids, seconds per step)."""
    out, _, per_step = _steps(runner, prompt, steps, None)
    return out, per_step


def forced_logits(runner: ModelRunner, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """The logits `[len(tokens), V]` of `prompt` followed by `tokens` (teacher-forced): row i
    predicts tokens[i]."""
    return torch.stack(_steps(runner, prompt, len(tokens), tokens)[1])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="radixlm.bench.cpu_profile", description=__doc__)
    p.add_argument("--model-path", default=None)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--quantization", default=None)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--rows", type=int, default=25, help="operators shown")
    a = p.parse_args(argv)
    args = ServerArgs(
        model_path=a.model_path, dtype=a.dtype, quantization=a.quantization, device="cpu",
        max_total_tokens=4096, max_running_requests=4,
    )  # fmt: skip
    runner = ModelRunner(args, resolve_model(a.model_path))
    prompt = [(i * 7919) % 1000 + 10 for i in range(a.prompt_len)]
    decode_steps(runner, prompt, 4)  # warm-up
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        _, per_step = decode_steps(runner, prompt, a.steps)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=a.rows))
    ops = sum(e.count for e in prof.key_averages())
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        decode_steps(runner, prompt, 1)  # the prefill alone, to subtract
    ops -= sum(e.count for e in prof.key_averages())
    print(f"{ops / max(a.steps - 1, 1):.0f} torch operators per decode step (logits included)")
    _, plain = decode_steps(runner, prompt, a.steps)
    print(f"{plain * 1e3:.1f} ms per decode step without the profiler ({per_step * 1e3:.1f} with)")


if __name__ == "__main__":
    main()
