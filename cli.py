"""`radixlm` command line: `demo`, `serve`, `router`, `bench <workload>`.

Every subcommand imports its implementation lazily, so `radixlm --help` is instant.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

BENCHES: dict[str, tuple[str, str]] = {
    # name: (module, help)
    "offline": (
        "radixlm.bench.offline",
        "radixlm vs transformers generate: mixed batch, shared prefix, batch-1 decode",
    ),
    "programs": (
        "radixlm.bench.programs",
        "generation programs with program-aware caching on/off vs transformers",
    ),
    "serving": ("radixlm.bench.serving", "load generator against a running server (TTFT/TPOT/ITL)"),
    "router": (
        "radixlm.bench.router",
        "router policies side by side (cache-aware vs round-robin) on shared prefixes",
    ),
    "constrained": ("radixlm.bench.constrained", "regex/JSON constrained decoding vs Outlines"),
    "kernels": (
        "radixlm.bench.kernels",
        "Triton kernels vs references and the bandwidth roofline (GPU)",
    ),
    "speculative": (
        "radixlm.bench.speculative",
        "decode tok/s with speculative decoding off vs on, and the acceptance (CPU/GPU)",
    ),
    "gpu": (
        "radixlm.bench.gpu",
        "H200 suite: roofline decode, offline throughput, CUDA graphs, parity",
    ),
}


def _run_module_main(module: str, argv: list[str]) -> int:
    import importlib

    mod = importlib.import_module(module)
    return int(mod.main(argv) or 0)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="radixlm", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="run a short demo on the default model", add_help=False)
    sub.add_parser(
        "serve", help="start the HTTP server (native + OpenAI-compatible API)", add_help=False
    )
    sub.add_parser(
        "router", help="cache-aware router in front of `radixlm serve` workers", add_help=False
    )
    bench = sub.add_parser("bench", help="benchmarks (radixlm vs its peer, side by side)")
    bench.add_argument(
        "workload",
        choices=sorted(BENCHES),
        help="; ".join(f"{k}: {v[1]}" for k, v in BENCHES.items()),
    )
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0
    command, rest = argv[0], argv[1:]
    handlers: dict[str, Callable[[list[str]], int]] = {
        "demo": _demo,
        "serve": _serve,
        "router": lambda a: _run_module_main("radixlm.router.launch", a),
    }
    if command in handlers:
        return handlers[command](rest)
    if command == "bench":
        if not rest or rest[0] in ("-h", "--help"):
            bench.print_help()
            return 0
        if rest[0] not in BENCHES:
            parser.error(f"unknown benchmark {rest[0]!r}; choose from {', '.join(sorted(BENCHES))}")
        return _run_module_main(BENCHES[rest[0]][0], rest[1:])
    parser.parse_args(argv)  # prints the usage error
    return 2


def _serve(argv: list[str]) -> int:
    from radixlm.router.dp import serve_dp
    from radixlm.runtime.server.launch_server import serve_main

    return serve_main(argv, serve_dp=serve_dp)


def _demo(argv: list[str]) -> int:
    from radixlm.demo import main as demo_main

    return demo_main(argv)


if __name__ == "__main__":
    raise SystemExit(main())
