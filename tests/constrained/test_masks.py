"""The token masks agree with a brute-force check over the whole vocabulary: for sampled FSM
states, token t is allowed iff the text so far + t's bytes is a prefix of a string of the language
(decided on interegular's character FSM), and EOS iff the text is a complete string. Both grammar
backends are checked against the same oracle."""

from __future__ import annotations

import random

import pytest
import torch
from constrained.corpus import CASES
from constrained.helpers import BACKENDS, EOS, VOCAB, CharOracle, allowed_ids, make_compiler

REGEX_NAMES = ["date", "ipv4", "email", "unicode_alt", "sentence", "json_regex", "choices_special"]
SCHEMA_NAMES = ["person", "escapes_unicode", "enum_mixed"]
STATES_PER_CASE = 3


@pytest.fixture(scope="module", params=BACKENDS)
def compiler(request):
    return make_compiler(backend=request.param)


def backend_of(compiler) -> str:
    name = type(compiler).__name__
    return next((b for b in ("llguidance", "xgrammar") if b in name.lower()), "outlines")


def _regex_of(name: str) -> str:
    from radixlm.runtime.constrained import GrammarSpec, spec_to_regex

    case = next(c for c in CASES if c.name == name)
    value = case.spec if case.kind != "json_schema" else __import__("json").dumps(case.spec)
    return spec_to_regex(GrammarSpec.from_constraint(case.kind, value))


@pytest.mark.parametrize("name", REGEX_NAMES + SCHEMA_NAMES)
def test_masks_match_brute_force(compiler, name):
    from radixlm.runtime.constrained import GrammarSpec

    regex = _regex_of(name)
    oracle = CharOracle(regex)
    table = compiler.vocab.token_bytes
    rng = random.Random(name)
    for sample in range(STATES_PER_CASE):
        grammar = compiler.compile(GrammarSpec("regex", regex))
        state, pending = oracle.fsm.initial, b""
        for _ in range(rng.randint(0, 3 + 4 * sample)):
            choices = [t for t in allowed_ids(grammar).nonzero().flatten().tolist() if t != EOS]
            if not choices:
                break
            token = rng.choice(choices)
            assert grammar.accept(token)
            walked = oracle.feed(state, pending, table[token])
            assert walked is not None, f"{name}: the mask allowed {table[token]!r}"
            state, pending = walked
        mask = allowed_ids(grammar)
        expected = torch.tensor(
            [oracle.allowed(state, pending, table[t], t == EOS) for t in range(VOCAB)]
        )
        extra = (mask & ~expected).nonzero().flatten().tolist()
        detail = [(t, table[t]) for t in extra[:8]]
        assert not extra, f"{name}: {len(extra)} tokens allowed wrongly, e.g. {detail}"
        missing = (expected & ~mask).nonzero().flatten().tolist()
        # NOTE: where the grammar forces bytes, llguidance allows only the tokens that spell
        # them canonically (a sound subset); everywhere else both backends are exact.
        if missing and backend_of(compiler) == "llguidance":
            assert grammar.jump_forward(), f"{name}: tokens missing where nothing is forced"
            assert mask.any(), f"{name}: nothing allowed in a live state"
        else:
            detail = [(t, table[t]) for t in missing[:8]]
            assert not missing, f"{name}: {len(missing)} tokens disallowed wrongly, e.g. {detail}"
        assert bool(mask[EOS]) == (state in oracle.fsm.finals and not pending)


@pytest.mark.parametrize(
    "name", ["date", "sentence", "choices_special", "person", "escapes_unicode"]
)
def test_allows_agrees_with_the_mask(compiler, name):
    """`Grammar.allows` (the greedy path's one-token check, where a backend has one) says of
    every token exactly what the mask says, EOS included, along walks that run to the end; None
    (the mask decides) is the only other answer."""
    from radixlm.runtime.constrained import GrammarSpec

    rng = random.Random(name)
    grammar = compiler.compile(GrammarSpec("regex", _regex_of(name)))
    answered = 0
    for _ in range(40):
        mask = allowed_ids(grammar).tolist()
        for t in range(VOCAB):
            says = grammar.allows(t)
            if says is not None:
                assert says == mask[t], f"{name}: token {t} {compiler.vocab.token_bytes[t]!r}"
                answered += 1
        choices = [t for t in range(VOCAB) if mask[t] and t != EOS]
        if not choices:
            break
        assert grammar.accept(rng.choice(choices))
    else:
        pytest.fail(f"{name}: the walk did not end")
    assert answered > VOCAB, name  # every backend has a one-token check
