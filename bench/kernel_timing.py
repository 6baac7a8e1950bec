"""The rows, the guarded case runner and the timers shared by `radixlm bench kernels`' sections
(`kernel_checks`, `kernel_perf`); the CLI (`bench.kernels`) prints and saves the rows."""

from __future__ import annotations

import math
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class Row:
    section: str
    case: str
    value: float | None = None  # the measured number (error, ms, GB/s, ...)
    unit: str = ""
    baseline: float | None = None  # the side-by-side reference number, same unit
    ratio: float | None = None  # > 1 means the Triton kernel is better
    note: str = ""
    ok: bool = True


class Bench:
    def __init__(self, device: str, tiny: bool, verbose: bool) -> None:
        self.device, self.tiny, self.verbose = device, tiny, verbose
        self.rows: list[Row] = []

    def case(self, section: str, name: str, fn: Callable[..., Row], *args: Any, **kw: Any) -> None:
        """Run `fn(*args, **kw)` -> Row; an exception becomes a FAIL row and the run goes on."""
        try:
            out = fn(*args, **kw)
            for row in out if isinstance(out, list) else [out]:
                self.rows.append(row)
                print(format_row(row), flush=True)
        except Exception as exc:  # report and go on: one broken case must not end the run
            row = Row(section, name, ok=False, note=f"{type(exc).__name__}: {exc}"[:300])
            self.rows.append(row)
            print(format_row(row), flush=True)
            if self.verbose:
                traceback.print_exc()
        finally:
            if self.device == "cuda":
                torch.cuda.synchronize()
                torch.cuda.empty_cache()


HEADER = (
    f"{'section':7s} {'case':42s} {'value':>10s} {'unit':6s} {'baseline':>10s} {'ratio':>7s}  ok"
)


def format_row(r: Row) -> str:
    def num(x: float | None) -> str:
        return "-" if x is None else f"{x:.4g}"

    status = "ok" if r.ok else "FAIL"
    return (
        f"{r.section:7s} {r.case:42s} {num(r.value):>10s} {r.unit:6s} {num(r.baseline):>10s} "
        f"{num(r.ratio):>7s}  {status:4s} {r.note}"
    )


def time_ms(fn: Callable[[], Any]) -> float:
    """Median ms of `fn()` by `triton.testing.do_bench` (L2 flushed before every call)."""
    import triton

    try:
        return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))
    except TypeError:  # older triton without return_mode
        return float(triton.testing.do_bench(fn, warmup=25, rep=100, quantiles=[0.5])[0])


def _capture(fns: list[Callable[[], Any]], calls: list[Callable[[], Any]]) -> torch.cuda.CUDAGraph:
    """`calls` captured as one CUDA graph, after each of `fns` ran once outside the capture
    (compile and warm up)."""
    for fn in fns:
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in calls:
            fn()
    return graph


def time_graph_ms(fns: list[Callable[[], Any]]) -> float:
    """Median ms per call of `fns` (run in order) replayed as one CUDA graph.

    This is how the runtime runs decode steps: no Python/launch overhead. Several calls on
    different data (e.g. one per layer) keep a small problem from being served out of L2.
    """
    return time_ms(_capture(fns, fns).replay) / len(fns)


def time_graph_stream_ms(
    fns: list[Callable[[], Any]], min_calls: int = 64, reps: int = 10
) -> float:
    """Best-of-3 mean ms per call of `fns`, cycled to >= `min_calls` calls in one CUDA graph and
    replayed `reps` times back to back between two events: a kernel's steady state as the decode
    step runs it. Unlike `time_graph_ms`, no L2 flush precedes a replay (the timed kernels would
    first write its dirty lines back) and each graph launch is spread over >= `min_calls` calls;
    `fns` must cycle through more data than L2 holds."""
    calls = fns * -(-min_calls // len(fns))
    graph = _capture(fns, calls)
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = math.inf
    for _ in range(3):
        start.record()
        for _ in range(reps):
            graph.replay()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / reps / len(calls))
    return best
