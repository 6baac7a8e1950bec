"""The speculative step's tensors between its two numberings of a draft tree: the proposer's
(the tree it proposed, `N` nodes) and the verify forward's (the nodes kept by the checks,
compacted, `n` nodes). Pure tensor functions, used by spec_step.py.

- `kept_probs`: the draft distributions of the kept nodes (SAMPLED kinds), verify numbering.
- `in_proposer_layout`: a verify step's `TreeAcceptResult` and hidden rows in the proposer's
  numbering (what `Proposer.on_verified` receives).
- `plain_result`: a plain decode step as root-only trees in the proposer's layout.
"""

from __future__ import annotations

import torch

from radixlm.runtime.speculative.draft_check import CheckedDraft
from radixlm.runtime.speculative.tree_accept import DraftTree, TreeAcceptResult


def kept_probs(draft: DraftTree, checked: list[CheckedDraft], n: int) -> torch.Tensor | None:
    """The draft distributions of the kept nodes ([B, n, V]), for SAMPLED kinds."""
    if draft.draft_probs is None:
        return None
    index = torch.zeros(len(checked), n, dtype=torch.int64)
    for i, c in enumerate(checked):
        index[i, : len(c.kept)] = torch.tensor(c.kept)
    index = index.to(draft.draft_probs.device)
    probs = draft.draft_probs
    return probs.gather(1, index[:, :, None].expand(-1, -1, probs.shape[-1]))


def in_proposer_layout(
    result: TreeAcceptResult,
    hidden: torch.Tensor,
    checked: list[CheckedDraft],
    draft: DraftTree,
    needs_hidden: bool,
) -> tuple[TreeAcceptResult, torch.Tensor | None]:
    """`result` with its paths in the proposer's node numbering (the tree it proposed, before
    the checks cut nodes) and, for proposers that need them, the verify rows' hidden states
    scattered into that layout ([B * N, H]; rows of cut nodes are zero)."""
    bsz, width = draft.tokens.shape
    n = result.path.shape[1]
    kept = torch.zeros(bsz, n, dtype=torch.int64)
    for i, c in enumerate(checked):
        kept[i, : len(c.kept)] = torch.tensor(c.kept)
    kept = kept.to(result.path.device)
    path = torch.where(result.path >= 0, kept.gather(1, result.path.clamp_min(0)), -1)
    pad = width - n
    grow = lambda t, v: torch.nn.functional.pad(t, (0, pad), value=v)  # noqa: E731
    mapped = TreeAcceptResult(
        grow(path, -1),
        result.num_accepted,
        grow(result.tokens, -1),
        None if result.logprobs is None else grow(result.logprobs, float("nan")),
    )
    full = None
    if needs_hidden:
        full = hidden.new_zeros(bsz, width, hidden.shape[-1])
        rows = torch.arange(bsz, device=hidden.device)[:, None].expand(-1, n)
        valid = torch.arange(n)[None, :] < torch.tensor([len(c.kept) for c in checked])[:, None]
        valid = valid.to(hidden.device)
        full[rows[valid], kept.to(hidden.device)[valid]] = hidden.view(bsz, n, -1)[valid]
        full = full.view(bsz * width, -1)
    return mapped, full


def plain_result(
    next_ids: torch.Tensor, hidden: torch.Tensor | None, width: int
) -> tuple[TreeAcceptResult, torch.Tensor | None]:
    """A plain decode step as a verify step of root-only trees of `width` nodes: path [0],
    nothing accepted, the sampled token as the bonus; hidden rows at each tree's root."""
    bsz = next_ids.shape[0]
    path = torch.full((bsz, width), -1, dtype=torch.int64, device=next_ids.device)
    path[:, 0] = 0
    tokens = path.clone()
    tokens[:, 0] = next_ids
    result = TreeAcceptResult(path, torch.zeros_like(next_ids), tokens, None)
    full = None
    if hidden is not None:
        full = hidden.new_zeros(bsz, width, hidden.shape[-1])
        full[:, 0] = hidden
        full = full.view(bsz * width, -1)
    return result, full
