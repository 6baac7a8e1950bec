"""Draft models on a CUDA device (skipped without one), fp32 so that greedy comparisons are not at
the mercy of bf16 rounding: greedy outputs identical with speculation on and off through the
minimal loop and through the real scheduler, with the draft steps replaying the draft runner's
CUDA graphs (STANDALONE, and the heads' static feature input), and forced acceptance when the
target drafts for itself. The target's verify forwards replay its verify CUDA graphs
(executor/verify_graphs.py): drafts of every quality in one batch (a scripted proposer) give the
plain tokens with the verify graphs and with --disable-cuda-graph, at batch 1 and 5."""

from __future__ import annotations

import pytest
import torch
from speculative.spec_loop import generate, greedy_reference
from speculative.test_draft_scheduler import make_scheduler, run
from speculative.test_spec_scheduler import (
    REQS,
    Scripted,
    every_draft,
    gen,
    ids_of,
    run_all,
)

from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.models.loader import resolve_model
from radixlm.runtime.scheduler.scheduler import Scheduler
from radixlm.runtime.server_args import ServerArgs
from radixlm.runtime.speculative.draft_setup import build_draft_proposer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

PROMPTS = [[5, 17, 250, 3, 99, 42, 7], [11, 300, 8, 8, 64], [400, 2, 77, 19, 5, 23, 123, 88, 6]]
CASES = [
    ("STANDALONE", "self", {"speculative_num_steps": 4}),
    ("STANDALONE", "small", {"speculative_eagle_topk": 2}),
    ("EAGLE", "EAGLE", {"speculative_eagle_topk": 3, "speculative_num_draft_tokens": 8}),
    ("EAGLE3", "EAGLE3", {"speculative_num_steps": 4, "speculative_eagle_topk": 2}),
]


def _count_replays(proposer) -> list[int]:
    graphs, count = proposer.runner.graphs, [0]
    assert graphs is not None
    replay = graphs.replay

    def counted(batch):
        count[0] += 1
        return replay(batch)

    graphs.replay = counted
    return count


@pytest.mark.parametrize("algo,draft,flags", CASES)
def test_loop_on_gpu_with_draft_graphs(paths, algo, draft, flags) -> None:
    args = ServerArgs(
        model_path=paths["target"], device="cuda", dtype="float32", max_total_tokens=4096,
        max_running_requests=8, speculative_algorithm=algo,
        speculative_draft_model_path=paths[draft], **flags,
    )  # fmt: skip
    target = ModelRunner(args, resolve_model(paths["target"]))
    proposer = build_draft_proposer(args, target)
    replays = _count_replays(proposer)
    outputs, steps = generate(target, proposer, PROMPTS, 20)
    assert outputs == greedy_reference(target, PROMPTS, 20)
    assert replays[0] > 0
    if draft == "self":
        assert all(a == 4 for step in steps for a in step)
    kv = proposer.runner.kv_pool.allocator
    assert kv.available() == kv.capacity


@pytest.mark.parametrize("algo,draft,flags", CASES)
def test_scheduler_on_gpu(paths, algo, draft, flags) -> None:
    opts = {"device": "cuda", "dtype": "float32"}
    plain = ids_of(run(make_scheduler(paths, **opts)))
    s = make_scheduler(paths, draft, speculative_algorithm=algo, **opts, **flags)
    replays = _count_replays(s.spec.proposer)
    assert ids_of(run(s)) == plain
    assert s.stats["spec_draft_tokens"] > 0 and replays[0] > 0


@pytest.mark.parametrize("algo", ["EAGLE", "EAGLE3"])
def test_head_target_verifies_through_graphs_on_gpu(paths, algo) -> None:
    """A head's target captures its verify graphs with the hidden-state capture on (draft_setup):
    the plain tokens, with verify steps replaying them."""
    opts = {"device": "cuda", "dtype": "float32", "cuda_graph_max_bs": 8}
    plain = ids_of(run(make_scheduler(paths, **opts)))
    s = make_scheduler(paths, algo, speculative_algorithm=algo, speculative_eagle_topk=2, **opts)
    graphs = s.runner.verify_graphs
    assert graphs is not None and graphs.capture_layers is not None
    assert ids_of(run(s)) == plain
    assert s.stats["spec_verify_graph_steps"] == s.runner.verify_graph_replays > 0


def _verify_scheduler(graphs: bool, spec: bool) -> Scheduler:
    """tiny-qwen2 on the device, fp32, the target built for NGRAM with 6 nodes (its verify
    graphs: batch sizes 1..8 x 6 nodes) or --disable-cuda-graph; `spec`: speculation on."""
    flags = {"cuda_graph_max_bs": 8} if graphs else {"disable_cuda_graph": True}
    args = ServerArgs(
        model_path="tiny-qwen2", load_format="dummy", device="cuda", dtype="float32",
        skip_tokenizer_init=True, random_seed=0, max_total_tokens=2048, max_running_requests=8,
        speculative_algorithm="NGRAM", speculative_num_draft_tokens=6, **flags,
    )  # fmt: skip
    runner = ModelRunner(args, resolve_model("tiny-qwen2", "dummy"))
    assert (runner.verify_graphs is not None) == graphs
    if graphs:
        assert runner.verify_graphs.captured == [(b, 6) for b in (1, 2, 4, 8)]
    return Scheduler(args if spec else args.replace(speculative_algorithm=None), runner)


@pytest.mark.parametrize("rids", [["r2"], ["r0", "r1", "r2", "r3", "r4"]], ids=["bs1", "bs5"])
def test_verify_graphs_give_the_plain_tokens(rids) -> None:
    """Scripted drafts that err at depth 0, 1, 3 and never (r4: its own script, never wrong):
    acceptance differs per request; the batch of 5 replays the 8-graph, then smaller ones with
    padding as requests finish, and trees cut short near max_new_tokens pad their nodes."""
    reqs = [r for r in REQS if r[0] in rids]
    s = _verify_scheduler(graphs=True, spec=False)
    for rid, ids, max_new in reqs:
        s.handle(gen(rid, ids, max_new_tokens=max_new))
    plain = ids_of(run_all(s))
    misses = {"r0": 0, "r1": 1, "r2": 3, "r3": 99}
    for graphs in (True, False):
        s = _verify_scheduler(graphs, spec=True)
        every_draft(s)
        s.spec.proposer = Scripted(plain, 6, misses)
        for rid, ids, max_new in reqs:
            s.handle(gen(rid, ids, max_new_tokens=max_new))
        outs = run_all(s)
        assert ids_of(outs) == plain, f"graphs={graphs}"
        steps = s.stats["spec_verify_graph_steps"]
        assert s.stats["spec_draft_tokens"] > 0
        assert steps == s.spec.runner.verify_graph_replays
        assert (steps > 0) if graphs else (steps == 0)
        if len(rids) > 1:
            accept = {rid: o.spec_committed / o.spec_verify_ct for rid, o in outs.items()}
            assert accept["r0"] == 1.0 < accept["r1"] < accept["r2"] < accept["r3"]
