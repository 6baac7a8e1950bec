"""`radixlm bench gpu --sections startup`: the cost of the extend warm-up at start-up and whether
the first batch after start-up is as fast as a warm one (issue 20.5).

Starts an engine on the `--model` preset (dummy weights), then runs three batches of 64 distinct
512-token prompts (16 new tokens each): the first batch pays whatever the warm-up left cold.
Point TRITON_CACHE_DIR at an empty folder for a cold-compile figure.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from radixlm.bench.gpu_common import engine, random_prompts


def section_startup(args: argparse.Namespace, results: dict[str, Any]) -> None:
    import torch

    t0 = time.perf_counter()
    eng = engine(args.model)
    startup = time.perf_counter() - t0
    batches = []
    try:
        for i in range(3):
            prompts = random_prompts(64, 512, 32000, seed=100 + i)  # ids every preset has
            t = time.perf_counter()
            eng.generate(
                input_ids=prompts, sampling_params={"max_new_tokens": 16, "temperature": 0}
            )
            torch.cuda.synchronize()
            batches.append(round(time.perf_counter() - t, 3))
    finally:
        eng.shutdown()
    results["startup"] = {"startup_s": round(startup, 2), "batches_64x512_s": batches}
    print(f"startup: {startup:.2f} s (the extend warm-up's share is in the start-up log)")
    print(f"batches of 64 x 512 tokens: {batches} s (first, second, third)")
