"""`DraftModelProposer`: draft trees from a draft model (STANDALONE: a small causal LM with the
target's vocabulary; EAGLE / EAGLE3: a draft head on the target's hidden states).

The draft runs in a `ModelRunner` of its own (draft_setup.py builds it): its weights, its KV pool,
its `req_to_token` (`topk` rows per request) and its attention backend (and, for a STANDALONE
draft on GPU, its decode CUDA graphs, which the draft steps replay). Per request it keeps a
`ReqDraftState` (draft_state.py). One `propose` over a batch:

1. catch up (draft_catchup.py): one forward over every request's rows not yet in the draft (the
   prompt the first time; then the tokens the last verify step committed that the draft has not
   run), ending with the frontier row, whose output is the root's draft distribution
   (STANDALONE: the root token itself; EAGLE: the target feature before the root with the root
   token). Those rows are committed draft KV, kept until the request is released or its tokens
   change.
2. expand (draft_expand.py): `num_steps - 1` DECODE forwards over `topk` frontier nodes per
   request (the top-k expansion of draft_tree.py), each node on its own branch row of
   `req_to_token` (the committed slots, its ancestors' tree slots, its own).
3. `select_tree` keeps the best `num_nodes - 1` candidates (EAGLE-2's reranking).
4. STANDALONE: the draft KV of the kept nodes it ran (one more forward runs the deepest frontier
   for its KV) is held (`ReqDraftState.held`) until the verify step: `on_verified` appends the
   accepted path's rows to the committed ones, so the next catch-up is usually the new root
   alone (a DECODE batch); the other tree slots are freed at once. An EAGLE head frees them all:
   its committed rows read the target's features, not its own.

EAGLE heads need the target's features of every committed position: `on_prefilled` queues those of
the prompt's rows, `on_verified` those of the root and the accepted nodes (the rows the target
computed); the catch-up consumes them. A request whose rows cannot be caught up (no features yet,
draft KV or rows exhausted, the context full) gets its root alone: speculation never fails a
request, it only proposes less.

Ownership: the proposer owns the draft runner and every draft slot and row; it reads the requests'
`fill_ids` and never touches the target's memory. Scheduler thread only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from radixlm.runtime.speculative.draft_catchup import CatchupRows, catchup_batch
from radixlm.runtime.speculative.draft_expand import expand_tree
from radixlm.runtime.speculative.draft_state import ReqDraftState
from radixlm.runtime.speculative.draft_tree import (
    DraftShape,
    best_candidates,
    root_only,
    select_tree,
)
from radixlm.runtime.speculative.proposer import Proposer
from radixlm.runtime.speculative.tree_accept import DraftKind, DraftTree, TreeAcceptResult

if TYPE_CHECKING:
    from radixlm.runtime.executor.model_runner import ModelRunner
    from radixlm.runtime.scheduler.req import Req


class DraftModelProposer(Proposer):
    kind = DraftKind.DETERMINISTIC

    def __init__(self, runner: ModelRunner, shape: DraftShape, eagle: bool) -> None:
        self.runner = runner
        self.shape = shape
        self.num_nodes = shape.num_nodes
        self.needs_hidden = eagle
        self.shift = 1 if eagle else 0
        self.model = runner.model
        self.states: dict[str, ReqDraftState] = {}

    # ---- bookkeeping -----------------------------------------------------------------------------
    def release(self, req: Req) -> None:
        st = self.states.pop(req.rid, None)
        if st is not None:
            self._free(st)

    def check_idle(self) -> None:
        pool, rows = self.runner.kv_pool, self.runner.req_to_token
        if self.states or pool.allocator.available() != pool.num_slots:
            raise AssertionError(f"draft KV leaked: {len(self.states)} request states kept")
        if rows.available() != rows.size:
            raise AssertionError("draft req_to_token rows leaked")

    def _free(self, st: ReqDraftState) -> None:
        self._free_slots(st.take_held())
        self.runner.kv_pool.allocator.free(st.all_slots().to(self.runner.device))
        for row in st.rows:
            self.runner.req_to_token.free(row)
        st.rows, st.tokens, st.slots = [], [], []

    def on_prefilled(self, reqs: Sequence[Req], hidden: torch.Tensor | None) -> None:
        """`hidden`: each request's `extend_len` rows in `reqs` order, positions
        `[computed - extend_len, computed)` (called after the step advanced `computed`)."""
        if not self.needs_hidden or hidden is None:
            return
        offset = 0
        for req in reqs:
            n = req.extend_len
            self._queue_features(req, req.computed - n, hidden[offset : offset + n])
            offset += n

    def _free_slots(self, slots: list[int]) -> None:
        if slots:
            dev = self.runner.device
            self.runner.kv_pool.allocator.free(torch.tensor(slots, dtype=torch.int64, device=dev))

    def on_verified(
        self, reqs: Sequence[Req], result: TreeAcceptResult, hidden: torch.Tensor | None
    ) -> None:
        """STANDALONE: keep the draft KV of the accepted nodes the draft ran (the path below the
        root, up to the first node it did not run); EAGLE: queue the target's features of each
        request's root and accepted nodes."""
        if not self.needs_hidden:
            self._keep_accepted(reqs, result)
            return
        if hidden is None:
            return
        n = self.num_nodes
        for i, req in enumerate(reqs):
            st = self.states.get(req.rid)
            if st is None:
                continue
            a = int(result.num_accepted[i])
            rows = result.path[i, : a + 1].to(hidden.device) + i * n
            self._queue_features(req, st.next_position + st.num_features, hidden[rows])

    def _keep_accepted(self, reqs: Sequence[Req], result: TreeAcceptResult) -> None:
        num_acc = result.num_accepted.tolist()
        paths = result.path.tolist()
        for i, req in enumerate(reqs):
            st = self.states.get(req.rid)
            if st is None or not st.held:
                continue
            slots, tokens = [], []
            for node in paths[i][1 : num_acc[i] + 1]:
                if node not in st.held:
                    break
                slot, token = st.held.pop(node)
                slots.append(slot)
                tokens.append(token)
            self._free_slots(st.take_held())
            if not slots:
                continue
            # NOTE: the proposal's catch-up ended at the root: these rows follow it, at the
            # positions and with the context the catch-up would give them.
            dev = self.runner.device
            kept = torch.tensor(slots, dtype=torch.int64, device=dev)
            rows = torch.tensor(st.rows, dtype=torch.int64, device=dev)
            n = st.num_rows
            self.runner.req_to_token.table[rows, n : n + len(slots)] = kept.to(torch.int32)
            st.tokens.extend(tokens)
            st.slots.append(kept)

    def _queue_features(self, req: Req, position: int, feats: torch.Tensor) -> None:
        st = self.states.get(req.rid)
        if st is not None and position != st.next_position + st.num_features:
            self.release(req)  # not contiguous (a retraction, a rewrite): start over from here
            st = None
        if st is None:
            st = self.states[req.rid] = ReqDraftState(start=position)
        st.features.append(feats.detach().clone())

    def _sync(self, req: Req) -> ReqDraftState | None:
        """The request's state, checked against its tokens: rows whose token changed are dropped
        (STANDALONE redraws from there; an EAGLE head starts over, its features are gone)."""
        st = self.states.get(req.rid)
        if st is None:
            if self.needs_hidden:
                return None  # no target features yet
            st = self.states[req.rid] = ReqDraftState(start=0)
        fill = req.fill_ids
        lo = st.start + self.shift
        if fill[lo : lo + st.num_rows] == st.tokens:
            return st
        if self.needs_hidden:
            self.release(req)
            return None
        keep = 0
        for keep, (a, b) in enumerate(zip(fill[lo:], st.tokens)):  # noqa: B007
            if a != b:
                break
        self.runner.kv_pool.allocator.free(st.truncate(keep).to(self.runner.device))
        return st

    # ---- proposal --------------------------------------------------------------------------------
    @torch.inference_mode()
    def propose(self, reqs: Sequence[Req]) -> DraftTree:
        device = self.runner.device
        roots = torch.tensor([r.fill_ids[-1] for r in reqs], dtype=torch.int64, device=device)
        tree = root_only(roots, self.num_nodes)
        work = self._plan_catchup(reqs)
        if not work:
            return tree
        # NOTE: the planned rows are the draft's from now on: run them whatever follows
        frontier_out = self._catchup(work)
        k, steps = self.shape.topk, self.shape.num_steps
        keep_kv = not self.needs_hidden  # STANDALONE keeps the accepted nodes' draft KV
        forwards = steps - 1 + int(keep_kv)
        allocator = self.runner.kv_pool.allocator
        tree_slots = None
        if forwards:  # the tree slots of as many requests as the pool holds, in batch order
            a = min(len(work), allocator.available() // (k * forwards))
            work, frontier_out = work[:a], frontier_out[:a]
            if not work:
                return tree
            tree_slots = allocator.alloc(a * k * forwards)
            assert tree_slots is not None
        a = len(work)
        held: list[int] = []
        try:
            exp = expand_tree(
                self.runner, self._draft_step,
                self.model.to_target_ids if self.needs_hidden else (lambda ids: ids), steps,
                torch.tensor([w.state.rows for w in work], dtype=torch.int64, device=device),
                torch.tensor([w.prefix + len(w.tokens) for w in work], device=device),
                torch.tensor([w.first + len(w.tokens) - 1 for w in work], device=device),
                frontier_out,
                tree_slots.view(a, k, forwards) if forwards else None,
                keep_kv,
            )  # fmt: skip
            chosen = best_candidates(exp.cands.scores, self.num_nodes - 1)
            index = torch.tensor([w.index for w in work], dtype=torch.int64, device=device)
            active = torch.ones(a, dtype=torch.bool, device=device)
            drafted = select_tree(exp.cands, roots[index], active, self.num_nodes, chosen)
            if keep_kv:
                held = self._hold(work, exp.frontier, chosen, drafted.tokens)
        finally:
            if tree_slots is not None:
                kept = torch.tensor(held, dtype=torch.int64, device=device)
                allocator.free(tree_slots[~torch.isin(tree_slots, kept)])
        tree.tokens[index] = drafted.tokens
        tree.parents[index] = drafted.parents
        return tree

    def _hold(self, work, frontier, chosen: torch.Tensor, tokens: torch.Tensor) -> list[int]:
        """Record, per request, the proposed nodes whose draft KV the expansion computed
        (`ReqDraftState.held`); returns their slots."""
        cands = torch.stack([c for c, _ in frontier], dim=1).flatten(1).tolist()
        slots = torch.stack([s for _, s in frontier], dim=1).flatten(1).tolist()
        held = []
        for w, cs, ss, picks, toks in zip(work, cands, slots, chosen.tolist(), tokens.tolist()):
            ran = dict(zip(cs, ss))
            w.state.held = {j: (ran[c], toks[j]) for j, c in enumerate(picks, start=1) if c in ran}
            held.extend(slot for slot, _ in w.state.held.values())
        return held

    def _plan_catchup(self, reqs: Sequence[Req]) -> list[CatchupRows]:
        """The requests that can draft this step and their catch-up rows (slots allocated)."""
        runner, k = self.runner, self.shape.topk
        limit = runner.req_to_token.max_context - self.shape.num_steps
        work = []
        for i, req in enumerate(reqs):
            st = self._sync(req)
            if st is None:
                continue
            self._free_slots(st.take_held())  # a proposal that was not verified
            frontier = req.seqlen - 1 - self.shift  # its output is the root's draft distribution
            first = st.next_position
            if frontier < first:  # proposed twice without a commit: redo the frontier row
                runner.kv_pool.allocator.free(st.truncate(frontier - st.start).to(runner.device))
                first = st.next_position
            count = frontier - first + 1
            if count <= 0 or frontier - st.start >= limit:
                continue
            if self.needs_hidden and st.num_features < count:
                continue
            if not st.rows:
                if runner.req_to_token.available() < k:
                    continue
                st.rows = [runner.req_to_token.alloc() for _ in range(k)]
            slots = runner.kv_pool.allocator.alloc(count)
            if slots is None:
                self.release(req)
                continue
            feats = st.take_features(count) if self.needs_hidden else None
            fill = req.fill_ids
            tokens = fill[first + self.shift : frontier + self.shift + 1]
            w = CatchupRows(i, st, tokens, feats)
            rows = torch.tensor(st.rows, dtype=torch.int64, device=runner.device)
            runner.req_to_token.table[rows, w.prefix : w.prefix + count] = slots.to(torch.int32)
            st.tokens.extend(tokens)
            st.slots.append(slots)
            work.append(w)
        return work

    def _catchup(self, work: list[CatchupRows]) -> torch.Tensor:
        """The catch-up forward; the draft output of each request's frontier row."""
        decode = not self.needs_hidden and all(len(w.tokens) == 1 for w in work)
        return self.runner.forward(catchup_batch(work, self.runner.device, decode))

    def _draft_step(self, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(log-probabilities [rows, Vd], next features) of draft outputs `out`."""
        if self.needs_hidden:
            logit_in, feats = self.model.split_output(out)
        else:
            logit_in, feats = out, None
        logits = self.runner.compute_logits(logit_in).float()
        return torch.log_softmax(logits, dim=-1).clamp(max=0.0), feats
