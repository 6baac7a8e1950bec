"""NGRAM (prompt lookup) drafts: the continuation of the text so far's longest repeated suffix.

Per request, `NgramIndex` maps every n-gram of its tokens (prompt + output, `min <= n <= max`,
SGLang's `--speculative-ngram-min/max-match-window-size`) to the positions that followed its
recent occurrences. It is incremental: `extend` indexes only the tokens appended since the last
call (O(windows) dictionary updates per token), so a step costs O(new tokens), not O(length),
and a lookup starts at the last match's window plus the tokens appended since, not at `max_n`.

`NgramProposer.propose`: for each request, the suffix of its tokens is looked up from the longest
window down; each occurrence found gives a candidate continuation (the tokens that followed it),
longest window and most recent occurrence first, at most `breadth` of them. The candidates are
merged into a trie of at most `num_nodes - 1` draft tokens under the root (the request's last
token): a DETERMINISTIC tree (tree_accept.py), a chain when one candidate is found. The first
candidate keeps the longest branch; every other candidate gets at least its first differing
token, then the budget left, in order.

`hints` (proposer.py): per request, the window length of its first candidate's match, a sign
of the draft's quality (a long match is in a copied passage).

Ownership: the proposer owns its indexes (keyed by the request's id, dropped by `release`); it
only reads `Req.origin_input_ids` and `Req.output_ids`. Jump-forward may replace the tail of a
request's output: the index remembers a few of the last tokens it indexed and rebuilds itself
when they changed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from radixlm.runtime.speculative.proposer import Proposer
from radixlm.runtime.speculative.tree_accept import DraftKind, DraftTree

if TYPE_CHECKING:
    from radixlm.runtime.scheduler.req import Req

_CHECK_TAIL = 8  # last indexed tokens compared on each step (jump-forward rewrites the tail)


class NgramIndex:
    """The n-grams of one token sequence, `min_n..max_n` long, each mapped to the start positions
    of what followed its last `keep` occurrences (most recent last)."""

    def __init__(self, min_n: int, max_n: int, keep: int) -> None:
        self.min_n = min_n
        self.max_n = max_n
        self.keep = keep
        self.tokens: list[int] = []
        self.table: dict[tuple[int, ...], list[int]] = {}
        self.matched = 0  # the window of the last `candidates` call's first candidate (0: none)
        # NOTE: the longest matching window grows by at most one per appended token (a match of
        # n ending at t contains one of n - 1 ending at t - 1, indexed then): the lookups start
        # at `bound`, not at `max_n` (None: unknown, after a rebuild).
        self.bound: int | None = None

    def extend(self, tokens: Sequence[int], more: Sequence[int] = ()) -> None:
        """Make the index cover `tokens` + `more` (which extend what it covers; otherwise it
        rebuilds). Two parts, so that a request's prompt and output need no concatenation."""
        done = len(self.tokens)
        total = len(tokens) + len(more)
        if total < done or self._tail(tokens, more, max(0, done - _CHECK_TAIL), done):
            self.tokens, self.table, self.bound = [], {}, None
            done = 0
        if done == total:
            return
        if self.bound is not None:  # NOTE: windows below min_n are not indexed
            self.bound = max(self.bound, self.min_n - 1) + total - done
        split = len(tokens)
        new = list(tokens[done:]) + list(more) if done < split else more[done - split :]
        own = self.tokens
        for t in new:
            # NOTE: an n-gram is indexed once the token after it exists: its continuation start.
            end = len(own)  # the n-grams ending at end - 1 are followed by position `end`
            own.append(t)
            for n in range(self.min_n, min(self.max_n, end) + 1):
                key = tuple(own[end - n : end])
                hits = self.table.setdefault(key, [])
                hits.append(end)
                if len(hits) > self.keep:
                    del hits[0]

    def _tail(self, tokens: Sequence[int], more: Sequence[int], start: int, end: int) -> bool:
        """Whether `tokens` + `more` differ from the indexed tokens in [start, end)."""
        split = len(tokens)
        got = list(tokens[start:end]) + list(more[max(start - split, 0) : max(end - split, 0)])
        return got != self.tokens[start:end]

    def longest_match(self) -> int:
        """The longest window (`min_n..max_n`) whose n-gram ending the tokens occurred before
        (0: none): what `candidates` would match first."""
        own = self.tokens
        for n in range(self._top(), self.min_n - 1, -1):
            if self.table.get(tuple(own[len(own) - n :])):
                self.bound = n
                return n
        self.bound = 0
        return 0

    def _top(self) -> int:
        """The longest window worth looking up (`bound`, within `max_n` and the length)."""
        top = min(self.max_n, len(self.tokens))
        return top if self.bound is None else min(top, self.bound)

    def candidates(self, limit: int, length: int) -> list[list[int]]:
        """Continuations (up to `length` tokens each, at most `limit` distinct starts) of the
        current suffix: longest matching window first, most recent occurrence first."""
        own = self.tokens
        out: list[list[int]] = []
        starts: set[int] = set()
        self.matched = 0
        for n in range(self._top(), self.min_n - 1, -1):
            for start in reversed(self.table.get(tuple(own[len(own) - n :]), ())):
                if start in starts:
                    continue
                starts.add(start)
                self.matched = self.matched or n
                out.append(own[start : start + length])
                if len(out) == limit:
                    return out
        return out


def merge_candidates(
    cands: Sequence[Sequence[int]], budget: int, reserve_alternates: bool = True
) -> tuple[list[int], list[int]]:
    """A trie of the candidates under a root (node 0): (tokens, parents) of at most `budget` + 1
    nodes in topological order. The first candidate is cut so that each later one can still add
    one node (with `reserve_alternates`; else it takes what it can first); later ones then take
    what is left, in order."""
    tokens, parents = [-1], [-1]
    children: dict[tuple[int, int], int] = {}
    reserve = min(max(len(cands) - 1, 0), budget // 2) if reserve_alternates else 0
    for k, cand in enumerate(cands):
        room = budget - (len(tokens) - 1) - (reserve if k == 0 else 0)
        node = 0
        for tok in cand:
            nxt = children.get((node, tok))
            if nxt is None:
                if room <= 0:
                    break
                room -= 1
                nxt = len(tokens)
                tokens.append(tok)
                parents.append(node)
                children[(node, tok)] = nxt
            node = nxt
    return tokens, parents


class NgramProposer(Proposer):
    kind = DraftKind.DETERMINISTIC
    needs_verified = False  # NOTE: `propose` indexes `req.fill_ids` itself

    def __init__(
        self, num_nodes: int, min_window: int, max_window: int, breadth: int,
        reserve_alternates: bool = True,
    ) -> None:  # fmt: skip
        self.num_nodes = num_nodes
        # NOTE: False on CPU with the cost-aware gate (setup.py): a verify row costs almost a
        # decode row there, the gate keeps the likeliest nodes, and those are the first
        # candidate's chain while drafts are accepted.
        self.reserve_alternates = reserve_alternates
        self.min_window = min_window
        self.max_window = max_window
        self.breadth = breadth
        self.indexes: dict[str, NgramIndex] = {}

    def index_of(self, req: Req) -> NgramIndex:
        """`req`'s index, brought up to its tokens."""
        index = self.indexes.get(req.rid)
        if index is None:
            index = self.indexes[req.rid] = NgramIndex(
                self.min_window, self.max_window, self.breadth
            )
        index.extend(req.origin_input_ids, req.output_ids)
        return index

    def peek_hints(self, reqs: Sequence[Req]) -> list[int]:
        return [self.index_of(req).longest_match() if self.num_nodes > 1 else 0 for req in reqs]

    def propose(self, reqs: Sequence[Req]) -> DraftTree:
        n = self.num_nodes
        tokens = torch.zeros(len(reqs), n, dtype=torch.int64)
        parents = torch.full((len(reqs), n), -1, dtype=torch.int64)
        self.hints = []
        for i, req in enumerate(reqs):
            index = self.index_of(req)
            cands = index.candidates(self.breadth, n - 1) if n > 1 else []
            self.hints.append(index.matched if cands else 0)
            toks, pars = merge_candidates(cands, n - 1, self.reserve_alternates)
            toks[0] = req.last_token
            tokens[i, : len(toks)] = torch.tensor(toks)
            parents[i, : len(pars)] = torch.tensor(pars)
        return DraftTree(tokens, parents, None, self.kind)

    def release(self, req: Req) -> None:
        self.indexes.pop(req.rid, None)
