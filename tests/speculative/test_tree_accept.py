"""Tree/chain acceptance keeps the target's distribution (runtime/speculative/tree_accept.py).

A small synthetic "model": for every path of depth d over a V-token vocabulary, target and draft
logits tables (`World`); the target p and the draft q are those logits through the sampler's
transforms (temperature 1, top-k, top-p). Draft trees are drawn from q per trial (or chosen
deterministically), accepted against p, and the committed tokens' frequencies go through a
chi-squared goodness-of-fit test at alpha = 1e-3 against the exact probabilities: the first
token's, and the first two tokens' jointly (a second speculative step supplies the second token
when the first step committed only one). Negative controls show the same test rejects wrong rules.
"""

from __future__ import annotations

import pytest
import torch
from speculative.tree_stats import (
    ALPHA,
    DET,
    DISTINCT,
    N_SAMPLES,
    SAMPLED,
    SHAPES,
    TRANSFORMS,
    V,
    World,
    accept_reference,
    chi2_pvalue,
    draw_trees,
    first_two_tokens,
    joint_probs,
    last_logits,
    make_world,
    no_greedy,
    sampling_batch,
)

from radixlm.runtime.sampling.sampler import sample
from radixlm.runtime.speculative.tree_accept import (
    DraftTree,
    accept_trees,
    node_contexts,
    target_probs,
    tree_accept,
)


def test_chi2_helper_is_calibrated() -> None:
    """The helper against known values: chi2 with 1 dof, x = 3.841 -> 0.05 (exact samples)."""
    probs = torch.tensor([0.5, 0.5])
    # 1000 samples with 531 zeros: x = 2 * 31^2 / 500 = 3.844, p = 0.0499
    samples = torch.cat([torch.zeros(531), torch.ones(469)]).long()
    assert chi2_pvalue(samples, probs) == pytest.approx(0.0499, abs=5e-4)
    g = torch.Generator().manual_seed(0)
    fair = torch.multinomial(torch.full((8,), 0.125), N_SAMPLES, True, generator=g)
    assert chi2_pvalue(fair, torch.full((8,), 0.125)) > ALPHA
    assert chi2_pvalue(fair, torch.tensor([0.13] * 4 + [0.12] * 4)) < ALPHA


CASES = [
    ("chain3", SAMPLED, "t1"),
    ("chain3", DET, "topk"),
    ("k2d2", SAMPLED, "t1"),
    ("k2d2", DISTINCT, "topp"),
    ("k3d3", DISTINCT, "t1"),
    ("k3d3", SAMPLED, "topk"),
    ("k3d3", DET, "topp"),
    ("k4d2", DET, "t1"),
    ("k4d2", SAMPLED, "topp"),
    ("k4d2", DISTINCT, "topk"),
    ("k2d2", SAMPLED, "all"),
    ("k3d3", DET, "all"),
]


@pytest.mark.parametrize("shape,kind,transform", CASES)
def test_committed_tokens_follow_the_target(shape, kind, transform) -> None:
    seed = CASES.index((shape, kind, transform))
    world = make_world(4, transform, seed)
    out = first_two_tokens(world, SHAPES[shape], kind, 100 + seed)
    assert chi2_pvalue(out[:, 0], world.p[0][0]) > ALPHA
    assert chi2_pvalue(out[:, 0] * V + out[:, 1], joint_probs(world)) > ALPHA


def _rule(kind=None, q=None):
    """`tree_accept` with the tree's kind or draft probabilities replaced (wrong on purpose)."""

    def accept(tree, p, coins):
        tree = tree._replace(kind=kind or tree.kind)
        if q is not None:
            tree = tree._replace(draft_probs=torch.full_like(tree.draft_probs, q))
        return tree_accept(tree, p, no_greedy(p), coins).tokens

    return accept


def test_negative_controls_are_rejected() -> None:
    """Wrong rules fail the same test: accepting every draft (the first token is then the
    draft's); the with-replacement rule on drafts drawn without replacement; a q that is not the
    distribution the drafts were drawn from (uniform)."""
    world = make_world(4, "t1", 7)
    always = first_two_tokens(world, SHAPES["chain3"], SAMPLED, 1, rule=lambda t, p, c: t.tokens)
    assert chi2_pvalue(always[:, 0], world.p[0][0]) < ALPHA
    out = first_two_tokens(world, SHAPES["k2d2"], DISTINCT, 2, rule=_rule(kind=SAMPLED))
    assert chi2_pvalue(out[:, 0], world.p[0][0]) < ALPHA
    out = first_two_tokens(world, SHAPES["chain3"], SAMPLED, 3, rule=_rule(q=1.0 / V))
    assert chi2_pvalue(out[:, 0], world.p[0][0]) < ALPHA


@pytest.mark.parametrize("kind", [SAMPLED, DISTINCT])
def test_deterministic_rule_is_exact_for_sampled_drafts_but_accepts_less(kind) -> None:
    """Ignoring q (try child x with probability r(x)) is exact for children drawn any way
    independent of the verify coins; using q accepts more tokens per step (1 - TV(p, q) per
    try instead of E_q[p(x)])."""
    world = make_world(4, "t1", 11)
    out = first_two_tokens(world, SHAPES["k3d3"], kind, 5, rule=_rule(kind=DET))
    assert chi2_pvalue(out[:, 0] * V + out[:, 1], joint_probs(world)) > ALPHA
    gen = torch.Generator().manual_seed(6)
    tree, p = draw_trees(world, SHAPES["k3d3"], kind, torch.zeros(4000, dtype=torch.int64), 0, gen)
    coins = torch.rand(p.shape[:2], generator=gen)
    with_q = tree_accept(tree, p, no_greedy(p), coins).num_accepted.float().mean()
    without = tree_accept(tree._replace(kind=DET), p, no_greedy(p), coins).num_accepted
    assert with_q > without.float().mean() + 0.05


def test_target_probs_is_what_the_sampler_draws_from() -> None:
    """The sampler's own draws fit `target_probs` of the same logits, for each transform (and
    min-p); greedy rows are one-hot at the argmax."""
    logits = torch.randn(1, 12, generator=torch.Generator().manual_seed(3)) * 2
    settings = [(*t, None) for t in TRANSFORMS.values()] + [(1.0, None, None, 0.1)]
    for temp, top_k, top_p, min_p in settings:
        sb = sampling_batch(N_SAMPLES, temp, top_k, top_p, min_p=min_p)
        sb.generators = [torch.Generator().manual_seed(i) for i in range(N_SAMPLES)]
        drawn = sample(logits.expand(N_SAMPLES, -1).clone(), sb).next_token_ids
        one = sampling_batch(1, temp, top_k, top_p, min_p=min_p)
        probs = target_probs(logits.clone(), one).probs[0]
        assert chi2_pvalue(drawn, probs) > ALPHA
        assert float(probs.sum()) == pytest.approx(1.0)
        if top_k is not None:
            assert int((probs > 0).sum()) <= top_k
    onehot = torch.nn.functional.one_hot(logits.argmax(-1), 12)[0].float()
    greedy = target_probs(logits.clone(), sampling_batch(1, greedy=True))
    assert greedy.greedy.all() and torch.equal(greedy.probs[0], onehot)
    mixed = sampling_batch(2, 1.0, 5)
    mixed.greedy = torch.tensor([True, False])
    both = target_probs(logits.expand(2, -1).clone(), mixed)
    assert torch.equal(both.probs[0], onehot) and int((both.probs[1] > 0).sum()) == 5
    assert both.greedy.tolist() == [True, False]


def _greedy_walk(world: World, tokens: list[int], parents: list[int]) -> list[int]:
    """The target's greedy continuation along one tree: follow the first child holding the
    argmax, then the argmax bonus."""
    cur, depth, code, out = 0, 0, 0, []
    while True:
        best = int(world.p[depth][code].argmax())
        child = next((j for j, pa in enumerate(parents) if pa == cur and tokens[j] == best), None)
        out.append(best)
        if child is None:
            return out
        cur, depth, code = child, depth + 1, code * V + best


@pytest.mark.parametrize("kind", [DET, SAMPLED, DISTINCT])
def test_greedy_commits_the_targets_greedy_continuation_along_the_tree(kind) -> None:
    """Greedy rows (one-hot `target_probs`): the committed tokens are the target's argmax path as
    far as the tree holds it, then the argmax bonus, whatever the draft's q; half the nodes hold
    the argmax token."""
    world = make_world(4, "t1", 21, greedy=True)
    parents = SHAPES["k3d3"]
    b, n = 400, len(parents)
    g = torch.Generator().manual_seed(0)
    tokens = torch.zeros(b, n, dtype=torch.int64)
    code = torch.zeros(b, n, dtype=torch.int64)
    depth = [0] * n
    for j in range(1, n):
        pa = parents[j]
        depth[j] = depth[pa] + 1
        best = world.p[depth[pa]][code[:, pa]].argmax(-1)
        rand = torch.randint(0, V, (b,), generator=g)
        tokens[:, j] = torch.where(torch.rand(b, generator=g) < 0.5, best, rand)
        code[:, j] = code[:, pa] * V + tokens[:, j]
    probs = torch.stack([world.p[depth[j]][code[:, j]] for j in range(n)], dim=1)
    target = target_probs(probs.log().view(b * n, V), sampling_batch(b * n, greedy=True))
    q = None if kind is DET else torch.softmax(torch.randn(b, n, V, generator=g), -1)
    tree = DraftTree(tokens, torch.tensor(parents).expand(b, n), q, kind)
    res = accept_trees(tree, target, [torch.Generator().manual_seed(i) for i in range(b)])
    for i in range(b):
        want = _greedy_walk(world, tokens[i].tolist(), parents)
        a = int(res.num_accepted[i])
        assert res.tokens[i, : a + 1].tolist() == want and (res.tokens[i, a + 1 :] == -1).all()
        assert [int(tokens[i, j]) for j in res.path[i, 1 : a + 1]] == want[:-1]
    assert set(res.num_accepted.tolist()) == {0, 1, 2, 3}  # every depth, full trees included


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _flat(p: torch.Tensor):
    """`TargetProbs` of the rows of `p` [B, N, V] (softmax(log p) at temperature 1 is p)."""
    return target_probs(p.log().flatten(0, 1), sampling_batch(p.shape[0] * p.shape[1]))


def test_a_requests_result_depends_only_on_its_tree_and_generator() -> None:
    """Batched with another request's tree, or padded with junk nodes (parent < 0), a request
    commits what it commits alone with the same generator seed."""
    world = make_world(4, "t1", 41)
    gen = torch.Generator().manual_seed(0)
    n = len(SHAPES["k3d3"])
    for seed in range(40):
        chain, p_chain = draw_trees(world, SHAPES["chain3"], SAMPLED, torch.zeros(1).long(), 0, gen)
        tree, p_tree = draw_trees(world, SHAPES["k3d3"], SAMPLED, torch.zeros(1).long(), 0, gen)
        pad = n - 4
        junk = torch.softmax(torch.randn(1, pad, V, generator=gen), -1)
        padded = DraftTree(
            torch.cat([chain.tokens, torch.randint(0, V, (1, pad), generator=gen)], 1),
            torch.cat([chain.parents, torch.full((1, pad), -1)], 1),
            torch.cat([chain.draft_probs, junk], 1),
            SAMPLED,
        )
        p_padded = torch.cat([p_chain, junk], 1)
        both = DraftTree(*(torch.cat([a, b]) for a, b in zip(padded[:3], tree[:3])), SAMPLED)
        p_both = torch.cat([p_padded, p_tree])
        coins = torch.rand(2, n, generator=torch.Generator().manual_seed(seed))
        together = tree_accept(both, p_both, no_greedy(p_both), coins)
        alone_tree = tree_accept(tree, p_tree, no_greedy(p_tree), coins[1:])
        alone_chain = tree_accept(chain, p_chain, no_greedy(p_chain), coins[:1, :4])
        assert together.tokens[1].tolist() == alone_tree.tokens[0].tolist()
        assert together.tokens[0, :4].tolist() == alone_chain.tokens[0].tolist()
        assert together.path[0, :4].tolist() == alone_chain.path[0].tolist()
        # accept_trees draws each row's coins from that row's generator only
        res = accept_trees(both, _flat(p_both), [_gen(seed), _gen(99)])
        solo = accept_trees(padded, _flat(p_padded), [_gen(seed)])
        assert res.tokens[0].tolist() == solo.tokens[0].tolist()


def test_logprobs_of_the_committed_tokens() -> None:
    """Logprobs follow the sampler's convention (log_softmax before temperature) at the node each
    committed token was drawn from: path[k] for token k; NaN past the bonus."""
    world = make_world(4, "topk", 51)
    b, parents = 64, SHAPES["k2d2"]
    n = len(parents)
    tree, _ = draw_trees(world, parents, SAMPLED, torch.zeros(b).long(), 0, torch.Generator())
    logits = torch.randn(b * n, V, generator=torch.Generator().manual_seed(1)) * 2
    target = target_probs(logits.clone(), sampling_batch(b * n, 0.7, 5), return_logprob=True)
    res = accept_trees(tree, target, [torch.Generator().manual_seed(i) for i in range(b)])
    want_lp = torch.log_softmax(logits, -1).view(b, n, V)
    assert res.logprobs is not None
    for i in range(b):
        a = int(res.num_accepted[i])
        for k in range(a + 1):
            node, tok = int(res.path[i, k]), int(res.tokens[i, k])
            assert target.probs[i * n + node, tok] > 0
            assert float(res.logprobs[i, k]) == pytest.approx(float(want_lp[i, node, tok]))
        assert res.logprobs[i, a + 1 :].isnan().all()


PROMPT = [5, 17, 250, 3, 99, 42]


@pytest.fixture(scope="module")
def llama_pair():
    """A tiny random-weight Llama (runtime/models) and a perturbed copy as its draft. The final
    norm is scaled down so that the next-token distribution is spread over many tokens."""
    from radixlm.runtime.executor.model_runner import ModelRunner
    from radixlm.runtime.models.loader import resolve_model
    from radixlm.runtime.server_args import ServerArgs

    def runner():
        args = ServerArgs(
            model_path="tiny-llama", load_format="dummy", max_total_tokens=512,
            max_running_requests=40,
        )  # fmt: skip
        r = ModelRunner(args, resolve_model("tiny-llama", "dummy"))
        with torch.no_grad():
            r.model.norm.weight.mul_(0.1)
        return r

    target, draft = runner(), runner()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for w in draft.model.parameters():
            w.add_(torch.randn(w.shape, generator=g) * w.std() * 0.5)
    return target, draft


@pytest.mark.parametrize(
    "kind,top_k,top_p", [(SAMPLED, 16, None), (DISTINCT, None, 0.2), (DET, None, 0.2)]
)
def test_tiny_llama_first_token_follows_the_target(llama_pair, kind, top_k, top_p) -> None:
    """p from the model's logits after a prompt, q from its perturbed copy (both through the
    request's temperature 1 and top-k / top-p); three children at depth 1 (drawn from q, or its
    top-3): the first committed token's frequencies fit p."""
    target_runner, draft_runner = llama_pair
    sb = lambda rows: sampling_batch(rows, 1.0, top_k, top_p)  # noqa: E731
    q = target_probs(last_logits(draft_runner, [PROMPT]), sb(1)).probs[0]
    support = q.nonzero().view(-1).tolist()
    seqs = [PROMPT] + [[*PROMPT, x] for x in support]
    p_rows = target_probs(last_logits(target_runner, seqs), sb(len(seqs))).probs
    assert 0.05 < 0.5 * float((p_rows[0] - q).abs().sum()) < 0.95  # q != p, yet they overlap
    # NOTE: the walk only ever meets tokens some row gives mass to: keep those columns (fast).
    keep = ((p_rows > 0).any(0) | (q > 0)).nonzero().view(-1)
    p_rows, q, vocab = p_rows[:, keep], q[keep], keep.numel()
    p_root = p_rows[0]
    p_child = torch.zeros(vocab, vocab)
    p_child[torch.searchsorted(keep, torch.tensor(support))] = p_rows[1:]

    b, gen = N_SAMPLES, torch.Generator().manual_seed(0)
    if kind is DET:
        children = q.topk(3).indices.expand(b, 3)
    else:
        children = torch.multinomial(q.expand(b, -1), 3, kind is SAMPLED, generator=gen)
    tokens = torch.cat([torch.zeros(b, 1).long(), children], 1)  # root: not tested
    node_p = torch.cat([p_root.expand(b, 1, -1), p_child[children]], 1)
    node_q = None if kind is DET else q.expand(b, 4, -1)
    tree = DraftTree(tokens, torch.tensor([-1, 0, 0, 0]).expand(b, 4), node_q, kind)
    res = tree_accept(tree, node_p, no_greedy(node_p), torch.rand(b, 4, generator=gen))
    assert chi2_pvalue(res.tokens[:, 0], p_root) > ALPHA
    if kind is not DET:  # the test has the power to tell q from p: the drafts themselves fail it
        assert chi2_pvalue(children[:, 0], p_root) < ALPHA
    accepted = res.num_accepted == 1
    assert 0.2 < float(accepted.float().mean()) < 1.0
    # the second token, after an accepted child, is drawn from p at that child
    second = res.tokens[accepted, 1]
    assert (p_child[res.tokens[accepted, 0], second] > 0).all()


@pytest.mark.parametrize("kind", [DET, SAMPLED, DISTINCT])
def test_vectorised_walk_equals_the_plain_reference(kind) -> None:
    """Random trees (random shapes, repeated tokens, padding, zero probabilities, greedy rows
    mixed in) with the same coins: the batched walk commits exactly what the one-request
    reference does."""
    g = _gen(len(kind.value))
    b, n, vocab = 300, 9, 6
    parents = torch.stack([torch.randint(0, j, (b,), generator=g) for j in range(1, n)], 1)
    size = torch.randint(1, n + 1, (b, 1), generator=g)  # real nodes per row, the root included
    parents = torch.cat([torch.full((b, 1), -1), parents], 1)
    parents = torch.where(torch.arange(n) < size, parents, -1)
    tokens = torch.randint(0, vocab, (b, n), generator=g)

    def dist():
        x = torch.rand(b, n, vocab, generator=g) * (torch.rand(b, n, vocab, generator=g) > 0.3)
        x[..., 0] += 0.01  # no empty row
        return x / x.sum(-1, keepdim=True)

    p, q = dist(), None if kind is DET else dist()
    greedy = torch.rand(b, generator=g) < 0.25
    coins = torch.rand(b, n, generator=g)
    res = tree_accept(DraftTree(tokens, parents, q, kind), p, greedy, coins)
    for i in range(b):
        path, committed = accept_reference(
            tokens[i], parents[i].tolist(), p[i], None if q is None else q[i], kind,
            bool(greedy[i]), coins[i],
        )  # fmt: skip
        a = int(res.num_accepted[i])
        assert res.path[i, : a + 1].tolist() == path
        assert res.tokens[i, : a + 1].tolist() == committed


def test_node_contexts_are_the_paths_below_the_root() -> None:
    tokens = [9, 4, 5, 6, 7, 8]
    parents = [-1, 0, 0, 1, 3, -1]
    assert node_contexts(tokens, parents) == [[], [4], [5], [4, 6], [4, 6, 7], []]
