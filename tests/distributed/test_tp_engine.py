"""Tensor parallelism through the real engine (`Engine(tp_size=N)`: rank 0's scheduler leads, the
other ranks follow in lock-step over gloo on 127.0.0.1): greedy outputs are token-identical with
TP=1 on the default model (9 heads, 3 KV heads: an uneven split at TP=2, one KV head per rank at
TP=3), with the radix cache (a second round on a warm cache, shared prefixes), chunked prefill
(32-token chunks) and retraction (a 256-token KV pool); input and output logprobs agree; after
every round every follower's `req_to_token` table equals rank 0's (`check_invariants`, the
lock-step invariant of runtime/distributed/lockstep.py); a follower killed mid-run stops the
group within seconds with an error naming its rank, and the client gets that error, not a hang.

One TP=1 reference engine and one TP=2 engine for the module; TP=3 once. On two GPUs, the same
over NCCL with CUDA graphs and the overlapped schedule (`test_nccl_engine_tp2_equals_tp1`).
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import pytest
import torch

from radixlm.runtime.distributed.lockstep import Journal, table_digest
from radixlm.runtime.errors import EngineDeadError
from tests_helpers import PARITY_PROMPTS, wait_idle_and_check, wait_until

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
LONG = {"max_new_tokens": 200, "temperature": 0, "ignore_eos": True}
LOGPROB_PROMPT = PARITY_PROMPTS[2]


def run_workload(engine: Any) -> dict[str, Any]:
    """Two rounds of the parity prompts (the second on a warm cache), then one request with
    input and output logprobs; the engine's counters after them."""
    rounds = [engine.generate(PARITY_PROMPTS, GREEDY) for _ in range(2)]
    wait_idle_and_check(engine)
    lp = engine.generate(
        LOGPROB_PROMPT, {"max_new_tokens": 4, "temperature": 0},
        return_logprob=True, logprob_start_len=0, top_logprobs_num=3,
    )  # fmt: skip
    wait_idle_and_check(engine)
    return {
        "ids": [[o["output_ids"] for o in outs] for outs in rounds],
        "cached": [o["meta_info"]["cached_tokens"] for o in rounds[1]],
        "prompt_tokens": [o["meta_info"]["prompt_tokens"] for o in rounds[0]],
        "logprobs": lp["meta_info"],
        "info": engine.get_server_info(),
    }


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    from radixlm.runtime.frontend.engine import Engine

    engine = Engine(**CONFIG)
    try:
        return run_workload(engine)
    finally:
        engine.shutdown()


@pytest.fixture(scope="module")
def tp2() -> Any:
    from radixlm.runtime.frontend.engine import Engine

    engine = Engine(tp_size=2, **CONFIG)
    yield engine
    engine.shutdown()


def check_same(ref: dict[str, Any], got: dict[str, Any], tp: int) -> None:
    assert got["info"]["tp_size"] == tp
    for k, (want, have) in enumerate(zip(ref["ids"][0], got["ids"][0])):
        assert have == want, f"tp={tp}: prompt {k} differs from TP=1"
    assert got["ids"][1] == ref["ids"][0], f"tp={tp}: the warm-cache round differs"
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


def test_tp2_matches_tp1(reference: dict[str, Any], tp2: Any) -> None:
    check_same(reference, run_workload(tp2), 2)
    assert tp2.check_invariants()["capacity"] == CONFIG["max_total_tokens"]


def test_tp3_matches_tp1(reference: dict[str, Any]) -> None:
    from radixlm.runtime.frontend.engine import Engine

    engine = Engine(tp_size=3, **CONFIG)
    try:
        check_same(reference, run_workload(engine), 3)
    finally:
        engine.shutdown()


def test_table_digest_sees_a_missed_write() -> None:
    """The invariant check compares digests: a replayed journal gives rank 0's table; a table
    that missed a write, or holds a slot in another cell, does not."""
    leader = torch.zeros(4, 8, dtype=torch.int32)
    leader[1, :3] = torch.tensor([5, 6, 7], dtype=torch.int32)
    leader[2, 2:4] = torch.tensor([9, 3], dtype=torch.int32)
    follower = torch.zeros_like(leader)
    journal = Journal([1, 2], [0, 2], [3, 2], [])
    journal.replay(follower, torch.tensor([5, 6, 7, 9, 3]))
    assert torch.equal(table_digest(follower), table_digest(leader))
    missed = torch.zeros_like(leader)
    Journal([1], [0], [3], []).replay(missed, torch.tensor([5, 6, 7]))
    assert not torch.equal(table_digest(missed), table_digest(leader))
    moved = follower.clone()
    moved[2, 2], moved[2, 3] = 3, 9
    assert not torch.equal(table_digest(moved), table_digest(leader))


def kill_follower_mid_request(engine: Any) -> None:
    """SIGKILL rank 1 while a request decodes: the request ends with an error naming the rank
    within seconds, and so does every later request."""
    outcome: dict[str, Any] = {}

    def client() -> None:
        try:
            outcome["out"] = engine.generate("Once upon a time", LONG)
        except Exception as exc:  # the error is what is checked
            outcome["error"] = exc

    thread = threading.Thread(target=client)
    thread.start()
    info = engine.get_server_info()
    started = info["generated_tokens"]
    wait_until(lambda: engine.get_server_info()["generated_tokens"] != started, "decoding")
    os.kill(info["tp_rank_1_pid"], signal.SIGKILL)
    thread.join(30)
    assert not thread.is_alive(), "the client hangs after a rank was killed"
    assert isinstance(outcome.get("error"), EngineDeadError), outcome
    assert "rank 1" in str(outcome["error"])
    with pytest.raises(EngineDeadError, match="rank 1"):
        engine.generate("Hello", {"max_new_tokens": 2})


def test_killed_follower_stops_the_group(tp2: Any) -> None:
    kill_follower_mid_request(tp2)  # NOTE: last in the module: it ends the module's TP=2 engine


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA devices"
)
def test_nccl_engine_tp2_equals_tp1() -> None:
    """NCCL on two GPUs through the engine: decode steps replayed from CUDA graphs that capture
    the all-reduces, the overlapped schedule (CUDA's default), fp32 so that TP=1 is the oracle;
    the lock-step check after every round; then a killed follower, whose NCCL peers would wait
    forever in a collective, stops the group within seconds (the watchdog)."""
    from radixlm.runtime.frontend.engine import Engine

    gpu = {**CONFIG, "device": "cuda"}
    engine = Engine(**gpu)
    try:
        ref = run_workload(engine)
    finally:
        engine.shutdown()
    engine = Engine(tp_size=2, **gpu)
    try:
        got = run_workload(engine)
        check_same(ref, got, 2)
        assert got["info"]["overlapped_steps"] > 0
        kill_follower_mid_request(engine)
    finally:
        engine.shutdown()
