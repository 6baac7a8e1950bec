"""The quality gate of a weight mode: perplexity on a fixed text, and top-1 agreement with fp32.

`python -m radixlm.bench.quality [--model-path x.gguf] [--modes float32,gguf]` prints, per mode,
the perplexity of `tests/data/perplexity_text.txt` (the text cut into independent windows of
`--window` tokens, every position scored) and the share of positions whose greedy (argmax) token
equals the first mode's. The CI test (tests/runtime/test_quality_gate.py) asserts the default
CPU mode's perplexity is within 3 % of fp32's.
"""

from __future__ import annotations

import argparse
import math
import os
from typing import NamedTuple

import torch

from radixlm.runtime.executor.forward_batch import ForwardBatch, ForwardMode
from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.models.loader import resolve_model
from radixlm.runtime.server_args import ServerArgs

TEXT = os.path.join(
    os.path.dirname(os.path.dirname(__file__)), "tests", "data", "perplexity_text.txt"
)


class Quality(NamedTuple):
    perplexity: float
    greedy: torch.Tensor  # [positions] argmax token at every scored position


def _t(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


@torch.inference_mode()
def window_logits(runner: ModelRunner, ids: list[int]) -> torch.Tensor:
    """float32 logits of every position of one prompt (one EXTEND batch, no cache)."""
    n = len(ids)
    row = runner.req_to_token.alloc()
    slots = runner.kv_pool.allocator.alloc(n)
    runner.req_to_token.write(row, 0, slots)
    batch = ForwardBatch(
        ForwardMode.EXTEND, 1, _t(ids), _t(list(range(n))), slots, _t([row]), _t([n]), [n],
        [0], [n], _t([0]), _t([n]), _t([0]),
    )  # fmt: skip
    try:
        return runner.compute_logits(runner.forward(batch))
    finally:
        runner.kv_pool.allocator.free(slots)
        runner.req_to_token.free(row)


def measure(runner: ModelRunner, ids: list[int], window: int = 512) -> Quality:
    nll, count, greedy = 0.0, 0, []
    for start in range(0, len(ids) - 1, window):
        chunk = ids[start : start + window + 1]
        if len(chunk) < 2:
            break
        logits = window_logits(runner, chunk[:-1])
        target = _t(chunk[1:])
        nll += float(torch.nn.functional.cross_entropy(logits, target, reduction="sum"))
        count += len(chunk) - 1
        greedy.append(logits.argmax(-1))
    return Quality(math.exp(nll / count), torch.cat(greedy))


def text_ids(tokenizer_source: str | None = None, max_tokens: int | None = None) -> list[int]:
    from radixlm.runtime.frontend.tokenizer import load_tokenizer
    from radixlm.runtime.models.gguf_file import GGUFFile
    from radixlm.runtime.models.loader import resolve_model as _resolve

    source = _resolve(tokenizer_source)
    gguf = source.gguf if isinstance(source.gguf, GGUFFile) else None
    tok = load_tokenizer(source.path, gguf)
    with open(TEXT, encoding="utf-8") as f:
        ids = tok.encode(f.read(), add_special_tokens=False)
    return ids[:max_tokens] if max_tokens else ids


def runner_for(model_path: str | None, mode: str) -> ModelRunner:
    """A CPU runner in `mode`: a dtype name (dense), `gguf` (the file's block quants) or `auto`
    (the default)."""
    kwargs = {"quantization": "gguf"} if mode == "gguf" else {"dtype": mode}
    if mode == "auto":  # the default mode
        kwargs = {}
    args = ServerArgs(
        model_path=model_path, device="cpu", max_total_tokens=2048, max_running_requests=2,
        **kwargs,
    )  # fmt: skip
    return ModelRunner(args, resolve_model(model_path))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="radixlm.bench.quality", description=__doc__)
    p.add_argument("--model-path", default=None)
    p.add_argument("--modes", default="float32,gguf,bfloat16")
    p.add_argument("--window", type=int, default=512)
    p.add_argument("--max-tokens", type=int, default=None)
    a = p.parse_args(argv)
    ids = text_ids(a.model_path, a.max_tokens)
    base = None
    for mode in a.modes.split(","):
        runner = runner_for(a.model_path, mode)
        q = measure(runner, ids, a.window)
        base = base if base is not None else q
        agree = float((q.greedy == base.greedy).float().mean())
        print(
            f"{mode:>10} ({runner.weight_mode}): perplexity {q.perplexity:.4f} "
            f"({q.perplexity / base.perplexity - 1:+.2%} vs {a.modes.split(',')[0]}), "
            f"greedy agreement {agree:.2%} over {len(ids)} tokens"
        )
        del runner


if __name__ == "__main__":
    main()
