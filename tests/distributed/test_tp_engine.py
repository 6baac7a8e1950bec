"""Tensor parallelism through the real engine (`Engine(tp_size=N)`: rank 0's scheduler leads, the
other ranks follow in lock-step over gloo on 127.0.0.1): greedy outputs are token-identical with
TP=1 on the default model (9 heads, 3 KV heads: an uneven split at TP=2, one KV head per rank at
TP=3), with the radix cache (a second round on a warm cache, shared prefixes), chunked prefill
(32-token chunks) and retraction (a 256-token KV pool); input and output logprobs agree; after
every round every follower's `req_to_token` table equals rank 0's (`check_invariants`, the
lock-step invariant of runtime/distributed/lockstep.py); a follower killed mid-run stops the
group within seconds with an error naming its rank, and the client gets that error, not a hang.

The workload and the comparison: tp_workload.py; the TP=1 reference: conftest.py's, once per
session. One TP=2 engine for the module; TP=3 once. On two GPUs, the same
over NCCL with CUDA graphs and the overlapped schedule (`test_nccl_engine_tp2_equals_tp1`).
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import pytest
import torch
from distributed.tp_workload import CONFIG, check_same, run_workload

from radixlm.runtime.distributed.lockstep import Journal, table_digest
from radixlm.runtime.errors import EngineDeadError
from tests_helpers import wait_until

LONG = {"max_new_tokens": 200, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def tp2() -> Any:
    from radixlm.runtime.frontend.engine import Engine

    engine = Engine(tp_size=2, **CONFIG)
    yield engine
    engine.shutdown()


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
