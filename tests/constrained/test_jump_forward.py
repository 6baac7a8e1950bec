"""Jump-forward planning on the real tokenizer: the forced string is appended with canonical
re-tokenization, streamed ids are never replaced, the budget is respected, and the grammar ends
in exactly the state of the new ids (both grammar backends)."""

from __future__ import annotations

import pytest
from constrained.helpers import BACKENDS, make_compiler, tokenizer

from radixlm.runtime.constrained import GrammarSpec
from radixlm.runtime.constrained.jump_forward import apply_jump, plan_jump

REGEX = r'\{"name": "[a-z]{1,8}", "city": "[a-z]{1,8}"\}'


@pytest.fixture(scope="module", params=BACKENDS)
def compiler(request):
    return make_compiler(backend=request.param)


def grammar_after(compiler, text: str):
    grammar = compiler.compile(GrammarSpec("regex", REGEX))
    ids = tokenizer().encode(text, add_special_tokens=False) if text else []
    for t in ids:
        assert grammar.accept(t)
    return grammar, ids


def test_forced_prefix_from_the_start(compiler):
    grammar, ids = grammar_after(compiler, "")
    assert grammar.jump_forward() == '{"name": "'
    plan = plan_jump(grammar, ids, compiler.vocab, tokenizer(), 0, 100)
    assert plan is not None and plan.keep == 0
    assert plan.tail == tokenizer().encode('{"name": "', add_special_tokens=False)
    assert apply_jump(grammar, ids, plan)
    assert grammar.num_accepted == len(plan.tail) and grammar.jump_forward() is None


def test_retokenizes_across_the_boundary(compiler):
    grammar, ids = grammar_after(compiler, '{"name": "bob"')
    assert grammar.jump_forward() == ', "city": "'
    tok = tokenizer()
    plan = plan_jump(grammar, ids, compiler.vocab, tok, 0, 100)
    assert plan is not None
    new_ids = ids[: plan.keep] + plan.tail
    assert new_ids == tok.encode('{"name": "bob", "city": "', add_special_tokens=False)
    assert apply_jump(grammar, ids, plan)
    assert grammar.num_accepted == len(new_ids)
    for t in tok.encode('paris"}', add_special_tokens=False):
        assert grammar.accept(t)
    assert grammar.is_terminated()


def test_streamed_ids_are_kept(compiler):
    grammar, ids = grammar_after(compiler, '{"name": "bob"')
    plan = plan_jump(grammar, ids, compiler.vocab, tokenizer(), len(ids), 100)
    assert plan is not None and plan.keep == len(ids)
    got = compiler.vocab.decode_bytes(ids + plan.tail)
    assert got == b'{"name": "bob", "city": "'


def test_budget_and_minimum_gain(compiler):
    grammar, ids = grammar_after(compiler, '{"name": "bob"')
    assert plan_jump(grammar, ids, compiler.vocab, tokenizer(), 0, len(ids) + 1) is None
    plan = plan_jump(grammar, ids, compiler.vocab, tokenizer(), 0, len(ids) + 2)
    assert plan is not None and plan.keep + len(plan.tail) == len(ids) + 2
    grammar, ids = grammar_after(compiler, '{"name": "bo')
    assert grammar.jump_forward() is None  # letters or the closing quote: nothing forced


def test_rejected_tail_restores_the_grammar(compiler):
    from radixlm.runtime.constrained.jump_forward import JumpPlan

    grammar, ids = grammar_after(compiler, '{"name": "bob"')
    forced = grammar.jump_forward()
    bad = JumpPlan(len(ids) - 1, tokenizer().encode("XYZ", add_special_tokens=False))
    assert not apply_jump(grammar, ids, bad)
    assert grammar.num_accepted == len(ids) and grammar.jump_forward() == forced
    for t in tokenizer().encode(', "city": "x"}', add_special_tokens=False):
        assert grammar.accept(t)
    assert grammar.is_terminated()
