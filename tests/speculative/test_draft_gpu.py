"""Draft models on a CUDA device (skipped without one), fp32 so that greedy comparisons are not at
the mercy of bf16 rounding: greedy outputs identical with speculation on and off through the
minimal loop and through the real scheduler, with the draft steps replaying the draft runner's
CUDA graphs (STANDALONE, and the heads' static feature input), and forced acceptance when the
target drafts for itself."""

from __future__ import annotations

import pytest
import torch
from speculative.spec_loop import generate, greedy_reference
from speculative.test_draft_scheduler import make_scheduler, run
from speculative.test_spec_scheduler import ids_of

from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.models.loader import resolve_model
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
