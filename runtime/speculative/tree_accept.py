"""Acceptance of draft trees (and chains) against the target model's verify rows, keeping the
target's sampling distribution exactly: multi-candidate speculative (rejection) sampling.

Data flow: the verify forward gives logits `[B * N, V]` (row i * N + j = node j of request i, the
layout of runtime/speculative/tree.py); `target_probs` turns them into the distributions the
sampler would draw from; `tree_accept` walks each request's tree and returns the accepted path,
the committed tokens (accepted drafts + one bonus token) and their logprobs. Pure tensor functions:
the caller (the speculative step) owns the batch, the KV bookkeeping and the grammar rollback.

The math. Node 0 of a tree is the root (the request's last committed token); `p_j` is the target's
next-token distribution after node j's path, `q_j` the draft distribution node j's children were
drawn from. The walk keeps a current node `c` (the root first) and a residual target `r` (`p_c`
when `c` is entered). Each child `x` of `c` is tried in node-index order (the order it was drawn):

- `SAMPLED` (children drawn i.i.d. from `q_c`, with replacement): accept `x` with probability
  `min(1, r(x) / q_c(x))`; on rejection `r <- norm(max(r - q_c, 0))`.
- `SAMPLED_DISTINCT` (children drawn one after another without replacement: child i from `q_c`
  with the earlier siblings removed and renormalised, `q^(i)`): accept with
  `min(1, r(x) / q^(i)(x))`; on rejection `r <- norm(max(r - q^(i), 0))` and
  `q^(i+1) = norm(q^(i) with x set to 0)`.
- `DETERMINISTIC` (children chosen without randomness shared with the target: NGRAM, EAGLE's
  top-k expansion, greedy drafts; `q` is one-hot at `x`): accept `x` with probability `r(x)`; on
  rejection `r <- norm(r with x set to 0)`. This rule is exact for children chosen in ANY way
  independent of the verify coins (given the tree, each child is a fixed proposal), sampled ones
  included; with sampled children the q rules above accept more: `1 - TV(r, q)` per try instead
  of `E_q[r(x)]`.

An accepted child becomes `c` (`r <- p_x`); when `c` has no untried child left, the bonus token is
drawn from `r`: the last residual, or `p_c` itself when `c` has no children. Why it is exact: one
try is the standard speculative-sampling step for the proposal `x ~ q^(i)` (drawn independently of
the acceptance coins, given the earlier siblings), whose output is `r` distributed; replacing its
residual draw by the next try (recursively, ending in a plain draw from the last residual) keeps
that, so the token committed at `c` is distributed as `p_c`, and, by induction along the path,
every committed sequence has the target's probability. After a rejection `r(x) = 0` (the
rejection needs `r(x) < q(x)`), so a duplicate of `x` among later siblings is rejected too.

`q` must be the distribution the draft tokens were actually drawn from: with temperature or top-k /
top-p / min-p on the draft, the transformed probabilities (`target_probs` of the draft logits with
the same rows' sampling state). Any other `q` breaks exactness; a token with `q(x) = 0` (not
drawable) is accepted whenever `r(x) > 0`, which is already a broken contract. So does choosing
sampled children by their values after drawing them (e.g. EAGLE-2's reranking of a sampled tree
by cumulative draft score: the kept children are no longer q-distributed): such trees, and every
tree of top-k children, are DETERMINISTIC. Sequential sampling without replacement and the
Gumbel-top-k trick (`torch.multinomial(..., replacement=False)`, in its output order) give the
SAMPLED_DISTINCT order.

Greedy rows (temperature 0): child `x` is accepted iff `x == argmax p_c` (the first such child);
the bonus is `argmax p_c` of the last accepted node: the target's own greedy continuation.

Cost: the DETERMINISTIC walk keeps scalars per request (the removed mass, the rejected children)
and builds one residual at the end; the q rules keep a dense `[B, V]` residual, a few passes over
it per node index.

Randomness: per request, `N` uniforms (`draw_coins`, one call on the request's own
`torch.Generator`): coin j >= 1 tests node j (a node is tested at most once), coin 0 draws the
bonus by inverse CDF. So a request's result does not depend on the rest of its batch.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import NamedTuple

import torch

from radixlm.runtime.sampling.sampler import _filter, apply_logit_processors, argmax
from radixlm.runtime.sampling.sampling_batch import SamplingBatch


class DraftKind(enum.Enum):
    """How a node's children were chosen (see the module docstring for each rule)."""

    DETERMINISTIC = "deterministic"
    SAMPLED = "sampled"
    SAMPLED_DISTINCT = "sampled_distinct"


class TargetProbs(NamedTuple):
    probs: torch.Tensor  # [R, V] float32, rows sum to 1 (one-hot argmax on greedy rows)
    greedy: torch.Tensor  # [R] bool
    logprobs: torch.Tensor | None  # [R, V] log_softmax of the processed logits (the sampler's)


class DraftTree(NamedTuple):
    """A batch of draft trees in tree.py's layout (`B` requests x `N` nodes).

    tokens [B, N] int64: node j's token (`tokens[:, 0]`, the root, is never tested).
    parents [B, N] int64: `0 <= parents[i, j] < j` for a real node j > 0; `< 0` for padding.
        Siblings must appear in the order they were drawn (it matters for SAMPLED_DISTINCT).
    draft_probs [B, N, V] float32 | None: `q_j`, the distribution node j's children were drawn
        from (rows of leaves are ignored); None for DETERMINISTIC.
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    draft_probs: torch.Tensor | None
    kind: DraftKind


class TreeAcceptResult(NamedTuple):
    # [B, N] int64: 0 (root), then the a accepted nodes, then -1; `path[i, : a + 1]` is the
    # root path tree.commit_path takes
    path: torch.Tensor
    num_accepted: torch.Tensor  # [B] int64 a: accepted draft tokens (committed: a + 1)
    tokens: torch.Tensor  # [B, N] int64: the a accepted tokens, the bonus at [a], then -1
    logprobs: torch.Tensor | None  # [B, N] float32: logprob of tokens[:, k] at node path[:, k]


@torch.inference_mode()
def target_probs(
    logits: torch.Tensor, sb: SamplingBatch, return_logprob: bool = False
) -> TargetProbs:
    """The distribution each row draws from, through the sampler's own transforms: the logit
    processors (penalties, bias, min-tokens ban, grammar mask: edits `logits` in place, as
    `sampler.sample` does), then softmax(logits / temperature), top-k, top-p, min-p and a
    renormalisation; greedy rows are one-hot at the argmax of the processed logits.

    Each row's state in `sb` must describe the context of its node (for a verify row: penalties'
    counts and the grammar state after the node's path, the min-new-tokens ban at its depth).
    Logprobs follow the sampler: log_softmax of the processed logits, before temperature."""
    logits = apply_logit_processors(logits.float(), sb)
    rows, vocab = logits.shape
    logprobs = torch.log_softmax(logits, dim=-1) if return_logprob else None
    onehot = torch.nn.functional.one_hot(argmax(logits), vocab).to(torch.float32)
    if sb.all_greedy:
        return TargetProbs(
            onehot, torch.ones(rows, dtype=torch.bool, device=logits.device), logprobs
        )
    assert sb.temperatures is not None and sb.greedy is not None
    probs = torch.softmax(logits / sb.temperatures, dim=-1)
    if sb.top_ks is not None or sb.top_ps is not None or sb.min_ps is not None:
        probs = _filter(probs, sb)  # NOTE: keeps each row's most likely token: the sum is > 0
        probs = probs / probs.sum(dim=-1, keepdim=True)
    probs = torch.where(sb.greedy.view(-1, 1), onehot, probs)
    return TargetProbs(probs, sb.greedy.clone(), logprobs)


def node_contexts(tokens: Sequence[int], parents: Sequence[int]) -> list[list[int]]:
    """Per node of one tree, the draft tokens from the root (excluded: it is already an output) to
    the node (included): what verify row j's sampling state must see appended to the request's
    outputs (penalty counts, the min-new-tokens ban, the grammar state). [] for the root and for
    padding nodes."""
    out: list[list[int]] = [[]]
    for j in range(1, len(parents)):
        pa = parents[j]
        out.append([*out[pa], int(tokens[j])] if pa >= 0 else [])
    return out


def draw_coins(
    generators: Sequence[torch.Generator | None], num_nodes: int, device: torch.device | str
) -> torch.Tensor:
    """`[B, N]` float32 uniforms in [0, 1), row i from request i's generator (one call each)."""
    rows = [torch.rand(num_nodes, generator=g, device=device) for g in generators]
    return torch.stack(rows) if rows else torch.empty((0, num_nodes), device=device)


def _normalise(x: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """Rows of `x` divided by their sums; rows summing to ~0 become `fallback`'s rows."""
    s = x.sum(dim=-1, keepdim=True)
    return torch.where(s > 1e-12, x / s.clamp_min(1e-30), fallback)


def _draw(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw of one token per row of `probs` [B, V] from uniforms `u` [B]. float64
    cumulative sums: `u < 1` keeps `u * total` below the last bin, and a zero-probability token
    never owns an interval."""
    cdf = probs.double().cumsum(dim=-1)
    x = (u.double() * cdf[:, -1]).view(-1, 1)
    idx = torch.searchsorted(cdf, x, right=True).view(-1)
    return idx.clamp_(max=probs.shape[-1] - 1)


@torch.inference_mode()
def tree_accept(
    tree: DraftTree,
    target: torch.Tensor,
    greedy: torch.Tensor,
    coins: torch.Tensor,
    target_logprobs: torch.Tensor | None = None,
) -> TreeAcceptResult:
    """Walk every request's tree at once (see the module docstring for the rule).

    target [B, N, V]: `p_j` of every node (`target_probs(...).probs.view(B, N, V)`); greedy [B]
    bool; coins [B, N] uniforms (`draw_coins`); target_logprobs [B, N, V] (optional) for the
    committed tokens' logprobs. One vectorised step per node index, no host sync."""
    b, n, _ = target.shape
    rows = torch.arange(b, device=target.device)
    best = argmax(target.flatten(0, 1)).view(b, n)  # greedy rows' choice at every node
    walk = _walk_deterministic if tree.kind is DraftKind.DETERMINISTIC else _walk_sampled
    path, num_acc, residual = walk(tree, target, greedy, coins, best)
    cur = path[rows, num_acc]
    bonus = torch.where(greedy, best[rows, cur], _draw(residual, coins[:, 0]))
    steps = torch.arange(n, device=target.device).view(1, -1)
    path_tokens = tree.tokens.gather(1, path.clamp_min(0).roll(-1, dims=1))  # path[k + 1]'s
    out = torch.where(steps < num_acc.view(-1, 1), path_tokens, -1)
    out[rows, num_acc] = bonus
    logprobs = None
    if target_logprobs is not None:
        lp = target_logprobs[rows.view(-1, 1), path.clamp_min(0), out.clamp_min(0)].float()
        logprobs = torch.where(steps <= num_acc.view(-1, 1), lp, float("nan"))
    return TreeAcceptResult(path, num_acc, out, logprobs)


_Walk = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # path, num_accepted, final residual


def _advance(path, num_acc, cur, acc, j) -> None:
    num_acc += acc
    rows = torch.arange(path.shape[0], device=path.device)
    path[rows, num_acc] = torch.where(acc, j, path[rows, num_acc])
    cur.copy_(torch.where(acc, j, cur))


def _start(b: int, n: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    path = torch.full((b, n), -1, dtype=torch.int64, device=device)
    path[:, 0] = 0
    zeros = torch.zeros(b, dtype=torch.int64, device=device)
    return path, zeros, zeros.clone()


def _walk_deterministic(tree, target, greedy, coins, best) -> _Walk:
    """q one-hot: the residual at node c is p_c with the rejected children's tokens removed, so
    the walk keeps only scalars (the removed mass and which nodes were rejected) and builds the
    one residual it draws from at the end."""
    tokens, parents = tree.tokens, tree.parents
    b, n, _ = target.shape
    rows = torch.arange(b, device=target.device)
    path, num_acc, cur = _start(b, n, target.device)
    removed = torch.zeros(b, dtype=torch.float32, device=target.device)
    rejected = torch.zeros(b, n, dtype=torch.bool, device=target.device)
    for j in range(1, n):
        cand = parents[:, j] == cur  # padding (parent < 0) never matches
        tok = tokens[:, j]
        p_tok = target[rows, cur, tok].float()
        # NOTE: a token already rejected under this node has residual mass 0.
        seen = (rejected[:, :j] & (tokens[:, :j] == tok.view(-1, 1))).any(dim=1)
        ratio = torch.where(seen, 0.0, p_tok / (1.0 - removed).clamp_min(1e-30))
        acc_sampled = coins[:, j] < ratio.clamp(max=1.0)
        acc = cand & torch.where(greedy, tok == best[rows, cur], acc_sampled)
        rej = cand & ~acc & ~greedy & ~seen
        removed = torch.where(rej, removed + p_tok, torch.where(acc, 0.0, removed))
        rejected[:, j] = rej
        rejected &= ~acc.view(-1, 1)  # NOTE: only the current node's rejected children matter
        _advance(path, num_acc, cur, acc, j)
    residual = target[rows, cur].float()
    drop = torch.where(rejected, tokens, residual.shape[-1])  # V: a dummy column
    residual = torch.cat([residual, residual.new_zeros(b, 1)], 1).scatter_(1, drop, 0.0)
    return path, num_acc, residual[:, :-1]


def _walk_sampled(tree, target, greedy, coins, best) -> _Walk:
    """q-based rules: the residual max(r - q, 0) is dense, kept as [B, V]."""
    tokens, parents, q_all, kind = tree
    assert q_all is not None, f"{kind} drafts need draft_probs"
    b, n, _ = target.shape
    rows = torch.arange(b, device=target.device)
    path, num_acc, cur = _start(b, n, target.device)
    r = target[:, 0].float().clone()
    qc = q_all[:, 0].float().clone()
    for j in range(1, n):
        cand = parents[:, j] == cur  # padding (parent < 0) never matches
        tok = tokens[:, j]
        ratio = r[rows, tok] / qc[rows, tok].clamp_min(1e-30)
        acc_sampled = coins[:, j] < ratio.clamp(max=1.0)
        acc = cand & torch.where(greedy, tok == best[rows, cur], acc_sampled)
        rej = (cand & ~acc & ~greedy).view(-1, 1)
        r = torch.where(rej, _normalise((r - qc).clamp_min_(0.0), r), r)
        if kind is DraftKind.SAMPLED_DISTINCT:
            q_next = qc.scatter(1, tok.view(-1, 1), 0.0)
            qc = torch.where(rej, _normalise(q_next, qc), qc)
        acc2 = acc.view(-1, 1)
        r = torch.where(acc2, target[:, j].float(), r)
        qc = torch.where(acc2, q_all[:, j].float(), qc)
        _advance(path, num_acc, cur, acc, j)
    return path, num_acc, r


def accept_trees(
    tree: DraftTree,
    target: TargetProbs,
    generators: Sequence[torch.Generator | None],
) -> TreeAcceptResult:
    """`tree_accept` from the verify rows' `target_probs` ([B * N] rows) with each request's
    own generator."""
    b, n = tree.tokens.shape
    probs = target.probs.view(b, n, -1)
    greedy = target.greedy.view(b, n)[:, 0]
    coins = draw_coins(generators, n, probs.device)
    lp = target.logprobs.view(b, n, -1) if target.logprobs is not None else None
    return tree_accept(tree, probs, greedy, coins, lp)
