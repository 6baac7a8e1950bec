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
import os
from dataclasses import asdict

import torch

from radixlm.bench.kernel_timing import HEADER, Bench, format_row


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
        from radixlm.bench.kernel_checks import run_checks

        run_checks(bench)
    if sections & {"decode", "extend", "misc", "sweep"}:
        from radixlm.bench.kernel_perf import run_perf

        run_perf(bench, sections)
    failed = [r for r in bench.rows if not r.ok]
    print(f"\n# {len(bench.rows)} rows, {len(failed)} failed")
    print(HEADER)
    print("\n".join(format_row(r) for r in bench.rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"info": info, "rows": [asdict(r) for r in bench.rows]}, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
