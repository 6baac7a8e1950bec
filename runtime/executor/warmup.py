"""Start-up warm-up of the extend (prefill) path, so that the first request is not slow on GPU.

Triton compiles a kernel the first time it meets a new specialisation (constexpr block sizes picked
from the shapes, integer arguments divisible by 16 or not, with or without a cached prefix). The
CUDA-graph capture already warms decode; `warm_extend(runner, shapes)` runs one EXTEND forward,
the logits and an argmax for each shape of `extend_shapes(...)` on throw-away KV slots, and
returns the seconds it took (logged by the caller). The shapes cover: one short prompt (odd
length), one with a cached prefix, a batch of mid-size prompts, and one chunk of the maximum
chunked-prefill size (the largest extend a server runs). Each forward's logits go through the
sampler's own argmax (a Triton kernel on GPU), and `warm_decode_inputs` compiles both variants
of the decode-input kernel (host ids or the overlapped step's device ids): the first batch after
start-up then compiles nothing (measured on the H200: docs/benchmarks.md, run 50).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, NamedTuple

import torch

from radixlm.kernels.decode_inputs import decode_inputs
from radixlm.runtime.executor.forward_batch import ForwardBatch, ForwardMode
from radixlm.runtime.sampling.sampler import argmax

if TYPE_CHECKING:
    from radixlm.runtime.executor.model_runner import ModelRunner


class ExtendShape(NamedTuple):
    requests: int
    new_tokens: int  # per request
    prefix: int  # cached tokens in front of each request's new tokens


def extend_shapes(chunk: int, max_running: int, capacity: int, row_len: int) -> list[ExtendShape]:
    """The extend shapes to warm, each within `capacity` KV slots in total and each request within
    a req_to_token row of `row_len` tokens (the context length: no request is longer)."""
    shapes = [
        ExtendShape(1, 17, 0),
        ExtendShape(1, 33, 64),
        ExtendShape(min(8, max_running), 128, 0),
        ExtendShape(min(4, max_running), 96, 256),
        ExtendShape(1, min(chunk, row_len), 0),
    ]
    return [
        s
        for s in shapes
        if s.requests * (s.new_tokens + s.prefix) <= capacity and s.new_tokens + s.prefix <= row_len
    ]


@torch.inference_mode()
def warm_extend(runner: ModelRunner, shapes: list[ExtendShape]) -> float:
    start = time.perf_counter()
    dev = runner.device

    def t(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=dev)

    for shape in shapes:
        total = shape.new_tokens + shape.prefix
        rows = [runner.req_to_token.alloc() for _ in range(shape.requests)]
        slots = runner.kv_pool.allocator.alloc(total * shape.requests)
        try:
            new_slots = []
            for i, row in enumerate(rows):
                mine = slots[i * total : (i + 1) * total]
                runner.req_to_token.write(row, 0, mine)
                new_slots.append(mine[shape.prefix :])
            n, b = shape.new_tokens, shape.requests
            ends = [(i + 1) * n - 1 for i in range(b)]
            batch = ForwardBatch(
                ForwardMode.EXTEND, b, t([1] * n * b),
                t([shape.prefix + j for _ in range(b) for j in range(n)]), torch.cat(new_slots),
                t(rows), t([total] * b), [total] * b, [shape.prefix] * b, [n] * b,
                t([shape.prefix] * b), t([n] * b), t([i * n for i in range(b)]), t(ends), ends,
            )  # fmt: skip
            out = runner.forward(batch)
            split = getattr(
                runner.model, "split_output", None
            )  # a draft head: (logit rows, features)
            argmax(runner.compute_logits(out if split is None else split(out)[0])).tolist()
        finally:
            runner.kv_pool.allocator.free(slots)
            for row in rows:
                runner.req_to_token.free(row)
    return time.perf_counter() - start


@torch.inference_mode()
def warm_decode_inputs(runner: ModelRunner) -> None:
    """Run the decode-input kernel (CUDA only) once per variant on a throw-away row and slot."""
    row = runner.req_to_token.alloc()
    slots = runner.kv_pool.allocator.alloc(1)
    try:
        cols = torch.tensor([[row], [0], [1]], dtype=torch.int64, device=runner.device)
        table, out = runner.req_to_token.table, runner.decode_input_buffer(1)
        decode_inputs(cols, None, slots, table, out)  # ids from the host
        decode_inputs(cols[:2].contiguous(), cols[2].contiguous(), slots, table, out)  # overlap
        torch.cuda.synchronize(runner.device)
    finally:
        runner.kv_pool.allocator.free(slots)
        runner.req_to_token.free(row)
