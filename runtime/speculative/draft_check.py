"""The checks a request's draft tree passes before it is verified: a depth limit (what the
request may still commit) and its grammar. A node that fails, and everything under it, is cut;
the kept nodes are compacted (parents first, the order of the proposer kept).

`check_draft(tokens, parents, max_depth, grammar, mask_rows)` walks the real nodes in index order
with the request's grammar: each node's token must be accepted in the state of its parent's path
(else it is cut), and the grammar's bitmask in the state after the node's path is written to
`mask_rows[k]` for kept node k (row 0: the root, the grammar's current state). The walk moves
between branches by `rollback` to the common ancestor and `accept` down the new path, and ends
with the grammar back where it started (it has consumed exactly the request's output, as the
result path expects).

Ownership: reads the draft; moves the request's grammar only inside the call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch


class CheckedDraft(NamedTuple):
    kept: list[int]  # original node indices kept, node 0 first
    tokens: list[int]  # their tokens
    parents: list[int]  # their parents, renumbered (-1 for the root)


def _path(parents: Sequence[int], j: int) -> list[int]:
    """Nodes from the root (excluded) down to `j` (included)."""
    out = []
    while j > 0:
        out.append(j)
        j = parents[j]
    return out[::-1]


def check_draft(
    tokens: Sequence[int],
    parents: Sequence[int],
    max_depth: int,
    grammar: Any = None,  # constrained/base.py `Grammar`
    mask_rows: torch.Tensor | None = None,  # [>= len(tokens), words] int32 when `grammar` is set
) -> CheckedDraft:
    depth = [0] * len(tokens)
    keep = [False] * len(tokens)
    keep[0] = True
    if grammar is not None:
        assert mask_rows is not None
        max_depth = min(max_depth, grammar.max_rollback)
        grammar.fill_mask(mask_rows[0])
    stack: list[int] = []  # nodes the grammar consumed beyond its state at the root
    kept = [0]
    for j in range(1, len(tokens)):
        p = parents[j]
        if p < 0 or not keep[p] or depth[p] >= max_depth:
            continue
        depth[j] = depth[p] + 1
        if grammar is not None:
            want = _path(parents, p)
            same = 0
            while same < min(len(stack), len(want)) and stack[same] == want[same]:
                same += 1
            if len(stack) > same:
                grammar.rollback(len(stack) - same)
                del stack[same:]
            for node in want[same:]:
                ok = grammar.accept(tokens[node])
                assert ok, "a kept node's token was accepted before"
                stack.append(node)
            if not grammar.accept(tokens[j]):
                continue
            stack.append(j)
            grammar.fill_mask(mask_rows[len(kept)])
        keep[j] = True
        kept.append(j)
    if grammar is not None and stack:
        grammar.rollback(len(stack))
    new_index = {old: k for k, old in enumerate(kept)}
    new_parents = [-1] + [new_index[parents[j]] for j in kept[1:]]
    return CheckedDraft(kept, [int(tokens[j]) for j in kept], new_parents)
