"""The workload the tensor-parallel engine tests run at every TP size, and the comparison with
TP=1 (test_tp_engine.py, test_tp_speculative.py; the TP=1 run is conftest.py's `reference`).

Two rounds of the parity prompts (the second on a warm cache: shared prefixes, cached tokens),
chunked prefill (32-token chunks) and retraction (a 256-token KV pool), one regex-constrained
request, then one request with input and output logprobs; after each part, exact KV accounting
and every follower's `req_to_token` table equal to rank 0's (`wait_idle_and_check`).
"""

from __future__ import annotations

from typing import Any

from tests_helpers import PARITY_PROMPTS, wait_idle_and_check

MAX_NEW = 24
# NOTE: float32 on both sides: the dense path (at TP > 1 the CPU runs no GGUF block kernels).
CONFIG: dict[str, Any] = {
    "device": "cpu",
    "dtype": "float32",
    "num_threads": 1,
    "max_total_tokens": 256,
    "max_running_requests": 8,
    "chunked_prefill_size": 32,
    "log_level": "warning",
}
GREEDY = {"max_new_tokens": MAX_NEW, "temperature": 0, "ignore_eos": True}
LOGPROB_PROMPT = PARITY_PROMPTS[2]
# a counting prompt under a regex: speculation drafts ", " and digits, the grammar checks them
GRAMMAR_PROMPT = "1, 2, 3, 4,"
GRAMMAR = {"max_new_tokens": 16, "temperature": 0, "regex": r"( [0-9]+,)+"}


def run_workload(engine: Any) -> dict[str, Any]:
    """The workload (module docstring); the outputs and the engine's counters after it."""
    rounds = [engine.generate(PARITY_PROMPTS, GREEDY) for _ in range(2)]
    wait_idle_and_check(engine)
    constrained = engine.generate(GRAMMAR_PROMPT, GRAMMAR)
    wait_idle_and_check(engine)
    lp = engine.generate(
        LOGPROB_PROMPT, {"max_new_tokens": 4, "temperature": 0},
        return_logprob=True, logprob_start_len=0, top_logprobs_num=3,
    )  # fmt: skip
    wait_idle_and_check(engine)
    return {
        "ids": [[o["output_ids"] for o in outs] for outs in rounds],
        "accept": [o["meta_info"].get("spec_accept_length") for o in rounds[0]],
        "cached": [o["meta_info"]["cached_tokens"] for o in rounds[1]],
        "prompt_tokens": [o["meta_info"]["prompt_tokens"] for o in rounds[0]],
        "grammar": (constrained["output_ids"], constrained["text"]),
        "logprobs": lp["meta_info"],
        "info": engine.get_server_info(),
    }


def check_same(ref: dict[str, Any], got: dict[str, Any], tp: int) -> None:
    assert got["info"]["tp_size"] == tp
    for k, (want, have) in enumerate(zip(ref["ids"][0], got["ids"][0])):
        assert have == want, f"tp={tp}: prompt {k} differs from TP=1"
    assert got["ids"][1] == ref["ids"][0], f"tp={tp}: the warm-cache round differs"
    assert got["grammar"] == ref["grammar"], f"tp={tp}: the constrained request differs"
    # the workload did exercise what it claims to
    assert got["info"]["retracted"] > 0
    assert any(c > 0 for c in got["cached"])
    assert max(got["prompt_tokens"]) > CONFIG["chunked_prefill_size"]
    for key in ("input_token_logprobs", "output_token_logprobs"):
        want, have = ref["logprobs"][key], got["logprobs"][key]
        assert [t for _, t, _ in have] == [t for _, t, _ in want]
        for (a, _, _), (b, _, _) in zip(want, have):
            assert (a is None and b is None) or abs(a - b) < 1e-3
    for want, have in zip(ref["logprobs"]["input_top_logprobs"][1:],
                          got["logprobs"]["input_top_logprobs"][1:]):  # fmt: skip
        assert [t for _, t, _ in have] == [t for _, t, _ in want]
