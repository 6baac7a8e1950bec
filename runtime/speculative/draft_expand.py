"""The top-k expansion of a draft model's tree (draft_tree.py's numbering), run on the draft's
`ModelRunner`: DECODE forwards over each request's `topk` frontier nodes, one per depth.

Each frontier node `j` of a request runs on branch row `rows[j]` of the draft's `req_to_token`:
indices `0 .. base - 1` hold the committed slots (written by the catch-up), `base .. base + d - 2`
its ancestors' tree slots, `base + d - 1` its own (depth d). When the next frontier is chosen, a
node's row takes its parent's tree part (one gather and one scatter over all requests).

`Expansion.frontier`: per forward, the candidate numbers of the nodes it ran and the slots their
KV went to: a proposer that keeps the accepted nodes' draft KV (draft_worker.py) finds it there.
With `kv_only_last`, one more forward runs the deepest frontier for its KV alone (no logits).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from radixlm.runtime.executor.forward_batch import ForwardBatch, ForwardMode
from radixlm.runtime.speculative.draft_tree import CandidateSet

# draft output rows -> (log-probabilities [rows, Vd], next features or None)
DraftStep = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor | None]]


class Expansion(NamedTuple):
    cands: CandidateSet
    frontier: list[tuple[torch.Tensor, torch.Tensor]]  # per forward: candidates [A, k], slots


def expand_tree(
    runner,
    step: DraftStep,
    to_target: Callable[[torch.Tensor], torch.Tensor],
    num_steps: int,
    rows: torch.Tensor,
    base: torch.Tensor,
    frontier_pos: torch.Tensor,
    root_out: torch.Tensor,
    slots: torch.Tensor,
    kv_only_last: bool,
) -> Expansion:
    """The expansion of A requests from their frontier rows' draft outputs `root_out` [A, *]:
    `rows` [A, k] branch rows, `base` [A] committed rows, `frontier_pos` [A] the position of the
    frontier row, `slots` [A, k, forwards] a fresh tree slot per branch and forward."""
    dev = runner.device
    a, k = rows.shape
    table = runner.req_to_token.table
    logp, feats = step(root_out)
    top = logp.topk(k, dim=-1)
    scores = top.values  # [A, k] cumulative scores of the frontier
    tokens = [to_target(top.indices)]
    score_list = [scores]
    parent_list = [torch.full((a, k), -1, dtype=torch.int64, device=dev)]
    cand = torch.arange(k, device=dev).expand(a, k)  # the frontier's candidate numbers
    frontier_tokens = tokens[0]
    parent_branch = None
    frontier: list[tuple[torch.Tensor, torch.Tensor]] = []
    if feats is not None:
        feats = feats[:, None].expand(a, k, feats.shape[-1])
    for d in range(1, num_steps + int(kv_only_last)):
        if parent_branch is not None:  # a new frontier node takes its parent's path
            cols = base[:, None] + torch.arange(d - 1, device=dev)
            src = table[rows.gather(1, parent_branch)[:, :, None], cols[:, None, :]]
            table[rows[:, :, None], cols[:, None, :]] = src
        step_slots = slots[:, :, d - 1]
        table[rows, (base + d - 1)[:, None].expand(a, k)] = step_slots.to(torch.int32)
        # NOTE: repeat_interleave, not expand + reshape: with one request that stays a stride-0
        # view, and the kernels read these rows as contiguous (`SeqLens + b`)
        seq = (base + d).repeat_interleave(k)
        batch = ForwardBatch(
            mode=ForwardMode.DECODE,
            batch_size=a * k,
            input_ids=frontier_tokens.reshape(-1),
            positions=(frontier_pos + d).repeat_interleave(k),
            out_cache_loc=step_slots.reshape(-1),
            req_pool_indices=rows.reshape(-1),
            seq_lens=seq,
            seq_lens_cpu=seq.tolist(),
            spec_features=None if feats is None else feats.reshape(a * k, -1),
        )
        out = runner.forward(batch)
        frontier.append((cand, step_slots))
        if d == num_steps:  # the KV-only forward of the deepest frontier
            break
        logp, step_feats = step(out)
        top = logp.topk(k, dim=-1)
        child_scores = (scores[:, :, None] + top.values.view(a, k, k)).reshape(a, k * k)
        child_tokens = to_target(top.indices).view(a, k * k)
        tokens.append(child_tokens)
        score_list.append(child_scores)
        parent_list.append(cand[:, :, None].expand(a, k, k).reshape(a, k * k))
        best = torch.sort(child_scores, dim=1, descending=True, stable=True).indices[:, :k]
        scores = child_scores.gather(1, best)
        cand = k + (d - 1) * k * k + best
        frontier_tokens = child_tokens.gather(1, best)
        parent_branch = best // k
        if step_feats is not None:
            step_feats = step_feats.view(a, k, -1)
            feats = step_feats.gather(1, parent_branch[:, :, None].expand_as(step_feats))
    cands = CandidateSet(
        torch.cat(tokens, dim=1), torch.cat(score_list, dim=1), torch.cat(parent_list, dim=1)
    )
    return Expansion(cands, frontier)
