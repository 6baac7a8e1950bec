"""`radixlm bench kernels`: correctness at full shapes and speed of the Triton kernels.

Run on a CUDA device (the lead wires `main(argv)` into the CLI). Sections:
  check   every kernel against its torch reference at Llama-3-8B shapes (32 heads, 8 kv heads,
          head_dim 128, bf16) incl. 32k contexts and a CUDA-graph replay; max abs errors.
  decode  decode attention at 4k/32k context x batch 1/8/64: achieved KV bandwidth vs a
          device-to-device copy measured in the same run (read + write bytes).
  extend  extend attention (8 x 1024 new tokens, prefix 0 and 1024) vs dense SDPA on the same data.
  misc    rmsnorm / fused add-rmsnorm / rope / bitmask / store_kv vs their torch references.
Times are `triton.testing.do_bench` medians. Every case is guarded: a failure is reported in the
table and the run goes on. `--tiny` uses tiny shapes; without CUDA it sets TRITON_INTERPRET=1
(before any kernel module is imported) and runs only the checks, in Triton's interpreter.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
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
                print(_format(row), flush=True)
        except Exception as exc:  # report and go on: one broken case must not end the run
            row = Row(section, name, ok=False, note=f"{type(exc).__name__}: {exc}"[:300])
            self.rows.append(row)
            print(_format(row), flush=True)
            if self.verbose:
                traceback.print_exc()
        finally:
            if self.device == "cuda":
                torch.cuda.synchronize()
                torch.cuda.empty_cache()


HEADER = (
    f"{'section':7s} {'case':42s} {'value':>10s} {'unit':6s} {'baseline':>10s} {'ratio':>7s}  ok"
)


def _format(r: Row) -> str:
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


def _err(a: torch.Tensor, b: torch.Tensor) -> float:
    if torch.isnan(a).any():
        return math.inf
    return (a.float() - b.float()).abs().max().item()


TOL = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}

# ---------------------------------------------------------------------------------------- checks


def run_checks(bench: Bench) -> None:
    from radixlm.kernels import decode_attention as da
    from radixlm.kernels import extend_attention as ea
    from radixlm.kernels.testing import make_paged_batch

    dev, tiny = bench.device, bench.tiny
    dtypes = [torch.float32] if dev == "cpu" else [torch.bfloat16, torch.float16, torch.float32]
    if tiny:
        shapes = [(4, 2, 64), (8, 1, 80)]
        dec_lens, ext_case = [1, 37, 70], ([0, 20, 3], [33, 1, 17])
    else:
        shapes = [(32, 8, 128), (32, 8, 64), (28, 4, 96), (32, 32, 80)]
        dec_lens = [32768, 1, 4097, 900, 77, 16000, 2, 300]
        ext_case = ([0, 32768 - 512, 1000, 37], [1024, 512, 1, 300])

    def check_decode(h: int, kvh: int, d: int, dtype: torch.dtype, lens: list[int]) -> Row:
        batch = make_paged_batch([n - 1 for n in lens], [1] * len(lens), h, kvh, d, dtype, dev)
        args = batch.decode_args()
        out = torch.full_like(batch.q, float("nan"))
        da.decode_attention(*args, out=out)
        err = _err(out, da.decode_attention_ref(*args))
        return Row(
            "check",
            f"decode h{h}/{kvh} d{d} {str(dtype)[6:]} max{max(lens)}",
            err,
            "abs",
            TOL[dtype],
            None,
            "",
            err <= TOL[dtype],
        )

    def check_extend(h: int, kvh: int, d: int, dtype: torch.dtype, case: tuple) -> Row:
        batch = make_paged_batch(case[0], case[1], h, kvh, d, dtype, dev)
        args = batch.extend_args()
        out = torch.full_like(batch.q, float("nan"))
        ea.extend_attention(*args, batch.max_extend_len, out=out)
        err = _err(out, ea.extend_attention_ref(*args))
        name = f"extend h{h}/{kvh} d{d} {str(dtype)[6:]} pre{max(case[0])}"
        return Row("check", name, err, "abs", TOL[dtype], None, "", err <= TOL[dtype])

    h, kvh, d = shapes[0]
    for dtype in dtypes:
        bench.case("check", "decode", check_decode, h, kvh, d, dtype, dec_lens)
        bench.case("check", "extend", check_extend, h, kvh, d, dtype, ext_case)
    small_dec, small_ext = [1, 100, 333], ([0, 70, 129], [65, 1, 200])
    for h2, kvh2, d2 in shapes[1:]:
        bench.case("check", "decode", check_decode, h2, kvh2, d2, dtypes[0], small_dec)
        bench.case("check", "extend", check_extend, h2, kvh2, d2, dtypes[0], small_ext)
    if dev == "cuda":
        bench.case("check", "decode cuda graph", _check_graph, dec_lens, shapes[0])
    _check_misc(bench, dtypes)


def _check_graph(lens: list[int], shape: tuple[int, int, int]) -> Row:
    from radixlm.kernels import decode_attention as da
    from radixlm.kernels.testing import make_paged_batch

    h, kvh, d = shape
    batch = make_paged_batch(
        [n - 1 for n in lens], [1] * len(lens), h, kvh, d, torch.bfloat16, "cuda"
    )
    args = batch.decode_args()
    splits = da.choose_num_kv_splits(len(lens), max(lens), kvh)
    mid_o, mid_lse = da.alloc_decode_workspace(len(lens), h, d, splits, "cuda")
    out = torch.empty_like(batch.q)
    arrivals = torch.zeros(len(lens) * h, dtype=torch.int32, device="cuda")  # fused merge
    da.decode_attention_fwd(*args, out, mid_o, mid_lse, arrivals=arrivals)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        da.decode_attention_fwd(*args, out, mid_o, mid_lse, arrivals=arrivals)
    batch.seq_lens[0] = max(1, lens[0] // 2)  # new data (within the tokens it owns), same shapes
    out.fill_(float("nan"))
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    err = _err(out, da.decode_attention_ref(*args))
    if arrivals.any():  # the counters must come back to zero after every launch
        err = float("inf")
    tol = TOL[torch.bfloat16]
    return Row(
        "check", f"decode graph replay splits={splits}", err, "abs", tol, None, "", err <= tol
    )


def _check_misc(bench: Bench, dtypes: list[torch.dtype]) -> None:
    from radixlm.kernels import argmax as am
    from radixlm.kernels import rmsnorm as rn
    from radixlm.kernels import rotary as rp
    from radixlm.kernels import store_kv as sk
    from radixlm.kernels import token_bitmask as tb

    dev = bench.device
    hidden, vocab, tokens = (96, 1000, 5) if bench.tiny else (4096, 128256, 257)
    heads, kvh, d = (4, 2, 64) if bench.tiny else (32, 8, 128)
    dtype = dtypes[0]
    # bf16 may differ by one ulp (rounding order); under the interpreter it truncates.
    tol = 1e-5 if dtype == torch.float32 else 1.6e-2

    def rms() -> Row:
        x = torch.randn(tokens, hidden, device=dev).to(dtype)
        r = torch.randn_like(x)
        w = (1 + 0.1 * torch.randn(hidden, device=dev)).to(dtype)
        e1 = _err(rn.rmsnorm(x, w) / 4, rn.rmsnorm_ref(x, w) / 4)
        o, res = rn.fused_add_rmsnorm(x, r, w)
        eo, eres = rn.fused_add_rmsnorm_ref(x, r, w)
        err = max(e1, _err(o / 4, eo / 4), _err(res / 4, eres / 4))
        return Row(
            "check", f"rmsnorm+fused {str(dtype)[6:]}", err, "abs/4", tol, None, "", err <= tol
        )

    def rope() -> Row:
        """rotary_embedding, and rotary_store_kv (the pool's rows must equal the rotated k, v)."""
        q = torch.randn(tokens, heads, d, device=dev).to(dtype)
        k, v = torch.randn(2, tokens, kvh, d, device=dev).to(dtype)
        inv = 1.0 / 500000.0 ** (torch.arange(0, d, 2, device=dev).float() / d)
        cache = rp.build_cos_sin_cache(inv, 40000)
        pos = torch.randint(0, 40000, (tokens,), device=dev)
        q2, k2, q3, k3 = q.clone(), k.clone(), q.clone(), k.clone()
        rp.rotary_embedding(pos, q, k, cache)
        rp.rotary_embedding_ref(pos, q2, k2, cache)
        buf_k, buf_v = torch.zeros(2, 2 * tokens, kvh, d, device=dev, dtype=dtype)
        loc = torch.randperm(2 * tokens - 1, device=dev)[:tokens] + 1
        rp.rotary_store_kv(pos, q3, k3, v, cache, buf_k, buf_v, loc)
        pairs = [(q, q2), (k, k2), (q3, q2), (k3, k2), (buf_k[loc], k2)]
        err = max(_err(a / 4, b / 4) for a, b in pairs)
        if not torch.equal(buf_v[loc], v):
            err = float("inf")
        name = f"rope, rope+store_kv {str(dtype)[6:]}"
        return Row("check", name, err, "abs/4", tol, None, "", err <= tol)

    def bitmask() -> Row:
        logits = torch.randn(9, vocab, device=dev)
        words = (vocab + 31) // 32
        mask = torch.randint(-(2**31), 2**31 - 1, (9, words), dtype=torch.int32, device=dev)
        a, b = logits.clone(), logits.clone()
        idx = torch.tensor([0, 3, 8], device=dev)
        tb.apply_token_bitmask_inplace(a, mask, idx)
        tb.apply_token_bitmask_inplace_ref(b, mask, idx)
        same = torch.equal(a, b)
        return Row("check", "bitmask (indices)", 0.0 if same else 1.0, "diff", 0.0, None, "", same)

    def argmax() -> Row:
        logits = torch.randn(9, vocab, device=dev)
        logits[1, [5, vocab - 1]] = 100.0  # a tie: the lower column wins, as torch
        same = torch.equal(am.argmax_rows(logits), am.argmax_rows_ref(logits))
        return Row("check", "argmax", 0.0 if same else 1.0, "diff", 0.0, None, "", same)

    def store() -> Row:
        buf_k = torch.randn(4 * tokens, kvh, d, device=dev).to(dtype)
        buf_v, ref_k = torch.randn_like(buf_k), buf_k.clone()
        ref_v = buf_v.clone()
        k, v = (
            torch.randn(tokens, kvh, d, device=dev).to(dtype),
            torch.randn(tokens, kvh, d, device=dev).to(dtype),
        )
        loc = torch.randperm(4 * tokens - 1, device=dev)[:tokens] + 1
        sk.store_kv(buf_k, buf_v, loc, k, v)
        sk.store_kv_ref(ref_k, ref_v, loc, k, v)
        same = torch.equal(buf_k, ref_k) and torch.equal(buf_v, ref_v)
        return Row("check", "store_kv", 0.0 if same else 1.0, "diff", 0.0, None, "", same)

    def step_inputs() -> Row:
        """decode_inputs at the largest captured batch, into a wider buffer (as the graphs')."""
        from radixlm.kernels import decode_inputs as di

        bs, rows, ctx = (7, 16, 64) if bench.tiny else (512, 1024, 32768)
        req_rows = torch.randperm(rows, device=dev)[:bs]
        cols = torch.stack([req_rows, *torch.randint(0, ctx, (2, bs), device=dev)])
        slots = torch.randperm(1 << 20, device=dev)[:bs] + 1
        got = []
        for fn in (di.decode_inputs, di.decode_inputs_ref):
            table = torch.zeros(rows, ctx, dtype=torch.int32, device=dev)
            out = torch.full((5, bs + 8), -1, dtype=torch.int64, device=dev)
            got.append((fn(cols, None, slots, table, out[:, :bs]), table))
        same = all(torch.equal(a, b) for a, b in zip(*got))
        return Row("check", "decode_inputs", 0.0 if same else 1.0, "diff", 0.0, None, "", same)

    for name, fn in [
        ("rmsnorm", rms),
        ("rope", rope),
        ("bitmask", bitmask),
        ("argmax", argmax),
        ("store_kv", store),
        ("decode_inputs", step_inputs),
    ]:
        bench.case("check", name, fn)
    _check_gemv(bench, dtype)


def _check_gemv(bench: Bench, dtype: torch.dtype) -> None:
    """Every decode GEMV candidate against its reference at Llama-3-8B's qkv and down shapes,
    M = 1 and 5 (relative to the largest output), and the activation kernel."""
    from radixlm.kernels import activation
    from radixlm.kernels import gemv as gv

    dev = bench.device
    if bench.tiny:  # interpreter: one plain and one persistent config, small tiles
        configs = [{**c, "block_k": 64} for c in (gv.GEMV_CONFIGS[0], gv.GEMV_CONFIGS[-1])]
        shapes, rows = [(40, 96), (33, 300)], (3,)
    else:
        configs = list(gv.GEMV_CONFIGS)
        shapes, rows = [(6144, 4096), (4096, 14336)], (1, 5)
    tol = 1e-5 if dtype == torch.float32 else 1e-2

    def check(n: int, k: int) -> Row:
        w = (0.02 * torch.randn(n, k, device=dev)).to(dtype)
        err = 0.0
        for m in rows:
            x = torch.randn(m, k, device=dev).to(dtype)
            ref = gv.gemv_ref(x, w).float()
            for cfg in configs:
                out = gv.gemv(x, w, **cfg).float()
                err = max(err, _err(out, ref) / ref.abs().max().item())
        name = f"gemv {n}x{k} x{len(configs)} configs"
        return Row("check", name, err, "rel", tol, None, "", err <= tol)

    def check_activation(m: int, n: int) -> Row:
        x = (4 * torch.randn(m, 2 * n, device=dev)).to(dtype)
        ref = activation.silu_and_mul_ref(x).float()
        err = _err(activation.silu_and_mul(x).float(), ref) / ref.abs().max().item()
        return Row("check", f"silu_and_mul {m}x{n}", err, "rel", tol, None, "", err <= tol)

    for n, k in shapes:
        bench.case("check", "gemv", check, n, k)
    bench.case(
        "check", "silu_and_mul", check_activation, *((3, 40) if bench.tiny else (300, 14336))
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="radixlm bench kernels", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--tiny", action="store_true", help="tiny shapes (runs on CPU via the interpreter)"
    )
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON to PATH")
    parser.add_argument(
        "--sections",
        default="check,decode,extend,misc",
        help="comma list of: check, decode, extend, misc, sweep",
    )
    parser.add_argument("--verbose", action="store_true", help="print tracebacks of failed cases")
    args = parser.parse_args(argv)
    sections = {s.strip() for s in args.sections.split(",") if s.strip()}
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        if not args.tiny:
            print("no CUDA device: running the --tiny checks in Triton's interpreter instead")
            args.tiny = True
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported
        sections &= {"check"}
    bench = Bench(device, args.tiny, args.verbose)
    info = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu (interpreter)",
        "torch": torch.__version__,
        "tiny": args.tiny,
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        print("triton is not installed: nothing to benchmark")
        return 1
    print(f"# radixlm kernel bench: {info}")
    print(HEADER)
    if "check" in sections:
        run_checks(bench)
    if sections & {"decode", "extend", "misc", "sweep"}:
        from radixlm.kernels.bench_perf import run_perf

        run_perf(bench, sections)
    failed = [r for r in bench.rows if not r.ok]
    print(f"\n# {len(bench.rows)} rows, {len(failed)} failed")
    print(HEADER)
    print("\n".join(_format(r) for r in bench.rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"info": info, "rows": [asdict(r) for r in bench.rows]}, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
