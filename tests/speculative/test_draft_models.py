"""Draft-model proposers (runtime/speculative/draft_worker.py): EAGLE / EAGLE-3 heads loaded from
random checkpoints in their Hugging Face formats and checked against a reference written from
those formats, STANDALONE drafts, the trees they propose, their draft KV, and greedy outputs
token-identical with speculation on and off (a minimal speculative loop, spec_loop.py)."""

from __future__ import annotations

import pytest
import torch
from speculative.draft_heads import (
    AUX_LAYER_IDS,
    TARGET_SEED,
    head_tensors,
    reference_head,
    save_head,
    save_llama,
)
from speculative.spec_loop import (
    extend_batch,
    generate,
    greedy_reference,
    new_reqs,
    prefill,
    verify_step,
)

from radixlm.runtime.errors import InvalidRequestError
from radixlm.runtime.executor.forward_batch import ForwardBatch, ForwardMode
from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.models.loader import resolve_model
from radixlm.runtime.server_args import ServerArgs
from radixlm.runtime.speculative.draft_memory import draft_memory
from radixlm.runtime.speculative.draft_setup import build_draft_proposer

PROMPTS = [[5, 17, 250, 3, 99, 42, 7], [11, 300, 8, 8, 64], [400, 2, 77, 19, 5, 23, 123, 88, 6]]


def build(paths: dict[str, str], algo: str, draft: str, device: str = "cpu", **flags):
    """The target runner and the proposer for `algo` with draft `paths[draft]`."""
    args = ServerArgs(
        model_path=paths["target"], device=device, max_total_tokens=1024, max_running_requests=8,
        num_threads=1,
        speculative_algorithm=algo, speculative_draft_model_path=paths[draft], **flags,
    )  # fmt: skip
    target = ModelRunner(args, resolve_model(paths["target"]))
    return target, build_draft_proposer(args, target)


def _head_forward(runner, ids, feats, positions, prefix: int, row: int, slots) -> torch.Tensor:
    """One request's rows through the draft runner (EXTEND after `prefix` held rows)."""
    n = ids.shape[0]
    t = lambda v: torch.tensor(v, dtype=torch.int64)  # noqa: E731
    runner.req_to_token.write(row, prefix, slots)
    batch = ForwardBatch(
        ForwardMode.EXTEND, 1, ids, positions, slots, t([row]), t([prefix + n]), [prefix + n],
        [prefix], [n], t([prefix]), t([n]), t([0]), t(list(range(n))), list(range(n)),
        spec_features=feats,
    )  # fmt: skip
    return runner.forward(batch)


@pytest.mark.parametrize("kind", ["EAGLE", "EAGLE3"])
def test_head_forward_matches_the_reference(paths, tmp_path, kind) -> None:
    """Every row's logits and next feature equal the reference's, over a prefill of 8 rows and
    one more row attending to them through the draft KV pool."""
    tensors = head_tensors(kind, seed=1)
    target, proposer = build(paths, kind, kind)
    runner, head = proposer.runner, proposer.runner.model
    g = torch.Generator().manual_seed(3)
    n = 9
    ids = torch.randint(0, 512, (n,), generator=g)
    feats = torch.randn(n, head.feature_dim, generator=g)
    if kind == "EAGLE3":  # the last row is a draft step: the head's own H-wide feature
        feats_rows = [feats[: n - 1], torch.randn(1, 64, generator=g)]
    else:
        feats_rows = [feats[: n - 1], feats[n - 1 :]]
    target_tensors = save_llama(str(tmp_path), seed=TARGET_SEED)
    row = runner.req_to_token.alloc()
    slots = runner.kv_pool.allocator.alloc(n)
    first = _head_forward(runner, ids[:-1], feats_rows[0], torch.arange(n - 1), 0, row, slots[:-1])
    last = _head_forward(
        runner, ids[-1:], feats_rows[1], torch.tensor([n - 1]), n - 1, row, slots[-1:]
    )
    if kind == "EAGLE3":  # NOTE: the reference takes H-wide rows as they are: project the rest
        ref_in = torch.cat([feats_rows[0] @ tensors["fc.weight"].T, feats_rows[1]])
    else:
        ref_in = torch.cat(feats_rows)
    ref_logits, ref_next = reference_head(kind, tensors, target_tensors, ids, ref_in)
    for out, rows in ((first, slice(0, n - 1)), (last, slice(n - 1, n))):
        logit_in, nxt = head.split_output(out)
        logits = runner.compute_logits(logit_in)
        assert torch.allclose(logits, ref_logits[rows], atol=1e-4)
        assert torch.allclose(nxt, ref_next[rows], atol=1e-4)
    if kind == "EAGLE3":  # draft ids map to target ids through d2t
        d = torch.arange(128)
        assert torch.equal(head.to_target_ids(d), d + tensors["d2t"])
        assert target.model.capture == tuple(i + 1 for i in AUX_LAYER_IDS)
    else:
        assert target.model.capture == (2,)  # the final normed hidden of the 2-layer target


def test_standalone_self_draft_proposes_the_greedy_continuation(paths) -> None:
    """The target drafting for itself (draft == target): the chain is the target's own greedy
    continuation, every draft is accepted, and the output is plain greedy decoding's."""
    target, proposer = build(paths, "STANDALONE", "self", speculative_num_steps=4)
    reqs = new_reqs(PROMPTS, 16)
    prefill(target, proposer, reqs)
    tree = proposer.propose(reqs)
    assert tree.tokens.shape == (3, 5)
    assert tree.parents.tolist() == [[0, 0, 1, 2, 3]] * 3  # a chain
    ref = greedy_reference(target, [r.fill_ids for r in reqs], 4)
    assert tree.tokens[:, 1:].tolist() == ref
    assert tree.tokens[:, 0].tolist() == [r.fill_ids[-1] for r in reqs]
    outputs, steps = generate(target, proposer, PROMPTS, 21)
    assert outputs == greedy_reference(target, PROMPTS, 21)
    assert all(a == 4 for step in steps for a in step)  # forced acceptance
    _assert_draft_memory_free(proposer)


def _assert_draft_memory_free(proposer) -> None:
    r = proposer.runner
    assert not proposer.states
    assert r.kv_pool.allocator.available() == r.kv_pool.num_slots
    assert r.req_to_token.available() == r.req_to_token.size
    proposer.check_idle()  # what `check_invariants` runs


def test_check_idle_sees_a_leaked_draft_slot(paths) -> None:
    _, proposer = build(paths, "STANDALONE", "small")
    proposer.check_idle()
    slots = proposer.runner.kv_pool.allocator.alloc(1)
    with pytest.raises(AssertionError, match="draft KV leaked"):
        proposer.check_idle()
    proposer.runner.kv_pool.allocator.free(slots)
    proposer.check_idle()


@pytest.mark.parametrize(
    "algo,flags",
    [
        ("STANDALONE", {"speculative_num_steps": 3}),
        ("STANDALONE", {"speculative_num_steps": 3, "speculative_eagle_topk": 3}),
        ("EAGLE", {"speculative_num_steps": 3}),
        ("EAGLE", {"speculative_num_steps": 3, "speculative_eagle_topk": 2}),
        ("EAGLE3", {"speculative_num_steps": 4, "speculative_eagle_topk": 3,
                    "speculative_num_draft_tokens": 10}),
    ],
)  # fmt: skip
def test_greedy_outputs_are_identical_with_speculation(paths, algo, flags) -> None:
    """Random drafts (a small random Llama, random heads): valid trees of the fixed size every
    step (spec_loop checks them), the outputs of plain greedy decoding, the draft KV all given
    back once every request is released."""
    draft = "small" if algo == "STANDALONE" else algo
    target, proposer = build(paths, algo, draft, **flags)
    outputs, steps = generate(target, proposer, PROMPTS, 20)
    assert outputs == greedy_reference(target, PROMPTS, 20)
    full = proposer.shape.num_steps
    mean = sum(map(sum, steps)) / sum(map(len, steps))
    assert mean < full  # a random draft is rejected most of the time
    _assert_draft_memory_free(proposer)


@pytest.mark.parametrize("algo", ["EAGLE", "EAGLE3"])
def test_heads_after_a_cached_prefix_and_chunked_prefill(paths, algo) -> None:
    """The head gets no features for a cached prefix (4 tokens) and the rest in 3 chunks: it
    drafts from what it saw, and the outputs stay plain greedy decoding's."""
    target, proposer = build(paths, algo, algo, speculative_num_steps=3, speculative_eagle_topk=2)
    outputs, _ = generate(target, proposer, PROMPTS, 10, cached=4, chunks=3)
    assert outputs == greedy_reference(target, PROMPTS, 10)
    _assert_draft_memory_free(proposer)


def test_standalone_redraws_after_the_tokens_change(paths) -> None:
    """A rewritten output tail (a jump-forward re-tokenizes it): the draft drops its rows from
    the first changed token and proposes the greedy continuation of the new tokens."""
    target, proposer = build(paths, "STANDALONE", "self", speculative_num_steps=3)
    reqs = new_reqs(PROMPTS[:2], 16)
    prefill(target, proposer, reqs)
    for _ in range(3):
        verify_step(target, proposer, reqs)
    held = proposer.runner.kv_pool.allocator.available()
    req = reqs[0]
    st = proposer.states[req.rid]
    # the draft kept the KV of the accepted nodes it ran: it lacks the new root only
    assert st.num_rows == req.seqlen - 1 and not st.held
    n = len(req.output_ids)
    req.output_ids[n - 6 :] = [301, 302, 303, 304, 305, 306]  # 5 of them in the draft
    tree = proposer.propose([req])
    assert tree.tokens[0, 1:].tolist() == greedy_reference(target, [req.fill_ids], 3)[0]
    assert st.tokens == req.fill_ids and st.all_slots().numel() == req.seqlen
    tree_kv = 3  # the chain's nodes, run by the draft and held until the verify step
    assert len(st.held) == tree_kv
    assert proposer.runner.kv_pool.allocator.available() == held + 5 - 6 - tree_kv
    for r in reqs:
        proposer.release(r)
    _assert_draft_memory_free(proposer)


def test_release_frees_each_requests_draft_kv(paths) -> None:
    target, proposer = build(paths, "STANDALONE", "small", speculative_eagle_topk=2)
    alloc, rows = proposer.runner.kv_pool.allocator, proposer.runner.req_to_token
    reqs = new_reqs(PROMPTS, 8)
    prefill(target, proposer, reqs)
    proposer.propose(reqs)
    # every committed token (the root included) and the proposed nodes the draft ran
    states = [proposer.states[r.rid] for r in reqs]
    held = [len(r.fill_ids) + len(st.held) for r, st in zip(reqs, states)]
    assert all(st.held for st in states)
    assert alloc.available() == alloc.capacity - sum(held)
    assert rows.available() == rows.size - 2 * len(reqs)  # topk rows each
    proposer.release(reqs[1])
    assert alloc.available() == alloc.capacity - held[0] - held[2]
    proposer.release(reqs[1])  # twice: nothing more
    for r in (reqs[0], reqs[2]):
        proposer.release(r)
    _assert_draft_memory_free(proposer)


@pytest.mark.parametrize("kind", ["EAGLE", "EAGLE3"])
def test_heads_named_as_plain_llama_load_as_heads(paths, tmp_path, kind) -> None:
    """The EAGLE authors' checkpoints say `LlamaForCausalLM`: under EAGLE / EAGLE3 they are
    heads, with the same outputs as the same tensors under the head's own name."""
    import json

    save_head(str(tmp_path), kind, seed=1)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(
        json.dumps({**cfg, "architectures": ["LlamaForCausalLM"]})
    )
    _, renamed = build({**paths, "llama": str(tmp_path)}, kind, "llama")
    _, named = build(paths, kind, kind)
    assert type(renamed.runner.model) is type(named.runner.model)
    for a, b in zip(renamed.runner.model.parameters(), named.runner.model.parameters()):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    "kind,drop,match",
    [
        ("EAGLE", "fc.weight", "incomplete"),
        ("EAGLE3", "midlayer.hidden_norm.weight", "incomplete"),
        ("EAGLE3", "d2t", "d2t"),
    ],
)
def test_incomplete_head_checkpoints_are_refused(paths, tmp_path, kind, drop, match) -> None:
    save_head(str(tmp_path), kind, drop=drop)
    with pytest.raises(ValueError, match=match):
        build({**paths, "bad": str(tmp_path)}, kind, "bad")


def test_eagle_head_without_fc_bias_loads(paths, tmp_path) -> None:
    save_head(str(tmp_path), "EAGLE", drop="fc.bias")
    _, proposer = build({**paths, "head": str(tmp_path)}, "EAGLE", "head")
    assert not proposer.runner.model.fc.bias.any()


@pytest.mark.parametrize(
    "algo,draft,match",
    [
        ("EAGLE", "EAGLE3", "needs a LlamaForCausalLMEagle draft head"),
        ("EAGLE3", "small", "is not an EAGLE3 draft head"),  # read as one, its tensors differ
        ("STANDALONE", "EAGLE", "is a draft head"),
        ("STANDALONE", "vocab", "vocabulary"),
    ],
)
def test_drafts_that_do_not_fit_are_refused(paths, tmp_path, algo, draft, match) -> None:
    save_llama(str(tmp_path), seed=1, vocab=256)
    with pytest.raises(InvalidRequestError, match=match) as err:
        build({**paths, "vocab": str(tmp_path)}, algo, draft)
    assert err.value.field == "speculative_draft_model_path"


@pytest.mark.parametrize("algo,draft", [("STANDALONE", "small"), ("EAGLE", "EAGLE"),
                                        ("EAGLE3", "EAGLE3")])  # fmt: skip
def test_draft_memory_estimate(paths, algo, draft) -> None:
    """The GPU sizing's estimate of the draft (ModelRunner._init_memory): its weights' bytes
    within 5 % of the loaded draft's parameters, its KV bytes per token those of its pool."""
    args = ServerArgs(model_path=paths["target"], speculative_algorithm=algo,
                      speculative_draft_model_path=paths[draft])  # fmt: skip
    mem = draft_memory(args, torch.bfloat16, torch.bfloat16)
    _, proposer = build(paths, algo, draft)
    model = proposer.runner.model
    params = sum(
        p.numel() for n, p in model.named_parameters() if "norm" not in n and "bias" not in n
    )
    assert abs(mem.weight_bytes / 2 - params) <= 0.05 * params
    cfg = proposer.runner.config
    assert (
        mem.kv_bytes_per_token
        == 2 * 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim
    )
    assert (
        draft_memory(ServerArgs(speculative_algorithm="NGRAM"), torch.bfloat16, torch.bfloat16)
        is None
    )


@pytest.mark.parametrize("algo,draft", [("STANDALONE", "small"), ("EAGLE", "EAGLE"),
                                        ("EAGLE3", "EAGLE3")])  # fmt: skip
def test_draft_memory_at_tp_counts_the_heads_vocab_copies(paths, algo, draft) -> None:
    """At tp_size > 1 a head reads rank-0 copies of the target's whole embedding and (untied) LM
    head (runtime/distributed/head_parts.py): every rank's pool leaves room for them."""
    target = resolve_model(paths["target"]).config
    bytes_at = {}
    for tp in (1, 2):
        args = ServerArgs(model_path=paths["target"], speculative_algorithm=algo,
                          speculative_draft_model_path=paths[draft], tp_size=tp)  # fmt: skip
        bytes_at[tp] = draft_memory(args, torch.bfloat16, torch.bfloat16, target).weight_bytes
    copies = 0 if algo == "STANDALONE" else 1 + (not target.tie_word_embeddings)
    assert bytes_at[2] - bytes_at[1] == 2 * copies * target.vocab_size * target.hidden_size


def test_target_capture_equals_the_reference_layers(paths, tmp_path) -> None:
    """The target's capture (`set_hidden_capture`) keeps, for every row of a prefill, the inputs
    of the named layers and the final normed state, equal to the dense reference's; off, a
    forward keeps nothing and returns what it returned before."""
    from radixlm.runtime.models.reference import reference_hidden_states

    args = ServerArgs(model_path=paths["target"], max_total_tokens=256, num_threads=1)
    target = ModelRunner(args, resolve_model(paths["target"]))
    ids = PROMPTS[2]
    tensors = save_llama(str(tmp_path), seed=TARGET_SEED)  # the target's own tensors
    ref = reference_hidden_states(tensors, target.config, ids)

    def prefill() -> torch.Tensor:
        row = target.req_to_token.alloc()
        slots = target.kv_pool.allocator.alloc(len(ids))
        try:
            return target.forward(extend_batch(target, [ids], [row], slots))
        finally:
            target.kv_pool.allocator.free(slots)
            target.req_to_token.free(row)

    plain = prefill()
    assert target.take_hidden() is None
    for layers in [(2,), (0, 1, 2), (1, 1, 0)]:
        target.set_hidden_capture(layers)
        out = prefill()
        captured = target.take_hidden()
        assert captured.shape == (len(ids), 64 * len(layers))
        assert torch.allclose(captured, torch.cat([ref[i] for i in layers], -1), atol=1e-4)
        assert torch.allclose(out, plain, atol=1e-5)  # the last row's final state, as before
        assert target.take_hidden() is None  # handed over once
    target.set_hidden_capture(None)
    prefill()
    assert target.take_hidden() is None


@pytest.mark.parametrize("room", [8, 14, 24, 40])
def test_a_full_draft_pool_proposes_less_and_stays_consistent(paths, room) -> None:
    """With only `room` free draft slots (the rest taken), requests whose rows or tree do not fit
    propose their root alone (the trees of those that fit are still drafted): the outputs stay
    plain greedy decoding's and, once the requests are released, every draft slot is free
    again."""
    target, proposer = build(paths, "STANDALONE", "self", speculative_eagle_topk=2)
    alloc = proposer.runner.kv_pool.allocator
    taken = alloc.alloc(alloc.available() - room)
    outputs, steps = generate(target, proposer, PROMPTS, 12)
    assert outputs == greedy_reference(target, PROMPTS, 12)
    if room >= 24:  # the trees of some requests fit: they are drafted (and, self-drafted, accepted)
        assert sum(map(sum, steps)) > 0
    alloc.free(taken)
    _assert_draft_memory_free(proposer)
