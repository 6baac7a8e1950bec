"""A minimal greedy speculative loop on a target `ModelRunner` and a `Proposer`, without the
scheduler: prefill, then propose -> tree verify -> accept_trees -> commit_path -> on_verified, with
the target's hidden-state capture when the proposer needs it. The draft-model tests use it to
check exactness and acceptance; the scheduler's own speculative step is tested on its side."""

from __future__ import annotations

import torch

from radixlm.runtime.executor.forward_batch import ForwardBatch, ForwardMode
from radixlm.runtime.sampling.sampling_batch import SamplingBatch
from radixlm.runtime.sampling.sampling_params import SamplingParams
from radixlm.runtime.scheduler.req import Req
from radixlm.runtime.speculative.tree import (
    alloc_draft_slots,
    build_tree,
    check_parents,
    commit_path,
    verify_forward_batch,
)
from radixlm.runtime.speculative.tree_accept import accept_trees, target_probs


def new_reqs(prompts: list[list[int]], max_new: int) -> list[Req]:
    sp = SamplingParams(temperature=0.0, max_new_tokens=max_new)
    return [Req(f"r{i}", list(p), sp, eos_ids=(), seed=0) for i, p in enumerate(prompts)]


def extend_batch(
    target, seqs: list[list[int]], rows: list[int], slots: torch.Tensor
) -> ForwardBatch:
    """An EXTEND batch of whole sequences (no prefix) with the last row of each as logits row."""
    dev = target.device
    lens = [len(s) for s in seqs]
    starts = [sum(lens[:i]) for i in range(len(seqs))]
    for row, s, n in zip(rows, starts, lens):
        target.req_to_token.write(row, 0, slots[s : s + n])
    t = lambda v: torch.tensor(v, dtype=torch.int64, device=dev)  # noqa: E731
    last = [s + n - 1 for s, n in zip(starts, lens)]
    return ForwardBatch(
        ForwardMode.EXTEND, len(seqs), t([x for s in seqs for x in s]),
        t([i for n in lens for i in range(n)]), slots, t(rows), t(lens), lens, [0] * len(seqs),
        lens, t([0] * len(seqs)), t(lens), t(starts), t(last), last,
    )  # fmt: skip


@torch.inference_mode()
def prefill(target, proposer, reqs: list[Req], cached: int = 0, chunks: int = 1) -> None:
    """One EXTEND over the prompts; each request's first token greedy. The proposer sees the
    prompt as a scheduler with a radix cache and chunked prefill would show it: the first `cached`
    positions never (a cache hit), the rest in `chunks` calls of `on_prefilled`."""
    lens = [len(r.origin_input_ids) for r in reqs]
    slots = target.kv_pool.allocator.alloc(sum(lens))
    for r in reqs:
        r.req_pool_idx = target.req_to_token.alloc()
    seqs = [r.origin_input_ids for r in reqs]
    hidden = target.forward(extend_batch(target, seqs, [r.req_pool_idx for r in reqs], slots))
    captured = target.take_hidden()
    first = target.compute_logits(hidden).argmax(-1).tolist()
    for r, tok in zip(reqs, first):
        r.output_ids.append(tok)
    starts = [sum(lens[:i]) for i in range(len(reqs))]
    for c in range(chunks):  # chunk c covers positions [lo, hi) of every prompt
        rows = []
        for r, s, n in zip(reqs, starts, lens):
            lo = cached + (n - cached) * c // chunks
            hi = cached + (n - cached) * (c + 1) // chunks
            r.computed, r.extend_len = hi, hi - lo
            rows.extend(range(s + lo, s + hi))
        sel = None if captured is None else captured[torch.tensor(rows, device=captured.device)]
        proposer.on_prefilled(reqs, sel)


@torch.inference_mode()
def verify_step(target, proposer, reqs: list[Req]) -> list[int]:
    """One speculative step for every request; returns the accepted draft counts."""
    tree = proposer.propose(reqs)
    check_parents(tree.parents)
    b, n = tree.tokens.shape
    assert n == proposer.num_nodes
    real = (tree.parents >= 0).sum(1).tolist()  # real nodes come first
    assert all((tree.parents[i, : real[i]] >= 0).all() for i in range(b))
    prefix = [r.computed for r in reqs]
    loc = alloc_draft_slots(target.kv_pool.allocator, real, n)
    layout = build_tree(tree.parents, torch.tensor(prefix, device=target.device))
    rows = torch.tensor([r.req_pool_idx for r in reqs], device=target.device)
    batch = verify_forward_batch(tree.tokens.reshape(-1), rows, prefix, loc, layout)
    hidden = target.forward(batch)
    captured = target.take_hidden()
    greedy = SamplingBatch.greedy_only(b * n)
    probs = target_probs(target.compute_logits(hidden), greedy)
    res = accept_trees(tree, probs, [None] * b)
    accepted = []
    for i, r in enumerate(reqs):
        a = int(res.num_accepted[i])
        path = res.path[i, : a + 1].tolist()
        commit_path(target.req_to_token, r.req_pool_idx, prefix[i], loc[i], tree.parents[i], path,
                    target.kv_pool.allocator)  # fmt: skip
        r.output_ids.extend(res.tokens[i, : a + 1].tolist())
        r.computed += a + 1
        accepted.append(a)
    proposer.on_verified(reqs, res, captured)
    return accepted


def generate(
    target, proposer, prompts: list[list[int]], max_new: int, cached: int = 0, chunks: int = 1
) -> tuple[list, list]:
    """Greedy outputs (each cut at `max_new`) and the accepted counts of every step; every
    target slot and row is given back and every request released at the end."""
    reqs = new_reqs(prompts, max_new)
    free = target.kv_pool.allocator.available()
    prefill(target, proposer, reqs, cached, chunks)
    steps = []
    while min(len(r.output_ids) for r in reqs) < max_new:
        steps.append(verify_step(target, proposer, reqs))
    for r in reqs:
        slots = target.req_to_token.table[r.req_pool_idx, : r.computed].to(torch.int64)
        target.kv_pool.allocator.free(slots)
        target.req_to_token.free(r.req_pool_idx)
        proposer.release(r)
    assert target.kv_pool.allocator.available() == free
    return [r.output_ids[:max_new] for r in reqs], steps


@torch.inference_mode()
def greedy_reference(target, prompts: list[list[int]], max_new: int) -> list[list[int]]:
    """Plain greedy decoding, one full EXTEND per token (no cache, no speculation)."""
    seqs = [list(p) for p in prompts]
    rows = [target.req_to_token.alloc() for _ in seqs]
    for _ in range(max_new):
        slots = target.kv_pool.allocator.alloc(sum(map(len, seqs)))
        hidden = target.forward(extend_batch(target, seqs, rows, slots))
        target.take_hidden()
        target.kv_pool.allocator.free(slots)
        for s, tok in zip(seqs, target.compute_logits(hidden).argmax(-1).tolist()):
            s.append(tok)
    for row in rows:
        target.req_to_token.free(row)
    return [s[len(p) :] for s, p in zip(seqs, prompts)]
