"""`radixlm demo` (`./dev run`): the main job on the default model, end to end.

Starts an embedded Engine (SmolLM2-135M-Instruct on this machine's CPU or GPU), generates with
it directly (plain and streaming), runs the language example `examples/quickstart.py` (roles,
fork, select, JSON schema) on the same engine, and prints what the radix cache saved.
"""

from __future__ import annotations

import argparse
import runpy
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="radixlm demo", description=__doc__)
    parser.add_argument("--prompt", default="The three primary colors are")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--model-path", default=None)
    args = parser.parse_args(argv)

    import radixlm as rl

    t0 = time.perf_counter()
    with rl.Engine(model_path=args.model_path) as engine:
        print(f"engine ready in {time.perf_counter() - t0:.1f} s: {engine.model_name}")
        params = {"max_new_tokens": args.max_new_tokens, "temperature": 0}
        out = engine.generate(args.prompt, params)
        meta = out["meta_info"]
        print(f"\n> {args.prompt}{out['text']}")
        print(
            f"  ({meta['completion_tokens']} tokens in {meta['e2e_latency']:.2f} s, "
            f"finish: {meta['finish_reason']})"
        )

        print("\nstreaming:", end=" ", flush=True)
        seen = ""
        for chunk in engine.generate("A sentence about the sea:", params, stream=True):
            print(chunk["text"][len(seen) :], end="", flush=True)
            seen = chunk["text"]
        print()

        example = Path(__file__).parent / "examples" / "quickstart.py"
        if example.exists():  # a source checkout: run the language example on this engine
            print(f"\na generation program ({example.relative_to(example.parents[1])}):")
            runpy.run_path(str(example))["main"](engine)
        info = engine.get_server_info()
        hit = info["cached_tokens"] / max(1, info["prompt_tokens"])
        print(
            f"\nradix cache: {info['cached_tokens']} of {info['prompt_tokens']} prompt tokens "
            f"served from cache ({hit:.0%})"
        )
    return 0
