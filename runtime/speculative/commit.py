"""`PathCommitter`: the end of a verify step (spec_step.py): each request's accepted path is
kept in `req_to_token` and the rest of its tree's KV freed (tree.commit_path), its committed
tokens go one at a time through the one result path (`ResultPath.append_token`: grammar,
logprobs, stop conditions), the KV past a stop is freed, and the draft gate hears how much of
each draft was accepted.

Ownership: owns nothing; writes the requests' `computed`, `spec_verify_ct`, `spec_committed`,
the step's `stats` counters and the gate's acceptance figures. Scheduler thread only.
"""

from __future__ import annotations

from typing import Any

import torch

from radixlm.runtime.mem.kv_pool import SlotAllocator
from radixlm.runtime.mem.prefix_cache import PrefixCache
from radixlm.runtime.scheduler.req import Req
from radixlm.runtime.scheduler.results import ResultPath
from radixlm.runtime.scheduler.step import StepTokens
from radixlm.runtime.speculative.gate import DraftGate
from radixlm.runtime.speculative.tree import commit_path
from radixlm.runtime.speculative.tree_accept import TreeAcceptResult


class PathCommitter:
    def __init__(
        self, cache: PrefixCache, allocator: SlotAllocator, results: ResultPath,
        stats: dict[str, Any], gate: DraftGate,
    ) -> None:  # fmt: skip
        self.cache = cache
        self.allocator = allocator
        self.results = results
        self.stats = stats
        self.gate = gate

    def commit(
        self,
        reqs: list[Req],
        prefix: list[int],
        loc: torch.Tensor,
        parents: torch.Tensor,
        result: TreeAcceptResult,
        logprobs: torch.Tensor | None,
        top_n: int,
        hints: list[int] | None,
    ) -> None:
        """Keep each request's accepted path (free the rest of its tree) and append its
        committed tokens through the result path until one stops it; the gate learns each
        drafted request's acceptance (`hints`: the proposer's for this step's drafts)."""
        table = self.cache.req_to_token
        num_acc = result.num_accepted.tolist()
        paths = result.path.tolist()
        toks = result.tokens.tolist()
        lps = result.logprobs.tolist() if result.logprobs is not None else None
        n = parents.shape[1]
        pars = parents.tolist()
        drafted = [sum(1 for p in row if p >= 0) for row in pars]
        for i, req in enumerate(reqs):
            a = num_acc[i]
            path = paths[i][: a + 1]
            commit_path(table, req.req_pool_idx, prefix[i], loc[i], parents[i], path,
                        self.allocator)  # fmt: skip
            req.computed = prefix[i] + a + 1
            top = None
            if req.top_logprobs_num and logprobs is not None:
                rows = logprobs.view(len(reqs), n, -1)[i, path]
                values, ids = rows.topk(top_n, dim=-1)
                top = [list(zip(v, t)) for v, t in zip(values.tolist(), ids.tolist())]
            host = StepTokens(toks[i][: a + 1], lps[i][: a + 1] if lps else None, top)
            appended = 0
            for k in range(a + 1):
                self.results.append_token(req, k, host)
                appended += 1
                if req.finished:
                    break
            if req.finished:
                self.drop_uncommitted(req)
            req.spec_verify_ct += 1
            req.spec_committed += appended
            self.stats["spec_committed_tokens"] += appended
            if drafted[i]:
                hint = None if hints is None else hints[i]
                self.gate.update(req.rid, a, path[-1] in pars[i], hint)

    def drop_uncommitted(self, req: Req) -> None:
        """A request stopped inside its committed tokens: free the KV past its last output
        token's position (that token has none, as after a plain decode step)."""
        keep = req.seqlen - 1
        if req.computed > keep:
            row = self.cache.req_to_token.table[req.req_pool_idx]
            self.allocator.free(row[keep : req.computed].to(torch.int64))
            req.computed = keep
