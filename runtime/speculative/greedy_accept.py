"""Acceptance of draft trees when every row of the batch decodes greedily and no logprob is
wanted: the host walk of `tree_accept`'s greedy rule, without its `[B * N, V]` distributions.

The rule (tree_accept.py): from the root, the first child (in node-index order) whose token is
the target's argmax after its parent's path is accepted and becomes the current node; the bonus
token is the argmax at the last accepted node. `best` is that argmax of every node's processed
logits (`sampler.argmax` of the logits after the logit processors: what `target_probs` one-hots
and `tree_accept` takes the argmax of again), so the result is the one `accept_trees` returns.

Ownership: pure function of its arguments.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from radixlm.runtime.sampling.sampler import apply_logit_processors, argmax
from radixlm.runtime.sampling.sampling_batch import SamplingBatch
from radixlm.runtime.speculative.tree_accept import TreeAcceptResult


@torch.inference_mode()
def greedy_best(logits: torch.Tensor, sb: SamplingBatch) -> torch.Tensor:
    """[rows] argmax of each row's processed logits (the logit processors edit `logits` in
    place, as `target_probs` does)."""
    return argmax(apply_logit_processors(logits.float(), sb))


def accept_greedy(
    best: Sequence[Sequence[int]], tokens: Sequence[Sequence[int]],
    parents: Sequence[Sequence[int]],
) -> TreeAcceptResult:  # fmt: skip
    """best, tokens, parents: [B][N] host lists (padding nodes: parent < 0)."""
    n = len(tokens[0]) if tokens else 0
    paths, accepted, outs = [], [], []
    for row_best, row_tok, row_par in zip(best, tokens, parents):
        path, out, cur = [0], [], 0
        for j in range(1, n):
            if row_par[j] == cur and row_tok[j] == row_best[cur]:
                path.append(j)
                out.append(row_tok[j])
                cur = j
        out.append(row_best[cur])
        accepted.append(len(path) - 1)
        paths.append(path + [-1] * (n - len(path)))
        outs.append(out + [-1] * (n - len(out)))
    return TreeAcceptResult(
        torch.tensor(paths, dtype=torch.int64).view(-1, n),
        torch.tensor(accepted, dtype=torch.int64),
        torch.tensor(outs, dtype=torch.int64).view(-1, n),
        None,
    )
