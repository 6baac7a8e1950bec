"""How a forward becomes a replayable CUDA graph: the one capture procedure that the decode graphs
(cuda_graph_runner.py) and the speculative verify graphs (verify_graphs.py) share.

`GraphCapture(device)` owns one private CUDA-graph memory pool and one side stream. Each
`capture(fn)` runs `fn` twice on the side stream (compiles Triton kernels, settles the caching
allocator and cuBLAS workspaces), then records a third call into a `torch.cuda.CUDAGraph` in that
pool, and returns the graph with `fn`'s output tensor (static memory: every replay overwrites
it). All graphs of one `GraphCapture` share the pool: the decode and verify graphs of a runner
never run at the same time, so the pool holds the largest graph's working memory once, not the
sum (plus each graph's output tensor, which stays allocated).

`pool_bytes` is what the captures added to the device's reserved memory (the graph memory the
KV pool's sizing leaves room for, outside `mem_fraction_static`).

A `Capture` is anything with `capture(fn) -> (graph, out)` where `graph.replay()` re-runs the
recorded work into `out`: the CPU tests pass one that re-runs `fn` (tests/runtime/), so that the
static-buffer logic runs on CPU exactly as a replay would use it.

Ownership: a GraphCapture belongs to one ModelRunner; scheduler thread only.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Protocol

import torch


class Replayable(Protocol):
    def replay(self) -> None: ...


class Capture(Protocol):
    pool_bytes: int

    def capture(self, fn: Callable[[], torch.Tensor]) -> tuple[Replayable, torch.Tensor]: ...


class GraphCapture:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.pool = torch.cuda.graph_pool_handle()
        self.stream = torch.cuda.Stream(device)
        self.pool_bytes = 0

    @torch.inference_mode()
    def capture(self, fn: Callable[[], torch.Tensor]) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """`fn` warmed up twice, then captured into the shared pool: (graph, its output)."""
        reserved = torch.cuda.memory_reserved(self.device)
        current = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(current)
        with torch.cuda.stream(self.stream):
            for _ in range(2):  # compile Triton kernels, settle allocator and cuBLAS
                fn()
        current.wait_stream(self.stream)
        graph = torch.cuda.CUDAGraph()
        # NOTE: no garbage collection while capturing: a collected CUDAGraph (an earlier runner's,
        # freed with a reference cycle) resets itself, which is not permitted while a stream
        # captures: the capture is invalidated and cuBLAS fails inside it (seen on an H100 with a
        # draft runner built after a freed one).
        collecting = gc.isenabled()
        gc.disable()
        try:
            with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
                out = fn()
        finally:
            if collecting:
                gc.enable()
        torch.cuda.synchronize(self.device)
        self.pool_bytes += max(0, torch.cuda.memory_reserved(self.device) - reserved)
        return graph, out
