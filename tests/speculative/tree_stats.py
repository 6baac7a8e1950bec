"""Shared by the speculative acceptance tests: a synthetic "model" over a small vocabulary whose
exact next-token distributions are known, draft trees drawn from it, a chi-squared goodness-of-fit
p-value, and last-position logits of several sequences through a real ModelRunner.

`World` holds, for every path of depth d over V tokens (its `code`: the tokens in base V), target
and draft logits tables through the sampler's transforms (`target_probs`)."""

from __future__ import annotations

from typing import NamedTuple

import torch

from radixlm.runtime.sampling.sampling_batch import SamplingBatch
from radixlm.runtime.speculative.tree_accept import DraftKind, DraftTree, target_probs, tree_accept

DET, SAMPLED, DISTINCT = DraftKind.DETERMINISTIC, DraftKind.SAMPLED, DraftKind.SAMPLED_DISTINCT

V = 8
N_SAMPLES = 20_000
ALPHA = 1e-3

SHAPES = {  # parents lists, node 0 the root; siblings in drawing order
    "chain3": [-1, 0, 1, 2],
    "k2d2": [-1, 0, 0, 1, 1, 2, 2],
    "k3d3": [-1, 0, 0, 0, 1, 1, 1, 2, 2, 2, 4, 4, 4],
    "k4d2": [-1, 0, 0, 0, 0, *[1] * 4, *[2] * 4, *[3] * 4, *[4] * 4],
}
TRANSFORMS = {  # (temperature, top_k, top_p)
    "t1": (1.0, None, None),
    "topk": (1.0, 5, None),
    "topp": (1.0, None, 0.8),
    "all": (0.7, 6, 0.9),  # temperature, then top-k, then top-p
}


def sampling_batch(rows: int, temperature=1.0, top_k=None, top_p=None, greedy=False, min_p=None):
    """A SamplingBatch of `rows` identical rows (what the scheduler builds for verify rows)."""
    if greedy:
        return SamplingBatch.greedy_only(rows)
    full = lambda v, dt=torch.float32: torch.full((rows,), v, dtype=dt)  # noqa: E731
    return SamplingBatch(
        temperatures=full(temperature).view(-1, 1),
        greedy=full(False, torch.bool),
        all_greedy=False,
        top_ps=None if top_p is None else full(top_p),
        top_ks=None if top_k is None else full(top_k, torch.int64),
        min_ps=None if min_p is None else full(min_p),
        generators=[None] * rows,
        frequency=None,
        presence=None,
        output_counts=None,
        repetition=None,
        seen_mask=None,
        min_tokens_ban=None,
        logit_bias=None,
    )


class World(NamedTuple):
    p: list[torch.Tensor]  # p[d] [V**d, V]: target distribution after the depth-d path `code`
    q: list[torch.Tensor]  # the draft's


def make_world(max_depth: int, transform: str, seed: int, greedy: bool = False) -> World:
    g = torch.Generator().manual_seed(seed)
    temp, top_k, top_p = TRANSFORMS[transform]
    p, q = [], []
    for d in range(max_depth + 1):
        lp = torch.randn(V**d, V, generator=g) * 1.5
        lq = lp + torch.randn(V**d, V, generator=g)  # a related but different draft
        # NOTE: the draft samples with the request's own transforms (q is what it drew from).
        p.append(target_probs(lp, sampling_batch(V**d, temp, top_k, top_p, greedy)).probs)
        q.append(target_probs(lq, sampling_batch(V**d, temp, top_k, top_p)).probs)
    return World(p, q)


def draw_trees(world, parents, kind, root_code, root_depth, gen) -> tuple[DraftTree, torch.Tensor]:
    """One draft tree per row rooted at the depth-`root_depth` path `root_code` [B]; returns the
    tree (with q per node) and p per node [B, N, V]."""
    b, n = root_code.shape[0], len(parents)
    code = torch.zeros(b, n, dtype=torch.int64)
    code[:, 0] = root_code
    depth = [root_depth] + [0] * (n - 1)
    tokens = torch.zeros(b, n, dtype=torch.int64)
    drawn: dict[int, torch.Tensor] = {}  # parent -> [B, V] tokens already drawn below it
    real = torch.ones(b, n, dtype=torch.bool)  # False: a padding node of that row
    rank: dict[int, int] = {}
    for j in range(1, n):
        pa = parents[j]
        depth[j] = depth[pa] + 1
        qrow = world.q[depth[pa]][code[:, pa]]
        if kind is DET:  # the k-th child is the draft's k-th most likely token (EAGLE's top-k)
            rank[pa] = rank.get(pa, -1) + 1
            tok = qrow.topk(rank[pa] + 1, dim=-1).indices[:, -1]
        else:
            used = drawn.setdefault(pa, torch.zeros(b, V, dtype=torch.bool))
            if kind is DISTINCT:
                # NOTE: a draft with fewer than k tokens left cannot draw k distinct children:
                # those rows get padding nodes there (and below).
                left = qrow.masked_fill(used, 0.0)
                real[:, j] = left.sum(-1) > 0
                qrow = torch.where(real[:, j : j + 1], left, qrow)
            real[:, j] &= real[:, pa]
            tok = torch.multinomial(qrow, 1, generator=gen).view(-1)
            used[torch.arange(b), tok] = True
        tokens[:, j] = tok
        code[:, j] = code[:, pa] * V + tok
    node_p = torch.stack([world.p[depth[j]][code[:, j]] for j in range(n)], dim=1)
    node_q = torch.stack([world.q[depth[j]][code[:, j]] for j in range(n)], dim=1)
    parent_t = torch.where(real, torch.tensor(parents).expand(b, n), -1)
    return DraftTree(tokens, parent_t, None if kind is DET else node_q, kind), node_p


def first_two_tokens(world, parents, kind, seed, rule=None) -> torch.Tensor:
    """[N_SAMPLES, 2]: the first two committed tokens; rows whose first step committed one token
    take the second from a second step rooted after it. `rule(tree, p, coins)` replaces the
    acceptance (negative controls)."""
    gen = torch.Generator().manual_seed(seed)
    accept = rule or (lambda tree, p, coins: tree_accept(tree, p, no_greedy(p), coins).tokens)
    tree, p = draw_trees(world, parents, kind, torch.zeros(N_SAMPLES, dtype=torch.int64), 0, gen)
    out = accept(tree, p, torch.rand(p.shape[:2], generator=gen))[:, :2].clone()
    short = out[:, 1] < 0
    tree, p = draw_trees(world, parents, kind, out[short, 0], 1, gen)
    out[short, 1] = accept(tree, p, torch.rand(p.shape[:2], generator=gen))[:, 0]
    return out


def no_greedy(p: torch.Tensor) -> torch.Tensor:
    return torch.zeros(p.shape[0], dtype=torch.bool)


def chi2_pvalue(samples: torch.Tensor, probs: torch.Tensor) -> float:
    """Goodness of fit of integer `samples` to `probs` (cells with an expectation below 5 merged
    into one; 0 when a sample has probability 0); the p-value from the regularised upper incomplete gamma: P(chi2_df > x) =
    Q(df / 2, x / 2)."""
    expected = probs.double().flatten() * samples.numel()
    observed = torch.bincount(samples.flatten(), minlength=expected.numel()).double()
    if observed[expected == 0].sum() > 0:
        return 0.0  # a sample of probability 0: no fit at all
    small = expected < 5
    exp_cells = torch.cat([expected[~small], expected[small].sum().view(1)])
    obs_cells = torch.cat([observed[~small], observed[small].sum().view(1)])
    keep = exp_cells > 0
    exp_cells, obs_cells = exp_cells[keep], obs_cells[keep]
    stat = ((obs_cells - exp_cells) ** 2 / exp_cells).sum()
    df = torch.tensor(float(exp_cells.numel() - 1), dtype=torch.float64)
    return float(torch.special.gammaincc(df / 2, stat / 2))


def joint_probs(world: World) -> torch.Tensor:
    return world.p[0][0].view(V, 1) * world.p[1]  # [t1, t2]


def last_logits(runner, seqs: list[list[int]]) -> torch.Tensor:
    """The last position's logits of each sequence, in one EXTEND forward (no cache)."""
    from radixlm.runtime.executor.forward_batch import ForwardBatch, ForwardMode

    lens = [len(s) for s in seqs]
    rows = [runner.req_to_token.alloc() for _ in seqs]
    slots = runner.kv_pool.allocator.alloc(sum(lens))
    starts = [sum(lens[:i]) for i in range(len(seqs))]
    for row, start, n in zip(rows, starts, lens):
        runner.req_to_token.write(row, 0, slots[start : start + n])
    t = lambda v: torch.tensor(v, dtype=torch.int64)  # noqa: E731
    last = [s + n - 1 for s, n in zip(starts, lens)]
    batch = ForwardBatch(
        ForwardMode.EXTEND, len(seqs), t([x for s in seqs for x in s]),
        t([i for n in lens for i in range(n)]), slots, t(rows), t(lens), lens, [0] * len(seqs),
        lens, t([0] * len(seqs)), t(lens), t(starts), t(last), last,
    )  # fmt: skip
    try:
        return runner.compute_logits(runner.forward(batch)).float()
    finally:
        runner.kv_pool.allocator.free(slots)
        for row in rows:
            runner.req_to_token.free(row)


def accept_reference(tokens, parents, p, q, kind, greedy, coins) -> tuple[list[int], list[int]]:
    """One request, the module docstring's rule written as plainly as possible (the oracle of
    the vectorised walk): returns (path, committed tokens). Same coin convention: coin j tests
    node j, coin 0 draws the bonus by inverse CDF."""
    n = len(parents)
    cur, path, r = 0, [0], p[0].double().clone()
    qc = None if q is None else q[0].double().clone()
    while True:
        accepted = None
        for x in [j for j in range(1, n) if parents[j] == cur]:
            t = int(tokens[x])
            if greedy:
                if t == int(p[cur].argmax()):
                    accepted = x
                    break
                continue
            if kind is DET or r[t] == 0:
                ratio = float(r[t])
            else:  # NOTE: q(x) = 0 (not drawable, a broken contract) accepts when r(x) > 0
                ratio = float(r[t] / qc[t]) if qc[t] > 0 else 1.0
            if float(coins[x]) < min(1.0, ratio):
                accepted = x
                break
            res = r.clone()
            if kind is DET:
                res[t] = 0.0
            else:
                res = (r - qc).clamp_min(0.0)
            if res.sum() > 1e-12:
                r = res / res.sum()
            if kind is DISTINCT:
                qn = qc.clone()
                qn[t] = 0.0
                if qn.sum() > 0:
                    qc = qn / qn.sum()
        if accepted is None:
            break
        cur = accepted
        path.append(cur)
        r = p[cur].double().clone()
        qc = None if q is None else q[cur].double().clone()
    if greedy:
        bonus = int(p[cur].argmax())
    else:
        cdf = r.cumsum(0)
        bonus = int((cdf <= float(coins[0]) * float(cdf[-1])).sum())
    return path, [int(tokens[j]) for j in path[1:]] + [bonus]
