"""`DraftGate`: how much of each request's draft a step verifies (all, part, or none: then the
step is the plain decode step), chosen to maximise the expected tokens per second.

Per request, `accept_prob` estimates the chance that a draft token is accepted given that its
parent was (a moving average over the draft tokens tried: each accepted one counts 1, the first
rejected one on the path 0). A node of the tree is expected to be committed with probability
P(node) = P(parent) * p * (1 - p) ** (siblings tried before it), P(root) = 1. With the step cost
model (cost_model.py), `plan` takes the nodes of all requests by decreasing P (a node only after
its parent) and keeps the prefix that maximises (B + sum of P) / seconds(step), against the plain
step's B / seconds(plain B). A verify step's rows stay within `max_rows` (the padded [B, n]
layout: B * widest kept tree), the flags (num draft tokens, depth) being upper bounds already
applied by the proposer.

A request whose draft had nothing accepted waits 1, 2, 4, ... `MAX_BACKOFF` steps (doubling
with each such step, reset by an accepted token) before its next draft is considered, and its p
falls: drafts that keep failing stop being verified, and are probed again only now and then (a
probe is one cheap node when p is low). `begin_step` tells the step first whether any request
may gain at all (else it is the plain step, nothing proposed); while a request's p is too low
for its drafts to pay, p moves back towards `PRIOR_ACCEPT` by `RECOVER / B` per step (B: the
batch size). One whose drafts are accepted gets longer drafts, as far as the rows' cost allows.

With a proposer's hints (NGRAM: the matched window's length; a long match is a copied passage),
the plan uses p of the request's drafts with the same hint bucket instead, and a request's first
draft of a bucket starts from that bucket's p over all requests (`HINT_PRIOR` before any).

`always=True` verifies every draft unchanged (tests that need fixed acceptance figures; GPU,
where a verify row costs almost nothing). Exactness never depends on the gate: any subtree
containing the root is verified exactly.

Ownership: the speculative step owns it; state per request id, dropped by `release`.
"""

from __future__ import annotations

from collections.abc import Sequence

from radixlm.runtime.speculative.cost_model import StepCosts
from radixlm.runtime.speculative.draft_check import CheckedDraft

PRIOR_ACCEPT = 0.6  # p of a request never verified
ACCEPT_EMA = 0.25  # weight of the newest draft token tried
RECOVER = 0.02  # per skipped step, p moves this fraction of the way back to the prior
MAX_BACKOFF = 32  # steps a failing request's drafts wait at most
CHAIN_LIMIT = 16  # nodes of the deepest chain `begin_step` considers without other bounds
P_MIN, P_MAX = 0.01, 0.98
HINT_BUCKETS = 5
# p of a bucket never verified: a longer NGRAM match is likelier in a copied passage
HINT_PRIOR = (0.5, 0.6, 0.7, 0.8, 0.9)


class DraftGate:
    def __init__(
        self, always: bool = False, measure: bool = True, max_rows: int | None = None,
        max_nodes: int = CHAIN_LIMIT,
    ) -> None:  # fmt: skip
        self.always = always
        self.max_nodes = max_nodes  # a draft tree's nodes, its root included (the proposer's N)
        self.max_rows = max_rows  # padded rows of a verify step (B * widest tree), None: any
        self.costs = StepCosts(measure)
        self.accept: dict[str, float] = {}  # rid -> p
        # by the proposer's hint (`Proposer.hints`, in buckets): per request, and over all
        # requests (the prior of a request's first draft of that bucket)
        self.hinted: dict[tuple[str, int], float] = {}
        self.by_hint: dict[int, float] = {}
        self.backoff: dict[str, int] = {}  # rid -> its last wait (doubles per failed draft)
        self.wait: dict[str, int] = {}  # rid -> steps left before its draft is considered

    def accept_prob(self, rid: str, hint: int | None = None) -> float:
        """p of `rid` (with a proposer's hint: of its drafts with that hint's bucket)."""
        if hint is None:
            return self.accept.get(rid, PRIOR_ACCEPT)
        b = bucket(hint)
        return self.hinted.get((rid, b), self.by_hint.get(b, HINT_PRIOR[b]))

    # ---- the choice ---------------------------------------------------------------------------
    def begin_step(self, rids: Sequence[str], hints: Sequence[int] | None = None) -> list[bool]:
        """Per request, whether a draft may be verified for it this step: not backing off, and
        a chain as deep as the rows allow could pay (`chain_pays`, with p of the hint's bucket
        when the proposer peeked one, `Proposer.peek_hints`; hint 0: no draft; else p recovers
        a little). All False: the step is the plain decode step, nothing proposed (counts the
        step)."""
        if self.always:
            return [True] * len(rids)
        bsz = len(rids)
        plain = bsz / self.costs.plain(bsz)
        depth = max(min((self.max_rows or CHAIN_LIMIT) // bsz, self.max_nodes) - 1, 0)
        costs = self.costs.verify_curve(bsz + 1, depth)
        # NOTE: a failed probe costs the whole batch a verify step: B requests probe as often
        # together as one alone
        recover = RECOVER / bsz
        out = []
        for i, rid in enumerate(rids):
            hint = None if hints is None else hints[i]
            if self.waits(rid) or hint == 0:
                out.append(False)
                continue
            p = self.accept_prob(rid, hint)
            ok = chain_pays(min(max(p, P_MIN), P_MAX), bsz, costs, plain)
            if not ok and hint is None:
                self.accept[rid] = p + recover * (PRIOR_ACCEPT - p)
            elif not ok:
                b = bucket(hint)
                self.hinted[(rid, b)] = p + recover * (HINT_PRIOR[b] - p)
            out.append(ok)
        return out

    def plan(
        self, rids: Sequence[str], drafts: Sequence[CheckedDraft], allowed: Sequence[bool],
        hints: Sequence[int] | None = None,
    ) -> list[CheckedDraft]:  # fmt: skip
        """Each request's draft cut to the nodes worth verifying this step (the root alone for
        none; every draft root-only: run the plain step). `allowed`: `begin_step`'s answer;
        `hints`: the proposer's (`Proposer.hints`), None when it gives none."""
        bsz = len(drafts)
        if self.always:
            return self.within_rows(list(drafts))
        nodes: list[tuple[float, int, int]] = []  # (-P, request, node)
        for i, (rid, d) in enumerate(zip(rids, drafts)):
            if allowed[i] and len(d.kept) > 1:
                hint = None if hints is None else hints[i]
                probs = node_probs(d, self.accept_prob(rid, hint))
                nodes.extend((-pr, i, j) for j, pr in enumerate(probs) if j > 0)
        nodes.sort()
        chosen: list[set[int]] = [{0} for _ in drafts]
        width = [1] * bsz
        best_rate, best_m = bsz / self.costs.plain(bsz), 0
        taken: list[tuple[int, int]] = []
        tokens, rows = float(bsz), bsz
        for neg_p, i, j in nodes:
            if drafts[i].parents[j] not in chosen[i]:
                continue
            if self.max_rows is not None and bsz * max(max(width), width[i] + 1) > self.max_rows:
                continue
            chosen[i].add(j)
            width[i] += 1
            taken.append((i, j))
            tokens, rows = tokens - neg_p, rows + 1
            rate = tokens / self.costs.verify(rows)
            if rate > best_rate:
                best_rate, best_m = rate, len(taken)
        keep: list[set[int]] = [{0} for _ in drafts]
        for i, j in taken[:best_m]:
            keep[i].add(j)
        return [subtree(d, k) for d, k in zip(drafts, keep)]

    def waits(self, rid: str) -> bool:
        """Whether `rid` is backing off this step (counts the step)."""
        left = self.wait.get(rid, 0)
        if left <= 0:
            return False
        if left == 1:
            del self.wait[rid]
        else:
            self.wait[rid] = left - 1
        return True

    def within_rows(self, drafts: list[CheckedDraft]) -> list[CheckedDraft]:
        """Every request keeps the first `max_rows // B` nodes of its tree (a prefix of a
        topological order is a tree)."""
        if self.max_rows is None:
            return drafts
        width = max(1, self.max_rows // max(len(drafts), 1))
        return [subtree(d, set(range(min(width, len(d.kept))))) for d in drafts]

    # ---- what the steps tell it ---------------------------------------------------------------
    def update(self, rid: str, accepted: int, rejected: bool, hint: int | None = None) -> None:
        """After a verify step in which `rid` had a draft: `accepted` draft tokens accepted along
        a path (successes), `rejected`: the last accepted node had children, all rejected (one
        failure). `hint`: the proposer's for this draft (its bucket's figures move too)."""
        self.accept[rid] = moved(self.accept_prob(rid), accepted, rejected)
        if hint is not None:
            b = bucket(hint)
            self.hinted[(rid, b)] = moved(self.accept_prob(rid, hint), accepted, rejected)
            self.by_hint[b] = moved(self.by_hint.get(b, HINT_PRIOR[b]), accepted, rejected)
        if accepted:
            self.backoff.pop(rid, None)
            return
        back = min(2 * self.backoff.get(rid, 0) or 1, MAX_BACKOFF)
        self.backoff[rid] = self.wait[rid] = back

    def record(self, verify: bool, rows: int, seconds: float) -> None:
        self.costs.record(verify, rows, seconds)

    def release(self, rid: str) -> None:
        for table in (self.accept, self.backoff, self.wait):
            table.pop(rid, None)
        for key in [k for k in self.hinted if k[0] == rid]:
            del self.hinted[key]


def bucket(hint: int) -> int:
    """Hints in buckets of doubling width: 0, 1, 2-3, 4-7, 8 and more."""
    return min(max(hint, 0).bit_length(), HINT_BUCKETS - 1)


def moved(p: float, accepted: int, rejected: bool) -> float:
    """p after a draft with `accepted` tokens accepted (successes), then, with `rejected`, one
    failure."""
    for _ in range(accepted):
        p += ACCEPT_EMA * (1.0 - p)
    if rejected:
        p -= ACCEPT_EMA * p
    return min(max(p, P_MIN), P_MAX)


def chain_pays(p: float, bsz: int, costs: Sequence[float], plain_rate: float) -> bool:
    """Whether a chain of d draft nodes (d = 1 .. len(costs); costs[d - 1]: a verify step of
    bsz + d rows) beside bsz roots beats the plain step's tokens per second."""
    gain, term = 0.0, 1.0
    for seconds in costs:
        term *= p
        gain += term
        if (bsz + gain) / seconds > plain_rate:
            return True
    return False


def node_probs(draft: CheckedDraft, p: float) -> list[float]:
    """P(node committed) of each kept node (index order; parents precede children)."""
    p = min(max(p, P_MIN), P_MAX)
    out = [1.0]
    tried: dict[int, int] = {}  # parent -> children seen so far
    for j in range(1, len(draft.kept)):
        parent = draft.parents[j]
        rank = tried.get(parent, 0)
        tried[parent] = rank + 1
        out.append(out[parent] * p * (1.0 - p) ** rank)
    return out


def subtree(draft: CheckedDraft, keep: set[int]) -> CheckedDraft:
    """`draft` restricted to its nodes `keep` (closed under parents, root included), renumbered."""
    if len(keep) == len(draft.kept):
        return draft
    order = sorted(keep)
    index = {old: new for new, old in enumerate(order)}
    parents = [-1] + [index[draft.parents[j]] for j in order[1:]]
    return CheckedDraft([draft.kept[j] for j in order], [draft.tokens[j] for j in order], parents)
