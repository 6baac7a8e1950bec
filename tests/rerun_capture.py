"""A CUDA-graph `Capture` for CPU tests (executor/graph_capture.py's protocol): it records the
work and re-runs it into the same output tensor on replay, so that static-buffer logic (decode and
verify graphs) runs on CPU exactly as a replay would use it."""

from __future__ import annotations

from collections.abc import Callable

import torch


class RerunGraph:
    def __init__(self, fn: Callable[[], torch.Tensor], out: torch.Tensor) -> None:
        self.fn, self.out = fn, out

    def replay(self) -> None:
        self.out.copy_(self.fn())  # NOTE: like a graph: the captured work into static memory


class RerunCapture:
    """A `Capture` for CPU: records the work (`fn`) and re-runs it on replay."""

    def __init__(self) -> None:
        self.pool_bytes = 0
        self.calls = 0

    def capture(self, fn: Callable[[], torch.Tensor]) -> tuple[RerunGraph, torch.Tensor]:
        self.calls += 1
        out = fn()
        return RerunGraph(fn, out), out
