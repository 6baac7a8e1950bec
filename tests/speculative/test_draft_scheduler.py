"""Draft-model speculation (STANDALONE, EAGLE, EAGLE3) through the real scheduler's speculative
step, in-process on CPU: greedy outputs token-identical with speculation on and off for a batch of
requests (the target drafting for itself, a small random draft, random heads; chains and trees;
chunked prefill and the radix cache), forced acceptance when the draft is the target, and the
draft's KV all given back once the requests finish."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from rerun_capture import RerunCapture
from speculative.spec_loop import extend_batch
from speculative.test_spec_scheduler import (
    VOCAB,
    _filtered,
    every_draft,
    gen,
    ids_of,
    prompt,
    run_all,
)
from speculative.tree_stats import ALPHA, chi2_pvalue

from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.models.loader import resolve_model
from radixlm.runtime.scheduler.scheduler import Scheduler
from radixlm.runtime.server_args import ServerArgs

REQS = [(f"r{k}", prompt(k, 12 + 5 * k), 10 + 3 * k) for k in range(4)]


def make_scheduler(
    paths: dict[str, str], draft: str | None = None, every: bool = True, **kwargs: Any
) -> Scheduler:
    """A scheduler on the target (`draft`: with that draft); `every`: verify every draft (no
    CPU row budget, no back-off: deterministic acceptance figures), else the CPU defaults."""
    opts: dict[str, Any] = {"max_total_tokens": 2048, "device": "cpu", **kwargs}
    if draft is not None:
        opts["speculative_draft_model_path"] = paths[draft]
    args = ServerArgs(model_path=paths["target"], skip_tokenizer_init=True, random_seed=0,
                      num_threads=1, **opts)  # fmt: skip
    s = Scheduler(args, ModelRunner(args, resolve_model(paths["target"])))
    if s.spec is not None and every:
        every_draft(s)
    return s


def run(s: Scheduler, reqs: list = REQS) -> dict[str, Any]:
    for rid, ids, max_new in reqs:
        s.handle(gen(rid, ids, max_new_tokens=max_new))
    return run_all(s)


@pytest.fixture(scope="module")
def plain(paths) -> dict[str, list[int]]:
    return ids_of(run(make_scheduler(paths)))


def _draft_idle(s: Scheduler) -> None:
    proposer = s.spec.proposer
    kv, rows = proposer.runner.kv_pool.allocator, proposer.runner.req_to_token
    assert not proposer.states
    assert kv.available() == kv.capacity and rows.available() == rows.size


def test_self_draft_is_accepted_whole(paths, plain) -> None:
    s = make_scheduler(paths, "self", speculative_algorithm="STANDALONE",
                       speculative_num_steps=3)  # fmt: skip
    outs = run(s)
    assert ids_of(outs) == plain
    for o in outs.values():  # 4 tokens a step, but for the last step of each request
        assert o.spec_committed >= 4 * (o.spec_verify_ct - 1) + 1
    _draft_idle(s)


@pytest.mark.parametrize(
    "algo,draft,flags",
    [
        ("STANDALONE", "small", {}),
        ("STANDALONE", "small", {"speculative_eagle_topk": 2, "chunked_prefill_size": 16}),
        ("EAGLE", "EAGLE", {"speculative_num_steps": 2}),
        ("EAGLE", "EAGLE", {"speculative_eagle_topk": 3, "speculative_num_draft_tokens": 6,
                            "chunked_prefill_size": 16}),
        ("EAGLE3", "EAGLE3", {"speculative_eagle_topk": 2}),
    ],
)  # fmt: skip
def test_greedy_outputs_equal_plain_decoding(paths, plain, algo, draft, flags) -> None:
    s = make_scheduler(paths, draft, speculative_algorithm=algo, **flags)
    fed = _record_features(s) if algo != "STANDALONE" else None
    outs = ids_of(run(s))
    assert outs == plain
    assert s.stats["spec_draft_tokens"] > 0
    _draft_idle(s)
    if fed is not None:
        _check_features(s, fed, outs)


def test_a_head_verifies_through_graphs_with_the_targets_capture(paths) -> None:
    """EAGLE's verify steps replaying verify graphs captured with the target's hidden-state
    capture on (a re-running capture on CPU, the triton backend in the interpreter): the plain
    tokens, and the head fed the target's own features, from graph replays."""
    opts = {"attention_backend": "triton", "dtype": "float32", "max_running_requests": 4}
    reqs = REQS[1:3]  # NOTE: two requests of different lengths: the interpreter is slow
    want = ids_of(run(make_scheduler(paths, **opts), reqs))
    s = make_scheduler(paths, "EAGLE", speculative_algorithm="EAGLE", speculative_eagle_topk=2,
                       **opts)  # fmt: skip
    s.runner.model.cpu_decode = None  # NOTE: the layer path, as on a GPU
    s.runner.capture_verify_graphs([s.spec.proposer.num_nodes], 4, capture=RerunCapture())
    fed = _record_features(s)
    outs = ids_of(run(s, reqs))
    assert outs == want
    assert s.stats["spec_verify_graph_steps"] == s.runner.verify_graph_replays > 0
    _draft_idle(s)
    _check_features(s, fed, outs, reqs)


def _record_features(s: Scheduler) -> dict[str, dict[int, torch.Tensor]]:
    """Every target feature the head is given, by request and position."""
    proposer, fed = s.spec.proposer, {}
    queue = proposer._queue_features

    def record(req, position, feats):
        for j in range(feats.shape[0]):
            fed.setdefault(req.rid, {})[position + j] = feats[j].clone()
        queue(req, position, feats)

    proposer._queue_features = record
    return fed


def _check_features(s: Scheduler, fed: dict, outs: dict[str, list[int]], reqs: list = REQS) -> None:
    """Each fed feature is the target's own hidden state (the captured layers) at its position
    in the final sequence: prefill rows, verify rows on accepted paths, plain decode rows."""
    for rid, ids, _ in reqs:
        seq = ids + outs[rid]
        row = s.runner.req_to_token.alloc()
        slots = s.runner.kv_pool.allocator.alloc(len(seq))
        s.runner.forward(extend_batch(s.runner, [seq], [row], slots))
        full = s.runner.take_hidden()
        s.runner.kv_pool.allocator.free(slots)
        s.runner.req_to_token.free(row)
        assert set(fed[rid]) == set(range(len(ids) + len(outs[rid]) - 1))
        for pos, f in fed[rid].items():
            assert torch.allclose(f, full[pos], atol=1e-4), (rid, pos)


def test_multi_turn_with_a_head(paths) -> None:
    """Turns that extend the previous turn's text: cache hits (the head gets no features for the
    cached part) and the same answers with speculation on and off (the CPU's row budget and
    back-off on)."""

    def turns(s: Scheduler) -> tuple[list[int], list[list[int]]]:
        cached, answers, history = [], [], prompt(1, 20)
        for turn in range(3):
            s.handle(gen(f"t{turn}", history, max_new_tokens=8))
            out = run_all(s)[f"t{turn}"]
            cached.append(out.cached_tokens)
            answers.append(out.new_ids)
            history = history + out.new_ids + prompt(turn + 10, 4)
        return cached, answers

    off = turns(make_scheduler(paths))
    on = turns(make_scheduler(paths, "EAGLE", every=False, speculative_algorithm="EAGLE"))
    assert on == off and sum(on[0]) > 0


def test_sampling_through_draft_trees_keeps_the_target_distribution(paths) -> None:
    """Temperature 1 with top-k and top-p; a STANDALONE draft's top-2 children at depth 1 (a
    DETERMINISTIC tree; the target drafting for itself, so that children are often accepted):
    the first two output tokens' joint frequencies fit the target's own probabilities (χ²). The
    first token is sampled by the prefill, the second by the verify step (a child accepted, or
    the residual's draw)."""
    s = make_scheduler(paths, "self", speculative_algorithm="STANDALONE", speculative_num_steps=1,
                       speculative_eagle_topk=2, max_running_requests=128)  # fmt: skip
    ids = prompt(3, 12)
    sp = {"temperature": 1.0, "top_k": 4, "top_p": 0.9, "max_new_tokens": 3}
    first = _filtered(s, ids, sp)
    joint = torch.zeros(VOCAB, VOCAB, dtype=torch.float64)
    for a in torch.nonzero(first).flatten().tolist():
        joint[a] = first[a] * _filtered(s, [*ids, a], sp)
    samples = 2000
    for k in range(samples):
        s.handle(gen(f"s{k}", ids, seed=k, **sp))
    pairs = torch.tensor([o.new_ids[0] * VOCAB + o.new_ids[1] for o in run_all(s).values()])
    assert chi2_pvalue(pairs, joint.flatten()) > ALPHA
    assert s.stats["spec_draft_tokens"] >= samples  # every request verified its two children
    _draft_idle(s)


@pytest.mark.slow
def test_default_model_drafting_for_itself_is_accepted_whole() -> None:
    """SmolLM2-135M (the default model, its GGUF on the CPU kernels) drafting for itself: the
    outputs of plain decoding, every verify step committing its 4 drafts and the bonus."""
    from radixlm.runtime.models.default_model import default_model_path

    def sched(**kw: Any) -> Scheduler:
        args = ServerArgs(device="cpu", skip_tokenizer_init=True, random_seed=0, num_threads=1,
                          max_total_tokens=2048, **kw)  # fmt: skip
        return Scheduler(args, ModelRunner(args, resolve_model(None)))

    prompts = [[1, 4093, 28, 253, 1382, 314, 253, 3213, 30], [1, 504, 1317, 282, 4372, 314, 216]]

    def go(s: Scheduler) -> dict[str, Any]:
        for i, ids in enumerate(prompts):
            s.handle(gen(f"r{i}", ids, max_new_tokens=21))
        return run_all(s)

    plain = ids_of(go(sched()))
    s = sched(speculative_algorithm="STANDALONE", speculative_draft_model_path=default_model_path(),
              speculative_num_steps=4)  # fmt: skip
    every_draft(s)
    outs = go(s)
    assert ids_of(outs) == plain
    for o in outs.values():  # 20 tokens after the prefill's: 4 steps of 5
        # NOTE: one step of slack: the draft's decode kernels and the verify step's extend
        # kernels may round a near-tie apart on some CPU
        assert o.spec_committed == 20 and o.spec_verify_ct <= 5
    _draft_idle(s)
