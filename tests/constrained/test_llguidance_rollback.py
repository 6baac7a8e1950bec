"""Masks after a rollback that takes another path (speculative draft trees do this) equal the
masks of a grammar that only ever saw that path. llguidance (<= 1.9.1) keeps its last mask keyed
by (lexer state, parser row index) across `rollback`; `LLGuidanceGrammar.rollback` must not let
that entry answer for a different path."""

from __future__ import annotations

import json
import random

import pytest
from constrained.corpus import TREE
from constrained.helpers import EOS, allowed_ids, make_compiler, tokenizer

from radixlm.runtime.constrained import GrammarSpec

# Both branches enter the same lexeme W at the same row index: same key, different parser rows.
TWO_BRANCHES = 'start: "a" W "b" | "c" W "d"\nW: /[xy]+/\n'


@pytest.fixture(scope="module")
def llg():
    return make_compiler(backend="llguidance")


def _ids(text: str) -> list[int]:
    return tokenizer().encode(text, add_special_tokens=False)


def test_rollback_to_another_branch_gives_that_branch_mask(llg):
    spec = GrammarSpec("ebnf", TWO_BRANCHES)
    grammar = llg.compile(spec)
    (a,), (c,), (x,), (b,), (d,) = _ids("a"), _ids("c"), _ids("x"), _ids("b"), _ids("d")
    allowed_ids(grammar)
    assert grammar.accept(a) and grammar.accept(x)
    mask = allowed_ids(grammar)
    assert mask[b] and not mask[d]
    grammar.rollback(2)
    assert grammar.accept(c) and grammar.accept(x)
    mask = allowed_ids(grammar)
    assert mask[d] and not mask[b]


def test_draft_tree_sibling_branches_get_their_own_masks(llg):
    """`check_draft` walks a draft tree by rollback: the mask row of the second branch is its own."""
    import torch

    from radixlm.kernels.token_bitmask import unpack_bitmask
    from radixlm.runtime.speculative.draft_check import check_draft

    grammar = llg.compile(
        GrammarSpec("ebnf", 'start: "q" "q" rest\n' + TWO_BRANCHES.replace("start", "rest"))
    )
    (a,), (c,), (x,), (b,), (d,) = _ids("a"), _ids("c"), _ids("x"), _ids("b"), _ids("d")
    (q,) = _ids("q")
    assert grammar.accept(q) and grammar.accept(q)  # a draft may go as deep as the output
    rows = torch.zeros(5, (llg.vocab_size + 31) // 32, dtype=torch.int32)
    out = check_draft([0, a, c, x, x], [-1, 0, 0, 1, 2], 8, grammar, rows)
    assert out.kept == [0, 1, 2, 3, 4] and grammar.num_accepted == 2
    masks = unpack_bitmask(rows, llg.vocab_size)
    assert masks[3][b] and not masks[3][d]  # after "a x"
    assert masks[4][d] and not masks[4][b]  # after "c x"


def _fresh_mask(llg, spec: GrammarSpec, tokens: list[int]):
    fresh = llg.compile(spec)
    for t in tokens:
        assert fresh.accept(t)
    return allowed_ids(fresh)


SPECS = [
    GrammarSpec("ebnf", TWO_BRANCHES),
    GrammarSpec("json_schema", json.dumps(TREE)),
    GrammarSpec(
        "json_schema",
        json.dumps(
            {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 6},
                    "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}},
                },
                "required": ["name", "tags"],
            }
        ),
    ),
    GrammarSpec("ebnf", 'start: item ("," item)*\nitem: /[a-z]{1,5}/ | /[0-9]{1,3}/\n'),
]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.describe(30))
def test_random_rollbacks_match_fresh_masks(llg, spec):
    """Random walks that roll back 1-4 tokens now and then and go on along another random token
    (chosen from the fresh grammar's mask: no mask is asked of the rolled-back state itself):
    every mask equals the mask of a fresh grammar fed the same tokens."""
    for seed in range(16):
        rng = random.Random(seed)
        grammar = llg.compile(spec)
        tokens: list[int] = []
        rolled_back = False
        for _ in range(40):
            expected = _fresh_mask(llg, spec, tokens)
            if not rolled_back:
                assert bool((allowed_ids(grammar) == expected).all()), (seed, tokens)
            rolled_back = bool(tokens) and rng.random() < 0.35
            if rolled_back:
                k = rng.randint(1, min(4, len(tokens)))
                grammar.rollback(k)
                del tokens[-k:]
                continue
            pool = [t for t in expected.nonzero().flatten().tolist() if t != EOS]
            if not pool or grammar.is_terminated():
                break
            if rng.random() < 0.5:  # short tokens explore the structure
                pool = [t for t in pool if len(llg.vocab.token_bytes[t]) == 1] or pool
            token = rng.choice(pool)
            assert grammar.accept(token)
            tokens.append(token)
