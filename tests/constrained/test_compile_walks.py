"""Every regex and schema of the corpus compiles, and random walks through its token FSM (random
allowed tokens until EOS) always produce a complete string its oracle accepts: the schema
converter and the masks are checked without the model. The compiled indexes are written to a
disk cache that the jump-forward-off engine of test_engine_constrained.py reuses. Both grammar
backends walk the same corpus."""

from __future__ import annotations

import random

import pytest
from constrained.corpus import CASES, check
from constrained.helpers import BACKENDS, EOS, allowed_ids, make_compiler

WALKS = 3
MAX_STEPS = 300


def cache_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.getbasetemp() / "grammar-cache")


@pytest.fixture(scope="module", params=BACKENDS)
def compiler(request, tmp_path_factory):
    return make_compiler(cache_dir(tmp_path_factory), backend=request.param)


def random_walk(grammar, vocab, rng: random.Random, max_steps: int = MAX_STEPS) -> str | None:
    tokens: list[int] = []
    for _ in range(max_steps):
        if grammar.is_terminated():
            break
        allowed = allowed_ids(grammar).nonzero().flatten().tolist()
        assert allowed, "a live state allows some token"
        if EOS in allowed and (len(allowed) == 1 or rng.random() < 0.4):
            break
        # Prefer short tokens half of the time so walks explore structure, not just strings.
        pool = [t for t in allowed if t != EOS]
        if rng.random() < 0.5:
            short = [t for t in pool if len(vocab.token_bytes[t]) == 1]
            pool = short or pool
        token = rng.choice(pool)
        assert grammar.accept(token)
        tokens.append(token)
    else:
        return None
    return vocab.decode_bytes(tokens).decode("utf-8")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_random_walks_are_valid(compiler, case):
    from radixlm.runtime.constrained import GrammarSpec

    kind, value = case.kind, case.spec
    spec = GrammarSpec.from_constraint(
        kind, __import__("json").dumps(value) if kind == "json_schema" else value
    )
    rng = random.Random(case.name)
    done = 0
    for _ in range(WALKS):
        text = random_walk(compiler.compile(spec), compiler.vocab, rng)
        if text is not None:
            check(case, text)
            done += 1
    assert done >= WALKS // 2, f"{case.name}: random walks did not finish"
