"""Draft trees from a draft model's top-k expansion, reranked by cumulative score (EAGLE-2).

The expansion (runtime/speculative/draft_worker.py): step 1 takes the top `topk` tokens of the
root's draft distribution; each later step expands the current frontier (`topk` nodes per request)
with the top `topk` children of each, and the `topk` best of those `topk**2` children (by cumulative
log-probability, the sum over the node's path) become the next frontier. Every node drawn is a
candidate, numbered in the order drawn (`CandidateSet`): step 1's first, then each step's
`topk**2` children, so a parent's number is always below its children's.

`select_tree` keeps the root and the `num_nodes - 1` candidates of highest score. NOTE: the kept
set is closed under parents: a child's score is its parent's plus a log-probability <= 0 (never
above it in floating point either), and ties go to the lower number, so a parent always ranks
before its children. Kept nodes are ordered by candidate number (parents first, siblings in the
order drawn). The choice of children depends only on the draft's values, never on randomness the
target's acceptance shares: the trees are `DraftKind.DETERMINISTIC` (tree_accept.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from radixlm.runtime.speculative.tree_accept import DraftKind, DraftTree


class CandidateSet(NamedTuple):
    tokens: torch.Tensor  # [B, C] int64 target token ids
    scores: torch.Tensor  # [B, C] float32 cumulative log-probabilities
    parents: torch.Tensor  # [B, C] int64 candidate number of the parent, -1 for the root


def max_candidates(topk: int, num_steps: int) -> int:
    return topk + (num_steps - 1) * topk * topk


@dataclass(frozen=True)
class DraftShape:
    """The tree a draft model proposes: `num_steps` draft forwards deep, `topk` children per
    expanded node, `num_nodes` nodes verified (the root included)."""

    num_steps: int
    topk: int
    num_nodes: int

    @classmethod
    def of(cls, num_steps: int, topk: int, num_draft_tokens: int | None) -> DraftShape:
        """`num_draft_tokens` None: the whole chain for topk 1, else 8 (SGLang's default);
        capped by the nodes the expansion can draw."""
        most = 1 + max_candidates(topk, num_steps)
        wanted = num_draft_tokens or (num_steps + 1 if topk == 1 else 8)
        return cls(num_steps, topk, min(wanted, most))


def best_candidates(scores: torch.Tensor, keep: int) -> torch.Tensor:
    """[B, keep] the numbers of each request's `keep` best candidates (ties: the lower number),
    in increasing order (parents first): node j + 1 of its tree is candidate [:, j]."""
    order = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :keep]
    return order.sort(dim=1).values


def select_tree(
    cands: CandidateSet,
    roots: torch.Tensor,
    active: torch.Tensor,
    num_nodes: int,
    chosen: torch.Tensor | None = None,
) -> DraftTree:
    """The DraftTree [B, num_nodes] of each request's best `num_nodes - 1` candidates under its
    root token (`roots` [B]; `chosen`: `best_candidates`, computed here when None); a request
    with `active` False gets its root alone (the rest padding). Needs `num_nodes - 1 <= C`."""
    bsz, c = cands.scores.shape
    keep = num_nodes - 1
    assert 0 <= keep <= c, (keep, c)
    device = cands.scores.device
    if chosen is None:
        chosen = best_candidates(cands.scores, keep)
    node_of = torch.full((bsz, c), -1, dtype=torch.int64, device=device)
    node_of.scatter_(1, chosen, torch.arange(1, keep + 1, device=device).expand(bsz, keep))
    parent_cand = cands.parents.gather(1, chosen)
    parents = torch.where(
        parent_cand < 0, 0, node_of.gather(1, parent_cand.clamp(min=0))
    )  # a kept node's parent is kept (module docstring)
    tokens = torch.cat([roots[:, None], cands.tokens.gather(1, chosen)], dim=1)
    parents = torch.cat([torch.zeros(bsz, 1, dtype=torch.int64, device=device), parents], dim=1)
    inactive = ~active.to(device)[:, None]
    parents = torch.where(inactive, -1, parents)
    parents[:, 0] = 0
    tokens = torch.where(inactive, roots[:, None], tokens)
    return DraftTree(tokens, parents, None, DraftKind.DETERMINISTIC)


def root_only(roots: torch.Tensor, num_nodes: int) -> DraftTree:
    """Trees of the root alone: nothing to propose."""
    bsz = roots.shape[0]
    parents = torch.full((bsz, num_nodes), -1, dtype=torch.int64, device=roots.device)
    parents[:, 0] = 0
    tokens = roots[:, None].expand(bsz, num_nodes).contiguous()
    return DraftTree(tokens, parents, None, DraftKind.DETERMINISTIC)
