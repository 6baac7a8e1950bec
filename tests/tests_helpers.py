"""Helpers shared by test modules (importable as `tests_helpers` with pytest's rootdir on sys.path)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

# Eight prompts of mixed lengths; several share prefixes (chat template, few-shot header).
_FEWSHOT = (
    "Answer each question with one word.\n"
    "Q: What color is the sky on a clear day?\nA: Blue\n"
    "Q: What is frozen water called?\nA: Ice\n"
    "Q: Which animal says meow?\nA: Cat\n"
)
PARITY_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    _FEWSHOT + "Q: What do bees make?\nA:",
    _FEWSHOT + "Q: What is the opposite of hot?\nA:",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n<|im_start|>user\nName three fruits.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n<|im_start|>user\nWrite a haiku about the sea, then explain it in one "
    "sentence.<|im_end|>\n<|im_start|>assistant\n",
    "1, 2, 3, 4,",
    "Once upon a time, in a small village at the edge of a large forest, there lived an old "
    "woodcutter and his three children. Every morning the woodcutter would",
]


# Engines shared by the whole session, by configuration (shut down by tests/conftest.py).
ENGINES: dict[tuple, Any] = {}


def get_engine(**kwargs: Any) -> Any:
    """A shared Engine for this configuration (started on first use, stopped at session end)."""
    from radixlm.runtime.frontend.engine import Engine

    key = tuple(sorted(kwargs.items()))
    engine = ENGINES.get(key)
    if engine is None:
        engine = ENGINES[key] = Engine(**kwargs)
    return engine


def release_engine(**kwargs: Any) -> None:
    """Check and shut down the shared Engine of this configuration (frees its memory and CPU for
    the rest of the session; a later `get_engine` starts a new one)."""
    engine = ENGINES.pop(tuple(sorted(kwargs.items())), None)
    if engine is not None:
        try:
            wait_idle_and_check(engine)
        finally:
            engine.shutdown()


def wait_idle_and_check(engine: Any, timeout: float = 30.0) -> dict[str, Any]:
    """Wait until no request runs, then assert exact KV accounting (raises otherwise)."""
    deadline = time.monotonic() + timeout
    while True:
        info = engine.get_server_info()
        if info["num_running"] == 0 and info["num_waiting"] == 0:
            return engine.check_invariants()
        if time.monotonic() > deadline:
            raise AssertionError(f"engine not idle after {timeout} s: {info}")
        time.sleep(0.05)


def wait_until(cond: Callable[[], bool], what: str, timeout: float = 120.0) -> None:
    """Poll `cond` until it holds. The timeout is a failsafe against a hang, not a threshold
    under test: keep it far above any load's delay."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def pid_alive(pid: int) -> bool:
    """True while `pid` runs (a zombie counts as dead)."""
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


_HF_GREEDY: dict[str, list[int]] = {}


def hf_greedy_outputs(ref: Any, prompts: list[str], max_new: int) -> list[list[int]]:
    """transformers' greedy tokens of each prompt (memoized for the session: a shorter request
    is the prefix of a longer one, so the parity modules share one reference run)."""
    out = []
    for prompt in prompts:
        ids = _HF_GREEDY.get(prompt)
        if ids is None or len(ids) < max_new:
            ids = _HF_GREEDY[prompt] = ref.greedy(ref.tokenizer.encode(prompt), max_new)
        out.append(ids[:max_new])
    return out


def runner_logits(runner: Any, ids: list[int]) -> Any:
    """All-position logits of one prompt through a ModelRunner (one EXTEND batch, no cache)."""
    import torch

    from radixlm.runtime.executor.forward_batch import ForwardBatch, ForwardMode

    n = len(ids)
    row = runner.req_to_token.alloc()
    slots = runner.kv_pool.allocator.alloc(n)
    runner.req_to_token.write(row, 0, slots)
    t = lambda v: torch.tensor(v, dtype=torch.int64, device=runner.device)  # noqa: E731
    batch = ForwardBatch(
        ForwardMode.EXTEND, 1, t(ids), t(list(range(n))), slots, t([row]), t([n]), [n],
        [0], [n], t([0]), t([n]), t([0]), t(list(range(n))),
    )  # fmt: skip
    try:
        return runner.compute_logits(runner.forward(batch))
    finally:
        runner.kv_pool.allocator.free(slots)
        runner.req_to_token.free(row)
