"""`SpeculativeStep`: a decode batch's step when an algorithm is set (the scheduler's `run_batch`
calls `run` instead of the plain decode step).

Data flow of `run(batch)`:
    proposer.peek_hints -> gate.begin_step: no request can gain (CPU cost model, gate.py): the
       plain decode step (step.py), nothing proposed: the same path as speculation off
    proposer.propose(reqs) -> DraftTree [B, N]
    -> per request, draft_check.check_draft: cut nodes deeper than what the request may still
       commit (max_new_tokens, the context) or rejected by its grammar; the grammar's masks of
       the kept nodes' states are built on the way; then the gate (gate.py) keeps of each tree
       the nodes worth their verify rows (expected accepted tokens per second, from each
       request's acceptance rate and the measured step costs; on GPU: all of them)
    -> no request has a draft left, or the pool cannot hold the drafts' KV even after evicting:
       the plain decode step (step.py) and the one result path, one token each
    -> else one EXTEND forward over B x n rows with the tree mask (tree.verify_forward_batch;
       n = the largest kept tree; on GPU a verify CUDA graph's replay where one fits,
       executor/verify_graphs.py; on CPU one C++ decode call over the real nodes,
       cpu_decode.CpuDecode.verify), every row's logits -> target_probs with each row's sampling
       state (penalties, min-new-tokens ban and grammar mask in the context of the node's path)
       -> accept_trees (greedy rows: the target's argmax path, on the host when the whole
       batch is greedy without logprobs, greedy_accept.py; sampled rows: exact rejection
       sampling) -> commit: the accepted path's slots stay in `req_to_token`, the others are
       freed at once (tree.commit_path)
    -> the committed tokens, one at a time, through `ResultPath.append_token` (commit.py) (grammar accept,
       logprobs, eos / stop strings / min and max_new_tokens: nothing past a stop is kept, and
       the KV of dropped tokens is freed) -> jump-forward -> `finish_decode` (finished requests'
       KV goes to the radix cache like any other) -> proposer.on_verified.

KV accounting: draft slots live only inside one step. The scheduler's retraction keeps room for
one token per running request, as for plain decode; drafts take what is free (after evicting
unlocked cache), or the step falls back to plain decode: a full pool never fails a step because
of speculation.

Ownership: the proposer owns its state; this step owns none but the per-request counters it
writes (`Req.spec_verify_ct`, `Req.spec_committed`) and `active` (which requests the proposer
holds state for: those that left the batch get `release`). Scheduler thread only.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import torch

from radixlm.runtime.mem.kv_pool import SlotAllocator
from radixlm.runtime.mem.prefix_cache import PrefixCache
from radixlm.runtime.models.cpu_linear import SMALL_M
from radixlm.runtime.sampling.sampling_batch import SamplingBatch
from radixlm.runtime.sampling.vocab_mask import DenseMask
from radixlm.runtime.scheduler.queues import ReqQueues
from radixlm.runtime.scheduler.req import Req
from radixlm.runtime.scheduler.results import ResultPath
from radixlm.runtime.scheduler.schedule_batch import ScheduleBatch
from radixlm.runtime.scheduler.step import ModelStep
from radixlm.runtime.speculative.commit import PathCommitter
from radixlm.runtime.speculative.draft_check import CheckedDraft, check_draft
from radixlm.runtime.speculative.gate import DraftGate
from radixlm.runtime.speculative.greedy_accept import accept_greedy, greedy_best
from radixlm.runtime.speculative.layouts import in_proposer_layout, kept_probs, plain_result
from radixlm.runtime.speculative.proposer import Proposer
from radixlm.runtime.speculative.tree import alloc_draft_slots, build_tree, verify_forward_batch
from radixlm.runtime.speculative.tree_accept import (
    DraftTree,
    accept_trees,
    node_contexts,
    target_probs,
)


class _RowReq(NamedTuple):
    """One verify row's sampling context (sampling_batch.py `SamplingReq`): the request's
    outputs followed by the draft tokens on the node's path."""

    sampling_params: Any
    generator: torch.Generator | None
    origin_input_ids: list[int]
    output_ids: list[int]
    stop_ids_for_min_tokens: tuple[int, ...]


class SpeculativeStep:
    def __init__(
        self,
        proposer: Proposer,
        step: ModelStep,
        results: ResultPath,
        queues: ReqQueues,
        grammars: Any,  # constrained/manager.py `GrammarManager`
        context_len: int,
        stats: dict[str, Any],
        verify_all: bool = False,
    ) -> None:
        self.proposer = proposer
        self.step = step
        self.runner = step.runner
        self.results = results
        self.queues = queues
        self.grammars = grammars
        self.allocator: SlotAllocator = step.allocator
        self.cache: PrefixCache = step.cache
        self.context_len = context_len
        self.stats = stats
        self.device = step.device
        self.active: dict[str, Req] = {}
        # NOTE: on CPU a verify row costs almost a decode row (compute-bound at small batch) and
        # above `SMALL_M` rows the linear layers leave the small-batch kernels: the gate weighs
        # each draft node's expected gain against the measured cost of its row (gate.py) and a
        # verify step keeps to `SMALL_M` rows. On GPU every draft is verified.
        cpu = self.device.type == "cpu"
        # NOTE: at tp_size > 1 this step, its proposer and its gate run on rank 0 alone (the
        # other ranks follow its runner calls, runtime/distributed/lockstep.py): the gate's
        # timing-driven choices are made once, so it measures as at TP=1.
        always = verify_all or not cpu
        self.gate = DraftGate(always=always, measure=cpu, max_rows=SMALL_M if cpu else None,
                              max_nodes=proposer.num_nodes)  # fmt: skip
        self.committer = PathCommitter(self.cache, self.allocator, results, stats, self.gate)

    # ---- the step ------------------------------------------------------------------------------
    def run(self, batch: ScheduleBatch) -> None:
        start = time.perf_counter()  # NOTE: the gate compares whole steps, drafting included
        reqs = batch.reqs
        self.release_gone(reqs)
        for req in reqs:
            self.active[req.rid] = req
            if req.spec_verify_ct is None:
                req.spec_verify_ct = req.spec_committed = 0
        peek = None if self.gate.always else self.proposer.peek_hints(reqs)
        allowed = self.gate.begin_step([r.rid for r in reqs], peek)
        verified, rows = False, len(reqs)
        width = self.proposer.num_nodes
        if any(allowed):  # NOTE: else no request can gain: the plain step, nothing proposed
            draft = self.proposer.propose(reqs)
            width = draft.tokens.shape[1]
            masks = None
            if any(r.grammar is not None for r in reqs):
                masks = torch.full((len(reqs), width, self.grammars.words), -1, dtype=torch.int32)
            checked = [
                self.check(req, draft, i, None if masks is None else masks[i])
                for i, req in enumerate(reqs)
            ]
            if any(len(c.kept) > 1 for c in checked):
                hints = self.proposer.hints
                checked = self.gate.plan([r.rid for r in reqs], checked, allowed, hints)
            rows = sum(len(c.kept) for c in checked)
            verified = rows > len(reqs) and self.verify(batch, draft, checked, masks)
        if not verified:
            self.plain_decode(batch, width)
        self.gate.record(verified, rows if verified else len(reqs), time.perf_counter() - start)
        self.release_gone(self.queues.running)

    def check(self, req: Req, draft: DraftTree, i: int, mask: torch.Tensor | None) -> CheckedDraft:
        room = min(req.remaining_new_tokens(), self.context_len - req.seqlen)
        return check_draft(
            draft.tokens[i].tolist(), draft.parents[i].tolist(), max(room - 1, 0),
            req.grammar, mask,
        )  # fmt: skip

    def plain_decode(self, batch: ScheduleBatch, width: int) -> None:
        """One token per request (no drafts), through the plain step and result path; the
        proposer hears of it as of a verify step of root-only trees (`plain_result`)."""
        out = self.step.run(batch, keep_hidden=self.needs_hidden)
        hidden = self.proposer_hidden(out.hidden)  # NOTE: before anything else runs a forward
        for req in batch.reqs:  # NOTE: before `apply`, which queues the requests' outputs
            req.spec_verify_ct += 1
            req.spec_committed += 1
        self.results.apply(out)
        assert out.next_ids is not None
        if self.proposer.needs_verified:
            self.proposer.on_verified(batch.reqs, *plain_result(out.next_ids, hidden, width))
        self.stats["spec_verify_steps"] += 1
        self.stats["spec_committed_tokens"] += len(batch.reqs)

    def verify(
        self,
        batch: ScheduleBatch,
        draft: DraftTree,
        checked: list[CheckedDraft],
        masks: torch.Tensor | None,
    ) -> bool:
        """The verify forward, acceptance and commit; False (nothing done) when the pool cannot
        hold the drafts' KV."""
        reqs = batch.reqs
        bsz, n = len(reqs), max(len(c.kept) for c in checked)
        counts = [len(c.kept) for c in checked]
        loc = alloc_draft_slots(self.allocator, counts, n)
        if loc is None:
            self.cache.evict(sum(counts) - self.allocator.available())
            loc = alloc_draft_slots(self.allocator, counts, n)
            if loc is None:
                return False
        tokens = torch.zeros(bsz, n, dtype=torch.int64)
        parents = torch.full((bsz, n), -1, dtype=torch.int64)
        for i, (req, c) in enumerate(zip(reqs, checked)):
            tokens[i, : len(c.kept)] = torch.tensor(c.tokens)
            tokens[i, 0] = req.last_token
            parents[i, : len(c.kept)] = torch.tensor(c.parents)
        prefix = [r.computed for r in reqs]
        layout = build_tree(parents, torch.tensor(prefix))
        rows = torch.tensor([r.req_pool_idx for r in reqs])
        fb = verify_forward_batch(tokens.view(-1).to(self.device), rows, prefix, loc, layout)
        replays = self.runner.verify_graph_replays
        hidden = self.runner.forward(fb)  # NOTE: a verify CUDA graph where one fits, else eager
        self.stats["spec_verify_graph_steps"] += self.runner.verify_graph_replays - replays
        self.step.forward_ct += 1
        logits = self.runner.compute_logits(hidden)
        captured = self.proposer_hidden(hidden)
        sb = SamplingBatch.from_reqs(self.row_reqs(reqs, tokens, parents), self.step.vocab_size,
                                     self.device)  # fmt: skip
        if masks is not None:
            sb.set_vocab_mask(DenseMask(masks[:, :n].reshape(bsz * n, -1).to(self.device)))
        top_n = max((r.top_logprobs_num for r in reqs), default=0)
        want_lp = top_n > 0 or any(r.return_logprob for r in reqs)
        target_lp = None
        if sb.all_greedy and not want_lp and self.device.type == "cpu":
            # NOTE: the greedy rule on the host, no [rows, V] distributions (greedy_accept.py)
            best = greedy_best(logits, sb).view(bsz, n)
            result = accept_greedy(best.tolist(), tokens.tolist(), parents.tolist())
        else:
            target = target_probs(logits, sb, want_lp)
            tree = DraftTree(tokens.to(self.device), parents.to(self.device),
                             kept_probs(draft, checked, n), draft.kind)  # fmt: skip
            result = accept_trees(tree, target, [r.generator for r in reqs])
            target_lp = target.logprobs
        self.committer.commit(reqs, prefix, loc, parents, result, target_lp, top_n,
                              self.proposer.hints)  # fmt: skip
        self.stats["spec_verify_steps"] += 1
        self.stats["spec_draft_tokens"] += sum(counts) - bsz
        if self.proposer.needs_verified:
            self.proposer.on_verified(reqs, *in_proposer_layout(result, captured, checked, draft,
                                                                self.needs_hidden))  # fmt: skip
        live = [r for r in reqs if not r.finished] if masks is not None else []
        if live and self.grammars.jump_forward_enabled:
            self.results.jump_forward(live)
        self.results.finish_decode(reqs)
        self.results.ratio.decay()
        return True

    def row_reqs(self, reqs: list[Req], tokens: torch.Tensor, parents: torch.Tensor) -> list:
        out = []
        for req, toks, pars in zip(reqs, tokens.tolist(), parents.tolist()):
            for ctx in node_contexts(toks, pars):
                out.append(_RowReq(req.sampling_params, req.generator, req.origin_input_ids,
                                   req.output_ids + ctx, req.stop_ids_for_min_tokens))  # fmt: skip
        return out

    @property
    def needs_hidden(self) -> bool:
        return self.proposer.needs_hidden

    def proposer_hidden(self, forward_rows: torch.Tensor | None) -> torch.Tensor | None:
        """What a proposer with `needs_hidden` gets of the forward just run: the target's
        captured layers of every row of it when a draft head set a capture
        (`ModelRunner.set_hidden_capture`), else the forward's output rows; None for the others.
        NOTE: take it right after the forward, before anything else runs one."""
        if not self.needs_hidden:
            return None
        captured = self.runner.take_hidden()
        return captured if captured is not None else forward_rows

    def on_extended(self, reqs: list[Req], hidden: torch.Tensor | None) -> None:
        """After an extend step (a prefill, a chunk of one, a re-queued request's extend):
        `proposer.on_prefilled` with `proposer_hidden` of its forward (with a capture: every row,
        `extend_len` per request; else the extend's logits rows: each request's last row when its
        prompt is complete, and input-logprob rows), then `release` for those that finished
        there."""
        for req in reqs:
            self.active[req.rid] = req
        self.proposer.on_prefilled(reqs, hidden)
        chunked = self.queues.chunked
        self.release_gone(self.queues.running + ([chunked] if chunked is not None else []))

    def release_gone(self, keep: list[Req]) -> None:
        """`release` the proposer's state of requests no longer in `keep`."""
        ids = {r.rid for r in keep}
        for rid in [rid for rid in self.active if rid not in ids]:
            self.proposer.release(self.active.pop(rid))
            self.gate.release(rid)
