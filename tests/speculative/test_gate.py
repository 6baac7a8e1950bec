"""The speculative step's draft gate (gate.py), its step cost model (cost_model.py) and the host
greedy acceptance (greedy_accept.py): behaviour, no timing (costs are fed in by hand)."""

from __future__ import annotations

import torch

from radixlm.runtime.speculative.cost_model import StepCosts
from radixlm.runtime.speculative.draft_check import CheckedDraft
from radixlm.runtime.speculative.gate import DraftGate, node_probs, subtree
from radixlm.runtime.speculative.greedy_accept import accept_greedy
from radixlm.runtime.speculative.tree_accept import DraftKind, DraftTree, tree_accept


def chain(n: int) -> CheckedDraft:
    """A root and `n` draft tokens in a chain."""
    return CheckedDraft(list(range(n + 1)), [100 + k for k in range(n + 1)], list(range(-1, n)))


def record(gate: DraftGate, verify: bool, rows: int, seconds: float) -> None:
    for _ in range(2):  # NOTE: the first step of a shape is not kept (one-time costs)
        gate.record(verify, rows, seconds)


def cpu_like(gate: DraftGate) -> DraftGate:
    """Costs shaped like a small CPU: a plain step 10 ms, each verify row ~2.5 ms more."""
    record(gate, False, 1, 0.010)
    for rows in (2, 5, 13):
        record(gate, True, rows, 0.008 + 0.0025 * rows)
    return gate


def plan(gate: DraftGate, rids: list[str], drafts: list[CheckedDraft]) -> list[CheckedDraft]:
    return gate.plan(rids, drafts, gate.begin_step(rids))


def kept(gate: DraftGate, rid: str, draft: CheckedDraft) -> int:
    return len(plan(gate, [rid], [draft])[0].kept) - 1


def test_never_accepted_drafts_stop_being_verified() -> None:
    gate = cpu_like(DraftGate())
    verified = []
    for step in range(300):
        n = kept(gate, "a", chain(8))
        if n:
            verified.append(step)
            gate.update("a", accepted=0, rejected=True)
    assert verified[:2] == [0, 2]  # the prior: worth a try; then waits of 1, 2, 4, ...
    assert len([s for s in verified if s >= 50]) <= 8  # then only a rare probe
    assert gate.accept_prob("a") < 0.3  # below the prior: what a probe must beat
    assert all(kept(DraftGate(), "z", chain(8)) >= 1 for _ in range(3))  # a fresh request


def test_accepted_drafts_get_longer() -> None:
    gate = cpu_like(DraftGate())
    start = kept(gate, "a", chain(12))
    for _ in range(20):
        gate.update("a", accepted=6, rejected=False)
    assert gate.accept_prob("a") > 0.9
    assert kept(gate, "a", chain(12)) > start >= 1
    for _ in range(20):
        gate.update("b", accepted=0, rejected=True)
    assert kept(gate, "b", chain(12)) == 0  # plain step
    gate.release("a")
    assert kept(gate, "a", chain(12)) == start


def test_free_rows_verify_everything_and_rows_stay_within_budget() -> None:
    gate = DraftGate(max_rows=8)
    record(gate, False, 2, 0.010)
    for rows in (3, 9):
        record(gate, True, rows, 0.010)  # a GPU-like cost: rows are free
    got = plan(gate, ["a", "b"], [chain(10), chain(2)])
    assert [len(d.kept) for d in got] == [4, 3]  # 2 x widest (4) <= 8
    assert plan(DraftGate(always=True), ["a"], [chain(10)])[0] == chain(10)


def test_plans_are_subtrees_in_order_of_likelihood() -> None:
    # root -> 1 -> 2 -> 3, and 4 a second child of the root
    tree = CheckedDraft([0, 1, 2, 3, 4], [9, 10, 11, 12, 13], [-1, 0, 1, 2, 0])
    probs = node_probs(tree, 0.5)
    assert probs == [1.0, 0.5, 0.25, 0.125, 0.25]
    cut = subtree(tree, {0, 1, 4})
    assert cut == CheckedDraft([0, 1, 4], [9, 10, 13], [-1, 0, 0])
    gate = cpu_like(DraftGate())
    for got in (plan(gate, ["a"], [tree])[0], plan(DraftGate(max_rows=3), ["a"], [tree])[0]):
        assert len(got.kept) > 1
        index = {old: k for k, old in enumerate(got.kept)}
        assert all(got.parents[index[j]] == index.get(tree.parents[j], -1) for j in got.kept)


def test_cost_model_fits_and_priors() -> None:
    costs = StepCosts(measure=False)
    costs.record(True, 4, 1.0)
    assert costs.seconds == {}  # priors only: deterministic
    assert costs.verify(3) == costs.plain(3) > costs.plain(1)  # optimistic: a first verify runs
    assert costs.verify(9) > costs.verify(5)
    costs = StepCosts()
    costs.record(True, 2, 1.0)  # the first step of a shape: one-time costs, not kept
    costs.record(True, 2, 0.012)  # no plain step measured yet (the unit): not kept
    assert costs.seconds == {}
    for key in [(False, 1, 0.01)] * 2 + [(True, 2, 0.012)] + [(True, 6, 0.020)] * 2:
        costs.record(*key)
    assert costs.seconds.keys() == {(False, 1), (True, 2), (True, 6)}
    assert abs(costs.seconds[(True, 2)] - 1.2) < 1e-9  # in plain steps of one row
    assert abs(costs.verify(4) - 0.016) < 1e-9  # on the line through the measured points
    assert abs(costs.verify(6) - 0.020) < 1e-9
    for _ in range(200):
        costs.record(False, 1, 0.02)  # the machine got twice as slow: verify steps scale too
    assert abs(costs.verify(6) - 0.040) < 1e-4
    costs.record(True, 6, 0.2)  # a spike rises slowly, at most 2x
    assert costs.verify(6) < 0.045
    for _ in range(30):
        costs.record(True, 6, 0.02)  # and a quieter figure falls fast
    assert costs.verify(6) < 0.03


def test_host_greedy_accept_is_tree_accepts_greedy_rule() -> None:
    gen = torch.Generator().manual_seed(0)
    b, n, v = 5, 7, 6
    for _ in range(50):
        parents = torch.full((b, n), -1, dtype=torch.int64)
        for i in range(b):
            real = int(torch.randint(1, n + 1, (1,), generator=gen))
            for j in range(1, real):
                parents[i, j] = int(torch.randint(0, j, (1,), generator=gen))
        tokens = torch.randint(0, v, (b, n), generator=gen)
        logits = torch.randn(b * n, v, generator=gen)
        best = logits.argmax(-1).view(b, n)
        tokens = torch.where(
            torch.rand(b, n, generator=gen) < 0.6, best.gather(1, parents.clamp_min(0)), tokens
        )
        onehot = torch.nn.functional.one_hot(logits.argmax(-1), v).float().view(b, n, v)
        want = tree_accept(DraftTree(tokens, parents, None, DraftKind.DETERMINISTIC), onehot,
                           torch.ones(b, dtype=torch.bool), torch.rand(b, n, generator=gen))  # fmt: skip
        got = accept_greedy(best.tolist(), tokens.tolist(), parents.tolist())
        assert torch.equal(got.path, want.path)
        assert torch.equal(got.num_accepted, want.num_accepted)
        assert torch.equal(got.tokens, want.tokens)


def test_hints_keep_their_own_acceptance() -> None:
    """With a proposer's hints (NGRAM: the matched window), drafts of a bucket whose tokens are
    accepted keep being verified while those of a bucket that fails stop; a new request starts
    from each bucket's figures over all requests."""
    gate = cpu_like(DraftGate())
    strong, weak = 12, 1  # buckets 4 and 1

    def verified(rid: str, hint: int) -> int:
        return len(gate.plan([rid], [chain(8)], gate.begin_step([rid]), [hint])[0].kept) - 1

    for _ in range(30):
        if verified("a", strong):
            gate.update("a", accepted=6, rejected=False, hint=strong)
        if verified("a", weak):
            gate.update("a", accepted=0, rejected=True, hint=weak)
    assert gate.accept_prob("a", strong) > 0.9 and gate.accept_prob("a", weak) < 0.3
    assert verified("a", strong) >= 3 and verified("a", weak) == 0
    assert verified("b", strong) >= 3 and verified("b", weak) == 0  # the buckets' priors
    gate.release("a")
    assert all(key[0] != "a" for key in gate.hinted)


def test_a_noisy_falling_line_is_flat_at_the_mean() -> None:
    """Verify figures that fall with rows (noise) give a flat line at their mean, not the
    negative-slope line's intercept (which made every verify step look dearer than measured)."""
    costs = StepCosts()
    for key in [(False, 1, 0.010)] * 2 + [(True, 3, 0.0205)] * 2 + [(True, 4, 0.0190)] * 2:
        costs.record(*key)
    assert abs(costs.verify(4) - 0.01975) < 1e-9 and abs(costs.verify(12) - 0.01975) < 1e-9


def test_verify_curve_is_verify() -> None:
    costs = StepCosts()
    assert costs.verify_curve(2, 3) == [costs.verify(r) for r in (2, 3, 4)]  # priors
    for key in [(False, 1, 0.01)] * 2 + [(True, 3, 0.015)] * 2:
        costs.record(*key)
    assert costs.verify_curve(2, 3) == [costs.verify(r) for r in (2, 3, 4)]  # one shape
    for key in [(True, 7, 0.025)] * 2:
        costs.record(*key)
    got = costs.verify_curve(2, 11)
    assert got == [costs.verify(r) for r in range(2, 13)] and costs.verify_curve(5, 0) == []


def test_a_spike_does_not_lock_speculation_out() -> None:
    """Verify steps timed in another process's load spike (20x a plain step) must not keep the
    gate from ever verifying again: a shape's first figure is capped, and figures not measured
    again move back towards their prior, so a draft is tried again after a while."""
    gate = DraftGate()
    record(gate, False, 1, 0.010)
    for rows in (2, 12):
        record(gate, True, rows, 0.200)
    tried = None
    for step in range(2000):
        if kept(gate, "a", chain(11)):
            tried = step
            break
        gate.record(False, 1, 0.010)
    assert tried is not None and tried > 0
