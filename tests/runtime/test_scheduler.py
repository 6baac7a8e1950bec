"""The real scheduler driven in-process (no processes, no sockets): a tiny random-weight Qwen2 on
CPU behind the real `ModelRunner`, messages in through `Scheduler.handle`, one iteration per
`run_once`, outputs from `take_outputs`. Covers the policy (lpm order), admission against the KV
budget, retraction when the pool runs out, aborts (waiting and running), the overlapped decode
loop giving exactly the plain loop's tokens, and chunked prefill; after each test the KV
accounting is back to idle (free + evictable == capacity, no request row held)."""

from __future__ import annotations

from typing import Any

import pytest

from radixlm.runtime.errors import InvalidRequestError
from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.models.loader import resolve_model
from radixlm.runtime.processes import io
from radixlm.runtime.sampling.sampling_params import SamplingParams
from radixlm.runtime.scheduler.scheduler import Scheduler
from radixlm.runtime.server_args import ServerArgs

MODEL = "tiny-qwen2"  # vocab 512; untied random weights: greedy outputs vary with the prompt


def make_scheduler(**kwargs: Any) -> Scheduler:
    args = ServerArgs(
        model_path=MODEL, load_format="dummy", device="cpu", skip_tokenizer_init=True,
        random_seed=0, num_threads=1, **{"max_total_tokens": 1024, **kwargs},
    )  # fmt: skip
    return Scheduler(args, ModelRunner(args, resolve_model(MODEL, "dummy")))


def gen(rid: str, ids: list[int], stream: bool = False, **params: Any) -> io.GenerateReq:
    """The message the tokenizer manager sends (the scheduler trusts it: validated there)."""
    sp = SamplingParams.from_dict({"temperature": 0.0, "ignore_eos": True, **params}, 512)
    return io.GenerateReq(rid=rid, input_ids=ids, sampling_params=sp, stream=stream)


def prompt(seed: int, n: int) -> list[int]:
    return [(seed * 31 + 7 * i) % 500 + 3 for i in range(n)]


def run_all(
    s: Scheduler, merged: dict[str, io.ReqOut] | None = None, max_iters: int = 10_000
) -> dict[str, io.ReqOut]:
    """Iterate until idle; the merged outputs per request (ids concatenated, last state)."""
    merged = {} if merged is None else merged
    for _ in range(max_iters):
        if not s.has_work:
            break
        s.run_once()
        collect(s, merged)
    assert s.idle, "the scheduler did not finish"
    return merged


def collect(s: Scheduler, merged: dict[str, io.ReqOut]) -> None:
    for out in s.take_outputs():
        prev = merged.get(out.rid)
        if prev is not None:
            out.new_ids = prev.new_ids + out.new_ids
            if prev.input_logprobs is not None and out.input_logprobs is None:
                out.input_logprobs = prev.input_logprobs
        merged[out.rid] = out


def check_idle(s: Scheduler) -> None:
    resp = s.handle(io.ControlReq("check_invariants", 0))
    assert resp is not None and resp.ok, resp
    assert s.allocator.available() + s.cache.evictable_size() == s.allocator.capacity


def ids_of(outs: dict[str, io.ReqOut]) -> dict[str, list[int]]:
    return {rid: o.new_ids for rid, o in outs.items()}


@pytest.fixture(scope="module")
def reference() -> dict[str, list[int]]:
    """Greedy outputs of the plain loop with a roomy pool, one request at a time."""
    s = make_scheduler()
    out = {}
    for k in range(6):
        s.handle(gen(f"r{k}", prompt(k, 24 + k), max_new_tokens=12 + 2 * k))
        out.update(ids_of(run_all(s)))
    check_idle(s)
    return out


def submit_reference_batch(s: Scheduler) -> None:
    for k in range(6):
        s.handle(gen(f"r{k}", prompt(k, 24 + k), max_new_tokens=12 + 2 * k))


def test_batched_plain_loop_matches_one_at_a_time(reference):
    s = make_scheduler()
    submit_reference_batch(s)
    outs = run_all(s)
    assert ids_of(outs) == reference
    assert all(
        o.finish_reason == {"type": "length", "length": len(o.new_ids)} for o in outs.values()
    )
    assert s.stats["overlapped_steps"] == 0
    check_idle(s)


def test_overlapped_loop_gives_the_plain_tokens(reference):
    """The overlap component launches step n + 1 from step n's device tokens: same tokens, also
    for requests that end at different lengths (not relaunched) or on a stop id (a wasted row)."""
    s = make_scheduler(overlap_schedule_on_cpu=True)
    submit_reference_batch(s)
    outs = run_all(s)
    assert ids_of(outs) == reference
    assert s.stats["overlapped_steps"] > 0
    check_idle(s)
    stop = reference["r2"][5]  # ends r2 at its 6th token (or earlier, if it comes before)
    s.handle(gen("stop", prompt(2, 26), max_new_tokens=16, stop_token_ids=[stop]))
    s.handle(gen("long", prompt(5, 29), max_new_tokens=22))
    outs = run_all(s)
    want = reference["r2"][: reference["r2"].index(stop) + 1]
    assert outs["stop"].new_ids == want
    assert outs["stop"].finish_reason == {"type": "stop", "matched": stop}
    assert outs["long"].new_ids == reference["r5"]
    check_idle(s)


def test_lpm_admits_the_longest_cached_prefix_first():
    shared = prompt(9, 40)
    for policy, first in (("lpm", "hit"), ("fcfs", "miss")):
        # A prefill budget of one request per batch: the batch's request is the policy's pick.
        s = make_scheduler(schedule_policy=policy, max_prefill_tokens=8)
        s.handle(gen("warm", shared, max_new_tokens=1))
        run_all(s)
        s.handle(gen("miss", prompt(3, 30), max_new_tokens=2))
        s.handle(gen("hit", [*shared, 7, 8], max_new_tokens=2))
        batch = s.get_next_batch()
        assert batch is not None and [r.rid for r in batch.reqs] == [first], policy
        s.run_batch(batch)
        outs = run_all(s)
        assert set(outs) == {"hit", "miss"}
        assert outs["hit"].cached_tokens == 40
        check_idle(s)


def test_admission_keeps_within_the_kv_budget():
    """Each request reserves its prompt plus new_token_ratio (0.7) of its max_new_tokens: four of
    27 tokens fit a 128-slot pool, the fifth waits until one finishes."""
    s = make_scheduler(max_total_tokens=128)
    for k in range(5):
        s.handle(gen(f"a{k}", prompt(k, 20), max_new_tokens=10))
    batch = s.get_next_batch()
    assert batch is not None and [r.rid for r in batch.reqs] == ["a0", "a1", "a2", "a3"]
    assert [r.rid for r in s.queues.waiting] == ["a4"]
    s.run_batch(batch)
    outs = run_all(s)
    assert all(len(outs[f"a{k}"].new_ids) == 10 for k in range(5))
    assert s.stats["retracted"] == 0
    check_idle(s)


def test_retraction_when_the_pool_runs_out(reference):
    """Admission without a reservation overcommits a 128-slot pool; decode then retracts
    requests back to the queue (their prefix stays cached) and every one still finishes with
    the tokens it would have produced alone."""
    s = make_scheduler(max_total_tokens=128, schedule_conservativeness=0.01)
    for k in (0, 1, 2, 3):
        s.handle(gen(f"r{k}", prompt(k, 24 + k), max_new_tokens=12 + 2 * k))
    outs = run_all(s)
    assert s.stats["retracted"] > 0
    assert ids_of(outs) == {f"r{k}": reference[f"r{k}"] for k in (0, 1, 2, 3)}
    check_idle(s)


def test_a_request_that_outgrows_the_pool_ends_with_length():
    """The tokenizer manager keeps prompt + max_new_tokens within the pool; sent past that
    guard, a lone request stops when no slot is left (nothing to retract) and frees its KV."""
    s = make_scheduler(max_total_tokens=64)
    s.handle(gen("big", prompt(1, 20), max_new_tokens=50))
    out = run_all(s)["big"]
    assert out.finish_reason == {"type": "length", "length": len(out.new_ids)}
    assert 40 <= len(out.new_ids) < 50
    check_idle(s)


def test_abort_waiting_and_running():
    s = make_scheduler(max_running_requests=1)
    s.handle(gen("run", prompt(1, 20), max_new_tokens=50, stream=True))
    s.handle(gen("wait", prompt(2, 20), max_new_tokens=50))
    merged: dict[str, io.ReqOut] = {}
    for _ in range(3):
        s.run_once()
        collect(s, merged)
    assert [r.rid for r in s.queues.running] == ["run"] and s.queues.waiting[0].rid == "wait"
    s.handle(io.AbortReq("wait"))  # waiting: reported at once, never ran
    collect(s, merged)
    assert merged["wait"].finished and merged["wait"].finish_reason["type"] == "abort"
    assert merged["wait"].new_ids == []
    s.handle(io.AbortReq("run"))  # running: released at the next iteration
    run_all(s, merged)
    assert merged["run"].finished and merged["run"].finish_reason["type"] == "abort"
    assert 0 < len(merged["run"].new_ids) < 50
    check_idle(s)


def test_abort_during_an_overlapped_step():
    s = make_scheduler(overlap_schedule_on_cpu=True)
    s.handle(gen("a", prompt(1, 20), max_new_tokens=40))
    s.handle(gen("b", prompt(2, 20), max_new_tokens=40))
    for _ in range(4):
        s.run_once()
    assert s.overlap.inflight is not None
    s.handle(io.AbortReq("a"))
    outs = run_all(s)
    assert outs["a"].finish_reason["type"] == "abort"
    assert len(outs["b"].new_ids) == 40
    check_idle(s)


def test_chunked_prefill_gives_the_unchunked_tokens_and_logprobs():
    long = prompt(4, 70)
    results = {}
    for chunk in (-1, 16):
        s = make_scheduler(chunked_prefill_size=chunk)
        s.handle(
            io.GenerateReq(
                rid="c", input_ids=long, return_logprob=True, logprob_start_len=0,
                sampling_params=gen("c", long, max_new_tokens=6).sampling_params,
            )
        )  # fmt: skip
        results[chunk] = (run_all(s)["c"], s.stats["extend_iterations"])
        check_idle(s)
    (whole, n_whole), (chunked, n_chunked) = results[-1], results[16]
    assert n_whole == 1 and n_chunked == 5  # 70 tokens in chunks of 16
    assert chunked.new_ids == whole.new_ids
    assert whole.input_logprobs is not None and chunked.input_logprobs is not None
    assert len(chunked.input_logprobs) == len(long) and chunked.input_logprobs[0] is None
    for a, b in zip(whole.input_logprobs[1:], chunked.input_logprobs[1:]):
        assert abs(a - b) <= 1e-4


@pytest.mark.parametrize(
    "params",
    [
        {"max_new_tokens": 4.0, "top_k": 5.0, "seed": 7.0, "temperature": 1, "top_p": 1},
        {"logit_bias": {5: 2, "7": -1.5}, "stop_token_ids": 3, "stream_interval": 1.0},
        {"stop": "x", "stop_regex": "a+", "min_new_tokens": 1, "n": 2.0, "sampling_seed": 3},
        {"regex": "[ab]+", "think_end_ids": [4], "frequency_penalty": 1, "min_p": 0},
    ],
)
def test_validated_params_cross_the_wire_typed(params):
    """What `SamplingParams.from_dict` accepts (ints for floats, integral floats for ints, int
    logit_bias keys...) leaves every field of its declared type: the scheduler's strict decoder
    takes the message as is, and the values survive the trip."""
    sp = SamplingParams.from_dict(params, 512)
    msg = io.GenerateReq(rid="w", input_ids=[1, 2], sampling_params=sp, return_logprob=True)
    decoded = io.decoder(io.ToScheduler).decode(io.encode(msg))
    assert decoded == msg
    assert decoded.sampling_params.to_dict() == sp.to_dict()


def test_params_too_large_for_the_wire_are_rejected_by_name():
    with pytest.raises(InvalidRequestError) as exc:
        SamplingParams.from_dict({"top_k": 1e300}, 512)
    assert exc.value.field == "top_k"
