"""The speculative step inside the real scheduler, in-process, on a tiny random-weight Qwen2 (CPU,
fp32): greedy outputs token-identical with speculation on and off, with drafts of every quality
in one batch (a scripted proposer that knows the plain run's tokens and errs at a chosen depth,
chains and trees), the real NGRAM proposer, stops and length limits inside a step's committed
tokens, logprobs, a tiny pool (retraction), chunked prefill and the radix cache on a multi-turn
workload; sampling keeps the target distribution (χ² through the real step). After every test the
KV accounting is back to idle: rejected and dropped draft slots were all freed."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest
import torch

from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.models.loader import resolve_model
from radixlm.runtime.processes import io
from radixlm.runtime.sampling.sampling_params import SamplingParams
from radixlm.runtime.scheduler.scheduler import Scheduler
from radixlm.runtime.server_args import ServerArgs
from radixlm.runtime.speculative.gate import DraftGate
from radixlm.runtime.speculative.proposer import Proposer
from radixlm.runtime.speculative.tree_accept import DraftKind, DraftTree

MODEL = "tiny-qwen2"
VOCAB = 512
RUNNERS: dict[tuple, ModelRunner] = {}


def make_scheduler(**kwargs: Any) -> Scheduler:
    opts = {"max_total_tokens": 2048, **kwargs}
    args = ServerArgs(model_path=MODEL, load_format="dummy", device="cpu",
                      skip_tokenizer_init=True, random_seed=0, num_threads=1, **opts)  # fmt: skip
    # NOTE: one runner (same random weights) per pool and backend, shared by both sides of a
    # comparison.
    key = (opts["max_total_tokens"], opts.get("max_running_requests"),
           opts.get("attention_backend"))  # fmt: skip
    runner = RUNNERS.get(key)
    if runner is None:
        runner = RUNNERS[key] = ModelRunner(args, resolve_model(MODEL, "dummy"))
    runner.kv_pool.allocator.clear()
    return Scheduler(args, runner)


def gen(rid: str, ids: list[int], **params: Any) -> io.GenerateReq:
    lp = {k: params.pop(k) for k in ("return_logprob", "top_logprobs_num") if k in params}
    sp = SamplingParams.from_dict({"temperature": 0.0, "ignore_eos": True, **params}, VOCAB)
    return io.GenerateReq(rid=rid, input_ids=ids, sampling_params=sp, **lp)


def prompt(seed: int, n: int) -> list[int]:
    return [(seed * 31 + 7 * i) % 500 + 3 for i in range(n)]


def run_all(s: Scheduler) -> dict[str, io.ReqOut]:
    merged: dict[str, io.ReqOut] = {}
    for _ in range(10_000):
        if not s.has_work:
            break
        s.run_once()
        for out in s.take_outputs():
            prev = merged.get(out.rid)
            if prev is not None:
                out.new_ids = prev.new_ids + out.new_ids
                if out.output_logprobs is not None:
                    out.output_logprobs = prev.output_logprobs + out.output_logprobs
                    out.output_top = (prev.output_top or []) + (out.output_top or [])
            merged[out.rid] = out
    assert s.idle
    resp = s.handle(io.ControlReq("check_invariants", 0))
    assert resp is not None and resp.ok, resp
    return merged


def every_draft(s: Scheduler) -> None:
    """Verify every draft: no CPU row budget, no back-off (deterministic acceptance figures)."""
    assert s.spec is not None
    s.spec.gate = DraftGate(always=True)


def ids_of(outs: dict[str, io.ReqOut]) -> dict[str, list[int]]:
    return {rid: o.new_ids for rid, o in outs.items()}


class Scripted(Proposer):
    """Proposes the plain run's continuation of each request, wrong at depth `miss[rid]` (a
    chain), or (`tree`) a wrong first child beside the right chain."""

    kind = DraftKind.DETERMINISTIC

    def __init__(self, script: dict[str, list[int]], num_nodes: int, miss: dict[str, int],
                 tree: bool = False) -> None:  # fmt: skip
        self.script, self.num_nodes, self.miss, self.tree = script, num_nodes, miss, tree
        self.released: list[str] = []
        self.prefilled: set[str] = set()
        self.committed: dict[str, list[int]] = {}

    def propose(self, reqs: Sequence[Any]) -> DraftTree:
        n = self.num_nodes
        tokens = torch.zeros(len(reqs), n, dtype=torch.int64)
        parents = torch.full((len(reqs), n), -1, dtype=torch.int64)
        for i, req in enumerate(reqs):
            done = len(req.output_ids)
            cont = list(self.script[req.rid][done : done + n - 1 - self.tree])
            miss = self.miss.get(req.rid, n)
            if miss < len(cont):
                cont[miss] = (cont[miss] + 1) % VOCAB
            toks, pars = [req.last_token], [-1]
            if self.tree and cont:
                toks.append((cont[0] + 7) % VOCAB)  # a wrong sibling, tried first
                pars.append(0)
            for k, t in enumerate(cont):
                toks.append(t)
                pars.append(0 if k == 0 else len(toks) - 2)
            tokens[i, : len(toks)] = torch.tensor(toks)
            parents[i, : len(pars)] = torch.tensor(pars)
        return DraftTree(tokens, parents, None, self.kind)

    needs_hidden = True  # exercises the hidden-state layout of the hooks

    def on_prefilled(self, reqs: Sequence[Any], hidden: Any) -> None:
        self.prefilled.update(r.rid for r in reqs)
        assert hidden is not None  # the extend's logits rows (none for a prompt's inner chunk)

    def on_verified(self, reqs: Sequence[Any], result: Any, hidden: Any) -> None:
        """Every decode step, plain or verify: the committed tokens, in this proposer's layout."""
        b, n = len(reqs), self.num_nodes
        assert result.path.shape == (b, n) and hidden.shape[0] == b * n
        rows = hidden.view(b, n, -1)
        for i, req in enumerate(reqs):
            a = int(result.num_accepted[i])
            path = result.path[i, : a + 1].tolist()
            assert all(rows[i, j].abs().sum() > 0 for j in path)  # verified rows are real
            self.committed.setdefault(req.rid, []).extend(result.tokens[i, : a + 1].tolist())

    def release(self, req: Any) -> None:
        self.released.append(req.rid)


REQS = [(f"r{k}", prompt(k, 20 + 3 * k), 14 + 3 * k) for k in range(5)]


def submit(s: Scheduler, **params: Any) -> None:
    for rid, ids, max_new in REQS:
        s.handle(gen(rid, ids, max_new_tokens=max_new, **params))


@pytest.fixture(scope="module")
def plain() -> dict[str, list[int]]:
    s = make_scheduler()
    submit(s)
    return ids_of(run_all(s))


@pytest.mark.parametrize("tree", [False, True])
def test_drafts_of_every_quality_give_the_plain_tokens(plain, tree) -> None:
    s = make_scheduler(speculative_algorithm="NGRAM", speculative_num_draft_tokens=6)
    misses = {"r0": 0, "r1": 1, "r2": 3, "r3": 99}  # r4: no script entry errs
    every_draft(s)
    s.spec.proposer = prop = Scripted(plain, 6, misses, tree)
    submit(s)
    outs = run_all(s)
    assert ids_of(outs) == plain
    accept = {rid: o.spec_committed / o.spec_verify_ct for rid, o in outs.items()}
    assert accept["r0"] == 1.0 < accept["r1"] < accept["r2"] < accept["r3"]
    assert s.stats["spec_committed_tokens"] > s.stats["spec_verify_steps"]
    assert sorted(prop.released) == sorted(plain)  # every finished request was released
    assert prop.prefilled == set(plain)
    # the hooks saw every committed token (a step may commit past max_new_tokens: cut after)
    assert all(prop.committed[r][: len(ids) - 1] == ids[1:] for r, ids in plain.items())


@pytest.mark.parametrize("measure", [False, True])
def test_ngram_gives_the_plain_tokens(measure: bool) -> None:
    """The real NGRAM proposer and gate, a batch of 4: the priors alone (deterministic: drafts
    are verified) and the measured step costs (whatever it chooses, the tokens are the same)."""

    def reqs(s: Scheduler) -> None:
        for k in range(4):
            ids = (prompt(k, 9) * 6)[:50] if k % 2 == 0 else prompt(k, 30)
            s.handle(gen(f"n{k}", ids, max_new_tokens=24))

    off = make_scheduler()
    reqs(off)
    want = ids_of(run_all(off))
    on = make_scheduler(speculative_algorithm="NGRAM")  # NOTE: the same runner: one at a time
    rows: list[int] = []
    forward = on.runner.forward

    class Recording:  # the verify forwards' row counts (the CPU row budget holds)
        def __getattr__(self, name: str) -> Any:
            return getattr(on.runner, name)

        def forward(self, fb: Any) -> Any:
            rows.append(int(fb.input_ids.shape[0]))
            return forward(fb)

    on.spec.runner = Recording()
    on.spec.gate = DraftGate(measure=measure, max_rows=16)
    reqs(on)
    assert ids_of(run_all(on)) == want
    assert rows and max(rows) <= on.spec.gate.max_rows == 16
    assert on.stats["spec_verify_steps"] > 0
    if not measure:  # NOTE: the cost priors: deterministic, and drafts pay under them
        assert on.stats["spec_draft_tokens"] > 0


def test_stops_and_lengths_inside_committed_tokens(plain) -> None:
    """Stop ids (with and without a pending min_new_tokens) and max_new_tokens fall inside a
    step's committed run: nothing past them is kept, as in the plain run."""
    ref = plain["r3"]
    cases = {
        "stop": {"stop_token_ids": [ref[6]]},
        "min": {"stop_token_ids": [ref[2]], "min_new_tokens": 5},
        "short": {"max_new_tokens": 7},
    }

    def run(spec: bool) -> dict[str, list[int]]:
        s = make_scheduler(**({"speculative_algorithm": "NGRAM"} if spec else {}))
        if spec:
            every_draft(s)
            s.spec.proposer = Scripted({k: ref for k in cases}, 8, {})
        for rid, extra in cases.items():
            s.handle(gen(rid, REQS[3][1], **{"max_new_tokens": REQS[3][2], **extra}))
        return ids_of(run_all(s))

    off, on = run(False), run(True)
    assert on == off
    assert on["stop"] == ref[: ref.index(ref[6]) + 1] and len(on["short"]) == 7


def test_logprobs(plain) -> None:
    def run(spec: bool) -> dict[str, io.ReqOut]:
        s = make_scheduler(**({"speculative_algorithm": "NGRAM"} if spec else {}))
        if spec:
            every_draft(s)
            s.spec.proposer = Scripted(plain, 5, {"r1": 2})
        for rid, ids, max_new in REQS[:3]:
            s.handle(gen(rid, ids, max_new_tokens=max_new, return_logprob=True,
                         top_logprobs_num=2))  # fmt: skip
        return run_all(s)

    off, on = run(False), run(True)
    for rid, o in off.items():
        assert on[rid].new_ids == o.new_ids == plain[rid]
        assert len(on[rid].output_logprobs) == len(o.new_ids)
        assert on[rid].output_logprobs == pytest.approx(o.output_logprobs, abs=1e-4)
        for a, b in zip(on[rid].output_top, o.output_top):
            assert [t for _, t in a] == [t for _, t in b]
            assert [v for v, _ in a] == pytest.approx([v for v, _ in b], abs=1e-4)


def test_tiny_pool_retracts(plain) -> None:
    """A pool too small for every request at once: requests are retracted (speculation on too)
    and resumed; draft slots never make a step fail."""
    s = make_scheduler(max_total_tokens=160, schedule_conservativeness=0.01,
                       speculative_algorithm="NGRAM")  # fmt: skip
    every_draft(s)
    s.spec.proposer = Scripted(plain, 8, {"r2": 2})
    submit(s)
    assert ids_of(run_all(s)) == plain
    assert s.stats["retracted"] > 0


def test_chunked_prefill(plain) -> None:
    s = make_scheduler(chunked_prefill_size=16, speculative_algorithm="NGRAM")
    every_draft(s)
    s.spec.proposer = Scripted(plain, 4, {"r0": 1})
    submit(s)
    assert ids_of(run_all(s)) == plain


def test_multi_turn_cache_hits_do_not_drop() -> None:
    """Each turn's prompt is the previous prompt + its answer + a new message: the cached tokens
    with speculation on equal those with it off (accepted tokens entered the radix cache)."""

    def run(spec: bool) -> tuple[list[int], list[list[int]]]:
        s = make_scheduler(**({"speculative_algorithm": "NGRAM"} if spec else {}))
        cached, answers = [], []
        for conv in range(3):
            history = (prompt(conv, 8) * 4)[:30]
            for turn in range(3):
                s.handle(gen(f"c{conv}t{turn}", history, max_new_tokens=12))
                out = run_all(s)[f"c{conv}t{turn}"]
                cached.append(out.cached_tokens)
                answers.append(out.new_ids)
                history = history + out.new_ids + prompt(turn + 10, 5)
        return cached, answers

    (c_off, a_off), (c_on, a_on) = run(False), run(True)
    assert a_on == a_off
    assert c_on == c_off and sum(c_on) > 0


def test_sampling_keeps_the_target_distribution() -> None:
    """Temperature 1 with top-k and top-p through the real step: the first two output tokens'
    joint frequencies against the model's own probabilities (χ²). The first is sampled by the
    prefill, the second by a verify step whose draft is one fixed token (accepted or not; the
    third token, committed by the same step when the draft is accepted, is not counted)."""
    s = make_scheduler(speculative_algorithm="NGRAM", max_running_requests=128)
    with torch.no_grad():  # NOTE: this test's own runner: sharper (far from uniform) distributions
        s.runner.model.lm_head.weight.mul_(30.0)
    ids = prompt(3, 12)
    sp = {"temperature": 1.0, "top_k": 4, "top_p": 0.8, "max_new_tokens": 3}
    probs_first = _filtered(s, ids, sp)
    firsts = torch.nonzero(probs_first).flatten().tolist()
    seconds = {t: _filtered(s, [*ids, t], sp) for t in firsts}
    likely = {t: int(p.argmax()) for t, p in seconds.items()}

    class Fixed(Proposer):
        kind, num_nodes = DraftKind.DETERMINISTIC, 2

        def propose(self, reqs: Sequence[Any]) -> DraftTree:
            toks = [[r.last_token, likely.get(r.last_token, 0)] for r in reqs]
            return DraftTree(torch.tensor(toks), torch.tensor([[-1, 0]] * len(reqs)), None,
                             self.kind)  # fmt: skip

    every_draft(s)
    s.spec.proposer = Fixed()
    samples = 3000
    for k in range(samples):
        s.handle(gen(f"s{k}", ids, seed=k, **sp))
    outs = run_all(s)
    counts = Counter(tuple(o.new_ids[:2]) for o in outs.values())
    assert s.stats["spec_draft_tokens"] >= samples
    expected = {(a, b): float(probs_first[a] * seconds[a][b])
                for a in seconds for b in torch.nonzero(seconds[a]).flatten().tolist()}  # fmt: skip
    assert set(counts) <= set(expected)
    chi2 = sum((counts.get(c, 0) - samples * p) ** 2 / (samples * p) for c, p in expected.items())
    dof = len(expected) - 1
    # NOTE: a fixed seed per request: deterministic; the bound is the 0.1 % tail (Wilson-Hilferty).
    z = 3.09
    bound = dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3
    assert chi2 < bound, (chi2, bound, counts, expected)


def _filtered(s: Scheduler, ids: list[int], sp: dict[str, Any]) -> torch.Tensor:
    """The next-token distribution after `ids`: softmax at temperature 1, top-k, then top-p
    (the smallest most-likely set reaching top_p), renormalised. Independent of the sampler."""
    from tests_helpers import runner_logits

    logits = runner_logits(s.runner, ids)[-1].double()
    p = torch.softmax(logits / sp["temperature"], -1)
    vals, order = p.sort(descending=True)
    keep = torch.zeros_like(vals, dtype=torch.bool)
    keep[: sp["top_k"]] = True
    keep &= (vals.cumsum(0) - vals) <= sp["top_p"]
    out = torch.zeros_like(p)
    out[order[keep]] = vals[keep]
    return out / out.sum()


def test_triton_attention_backend(plain) -> None:
    """The step on the Triton attention backend (its tree-mask verify kernel; in Triton's
    interpreter on CPU): the same tokens as its own plain decoding."""
    reqs = REQS[:2]

    def run(spec: bool) -> dict[str, list[int]]:
        s = make_scheduler(attention_backend="triton",
                           **({"speculative_algorithm": "NGRAM"} if spec else {}))  # fmt: skip
        if spec:
            every_draft(s)
            s.spec.proposer = Scripted(plain, 4, {"r1": 1}, tree=True)
        for rid, ids, _ in reqs:
            s.handle(gen(rid, ids, max_new_tokens=6))
        out = ids_of(run_all(s))
        assert not spec or s.stats["spec_draft_tokens"] > 0
        return out

    assert run(True) == run(False)


def test_no_gain_runs_the_plain_step_without_proposing(plain) -> None:
    """When the gate's cost model says no draft can pay (verify rows far dearer than a plain
    step), the step is the plain decode step: nothing proposed, nothing verified, same tokens."""

    class Dear:
        def record(self, verify: bool, rows: int, seconds: float) -> None: ...

        def plain(self, rows: int) -> float:
            return 1.0

        def verify(self, rows: int) -> float:
            return 100.0

        def verify_curve(self, first: int, count: int) -> list[float]:
            return [self.verify(r) for r in range(first, first + count)]

    s = make_scheduler(speculative_algorithm="NGRAM")
    assert s.spec is not None
    s.spec.gate.costs = Dear()  # type: ignore[assignment]
    proposed: list[int] = []
    propose = s.spec.proposer.propose
    s.spec.proposer.propose = lambda reqs: proposed.append(len(reqs)) or propose(reqs)  # type: ignore[method-assign]
    submit(s)
    assert ids_of(run_all(s)) == plain
    assert proposed == [] and s.stats["spec_draft_tokens"] == 0
