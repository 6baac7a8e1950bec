"""EAGLE-2's reranked draft trees (runtime/speculative/draft_tree.py) from simulated top-k
expansions: valid trees of the fixed size, closed under parents, the best-scoring candidates kept,
parents before children."""

from __future__ import annotations

import pytest
import torch

from radixlm.runtime.speculative.draft_tree import (
    CandidateSet,
    max_candidates,
    root_only,
    select_tree,
)
from radixlm.runtime.speculative.tree import check_parents
from radixlm.runtime.speculative.tree_accept import DraftKind


def expansion(bsz: int, topk: int, steps: int, seed: int, ties: bool = False) -> CandidateSet:
    """What the draft worker's expansion records: step 1's top-k, then each step the top-k
    children of the `topk` best-scoring children of the step before (log-probabilities <= 0)."""
    g = torch.Generator().manual_seed(seed)

    def logp(*shape):
        x = -torch.rand(*shape, generator=g) * 3
        return x.round() if ties else x  # rounded: many exact ties

    tokens = [torch.randint(0, 1000, (bsz, topk), generator=g)]
    scores = [logp(bsz, topk).sort(dim=1, descending=True).values]
    parents = [torch.full((bsz, topk), -1)]
    cand, front = torch.arange(topk).expand(bsz, topk), scores[0]
    for d in range(1, steps):
        child = (front[:, :, None] + logp(bsz, topk, topk)).reshape(bsz, -1)
        tokens.append(torch.randint(0, 1000, (bsz, topk * topk), generator=g))
        scores.append(child)
        parents.append(cand[:, :, None].expand(bsz, topk, topk).reshape(bsz, -1))
        best = torch.sort(child, dim=1, descending=True, stable=True).indices[:, :topk]
        cand, front = topk + (d - 1) * topk * topk + best, child.gather(1, best)
    return CandidateSet(torch.cat(tokens, 1), torch.cat(scores, 1), torch.cat(parents, 1))


@pytest.mark.parametrize("topk,steps,nodes", [(1, 4, 5), (2, 3, 6), (4, 3, 8), (3, 4, 30)])
@pytest.mark.parametrize("ties", [False, True])
def test_trees_keep_the_best_candidates_closed_under_parents(topk, steps, nodes, ties) -> None:
    cands = expansion(6, topk, steps, seed=topk * 10 + steps, ties=ties)
    assert cands.scores.shape[1] == max_candidates(topk, steps)
    roots = torch.arange(6) + 7
    active = torch.tensor([True, True, False, True, True, True])
    tree = select_tree(cands, roots, active, nodes)
    assert tree.kind is DraftKind.DETERMINISTIC and tree.draft_probs is None
    assert tree.tokens.shape == tree.parents.shape == (6, nodes)
    check_parents(tree.parents)
    assert tree.tokens[:, 0].tolist() == roots.tolist()
    assert (tree.parents[2, 1:] < 0).all()  # inactive: the root alone
    for i in (0, 1, 3, 4, 5):
        par = tree.parents[i].tolist()
        assert all(0 <= par[j] < j for j in range(1, nodes))  # every node real, parents first
        # the kept candidates: the best scores (as a multiset), each node's token and parent
        # those of its candidate
        order = torch.sort(cands.scores[i], descending=True, stable=True).indices[: nodes - 1]
        kept = order.sort().values.tolist()
        assert tree.tokens[i, 1:].tolist() == cands.tokens[i, kept].tolist()
        node_of = {c: j + 1 for j, c in enumerate(kept)}
        for j, c in enumerate(kept, start=1):
            p = int(cands.parents[i, c])
            assert par[j] == (0 if p < 0 else node_of[p])


def test_root_only_trees() -> None:
    tree = root_only(torch.tensor([4, 9]), 5)
    check_parents(tree.parents)
    assert tree.tokens[:, 0].tolist() == [4, 9]
    assert (tree.parents[:, 1:] < 0).all()
