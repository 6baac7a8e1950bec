"""`Proposer`: where a speculative step's draft trees come from (NGRAM lookup, a draft model, EAGLE
heads). The speculative step (the scheduler's verify path) is the only caller.

Data flow of one speculative step over a batch of decoding requests:
    proposer.propose(reqs) -> DraftTree [B, N] (tree_accept.py; node 0 = each request's last
        committed token, the root, whose KV is not in the pool yet)
    -> tree.alloc_draft_slots / build_tree / verify_forward_batch -> the target's verify forward
    -> tree_accept.accept_trees -> TreeAcceptResult (accepted path, committed tokens)
    -> tree.commit_path (rejected slots freed at once), grammar rollback, output bookkeeping
    -> proposer.on_verified(reqs, result, hidden) (a draft model extends its own state)
A request that leaves the running batch (finished, aborted, retracted) gets `release(req)`.

What the speculative step (spec_step.py) guarantees a proposer:
- `propose` is called once per decode step with every running request; the tree it returns may
  be cut before verification (depth left to the request, its grammar, the CPU row budget), never
  reordered. `result` in `on_verified` uses the proposer's own node numbering (cut nodes never
  appear on a path) and `hidden` its layout ([B * N, H], zero rows for cut nodes).
- Every decode step ends with `on_verified` (unless `needs_verified` is False: then never): a
  step that verified no draft (nothing proposed,
  everything cut, or no KV room) is reported as root-only trees (path [0], the sampled token as
  the bonus, `hidden` at each root's row). So the committed tokens of all steps reach the hooks.
- Every extend step (a prefill, a chunk of one, the re-extend of a retracted or jump-forwarded
  request) calls `on_prefilled` with the forward's output rows: the extend's logits rows, i.e.
  each request's last prompt row once its prompt is complete (and any input-logprob rows);
  an inner chunk has none. With a capture (below): every row of the forward. It is called after
  the step advanced `req.computed`: request i's rows are positions
  `[computed - extend_len, computed)`.

Ownership: a proposer owns its own state only (an n-gram index, a draft model's KV pool and its
per-request rows); it never touches the target's `req_to_token`, allocator or radix cache. It runs
on the scheduler thread; nothing here is thread-safe.

`hidden` is the target's last-layer hidden states of the rows just computed ([rows, H], in the
forward's row order) for proposers with `needs_hidden` (EAGLE); None for the others. A proposer
that set the target's capture (`ModelRunner.set_hidden_capture`: a draft head, draft_setup.py)
gets the captured layers instead ([rows, k * H]), and for an extend EVERY row of the forward
(each request's `extend_len` rows, in order), not only its output rows.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from radixlm.runtime.speculative.tree_accept import DraftKind, DraftTree, TreeAcceptResult

if TYPE_CHECKING:
    from radixlm.runtime.scheduler.req import Req


class Proposer(ABC):
    # How the children of a node are chosen: the acceptance rule depends on it (tree_accept.py).
    kind: DraftKind
    # N: nodes per request in every DraftTree this proposer returns, the root included (a fixed
    # shape, so that verify steps can be captured in CUDA graphs); padding nodes have parent < 0.
    num_nodes: int
    # Whether `on_prefilled` / `on_verified` need the target's hidden states.
    needs_hidden: bool = False
    # Whether `on_verified` is called at all (False: never, for proposers that read each
    # request's tokens themselves, like NGRAM; the step then skips building its arguments).
    needs_verified: bool = True
    # After `propose`: per request, a small int that sorts drafts by expected quality (NGRAM: the
    # matched window's length), which the draft gate keeps acceptance statistics by; None: none.
    hints: list[int] | None = None

    @abstractmethod
    def propose(self, reqs: Sequence[Req]) -> DraftTree:
        """Draft trees for `reqs` (each decoding: `fill_ids[-1]` is its root). A request with
        nothing to propose gets the root alone (every other node padding)."""

    def peek_hints(self, reqs: Sequence[Req]) -> list[int] | None:
        """The `hints` that `propose(reqs)` would give, cheaply, before deciding to propose
        (None: this proposer gives none). 0: nothing to propose for that request."""
        return None

    def on_prefilled(self, reqs: Sequence[Req], hidden: torch.Tensor | None) -> None:  # noqa: B027
        """`reqs` finished (a chunk of) their prefill; `hidden` covers the extend rows."""

    def on_verified(  # noqa: B027
        self, reqs: Sequence[Req], result: TreeAcceptResult, hidden: torch.Tensor | None
    ) -> None:
        """The verify step committed `result` for `reqs` (`hidden`: the verify rows, [B * N, H])."""

    def release(self, req: Req) -> None:  # noqa: B027
        """`req` left the running batch: drop (and free) what is kept for it."""

    def check_idle(self) -> None:  # noqa: B027
        """With no request running: raise AssertionError unless everything kept for requests
        was released (a draft model: its KV slots and rows all free). `check_invariants`."""
