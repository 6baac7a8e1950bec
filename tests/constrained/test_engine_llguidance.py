"""The llguidance backend end to end on the default model (Engine API): the constrained corpus
with jump-forward on and off, recursive schemas and ECMA patterns and ebnf grammars sampled at
temperature 0.8 over 8 seeds, each output checked by json.loads + jsonschema (format checks) or
the `lark` oracle. KV accounting is checked when the engines are released."""

from __future__ import annotations

import json

import pytest
from constrained.corpus import CASES, chat, check
from constrained.test_llguidance import TREE

from radixlm.bench.grammar_corpus import GRAMMARS

SEEDS = range(8)
TEMPERATURE = 0.8
LLG = {"grammar_backend": "llguidance"}
LLG_NO_JUMP = {"grammar_backend": "llguidance", "disable_jump_forward": True}


@pytest.fixture(scope="module")
def llg_engine():
    from tests_helpers import get_engine, release_engine

    yield get_engine(**LLG)
    release_engine(**LLG)


def run_corpus(engine) -> int:
    before = engine.get_server_info()["jump_forward"]
    outs = engine.generate([c.prompt for c in CASES], [c.params() for c in CASES])
    cut = []
    for case, out in zip(CASES, outs):
        if out["meta_info"]["finish_reason"]["type"] == "stop":
            check(case, out["text"])
        else:
            cut.append((case.name, out["text"][-60:]))
    # NOTE: llguidance spells forced text with canonical tokens only, so greedy decoding takes
    # other paths than on the outlines backend; a path may run long (e.g. a 64-character email
    # local part) and stop at max_new_tokens. Every output that finishes is valid.
    assert len(cut) <= 2, cut
    return engine.get_server_info()["jump_forward"] - before


def test_corpus_valid_with_jump_forward(llg_engine):
    assert run_corpus(llg_engine) > 0


def test_corpus_valid_without_jump_forward():
    from tests_helpers import get_engine, release_engine

    try:
        assert run_corpus(get_engine(**LLG_NO_JUMP)) == 0
    finally:
        release_engine(**LLG_NO_JUMP)


def sample(engine, prompt: str, kind: str, value: str, max_new_tokens: int = 160) -> list[dict]:
    params = [
        {"max_new_tokens": max_new_tokens, "temperature": TEMPERATURE, "seed": s, kind: value}
        for s in SEEDS
    ]
    return engine.generate([prompt] * len(params), params)


def finished(outs: list[dict]) -> list[str]:
    texts = [o["text"] for o in outs if o["meta_info"]["finish_reason"]["type"] == "stop"]
    # NOTE: a recursive language lets the small model nest deeper than the token budget; those
    # outputs stop at max_new_tokens. Every output that finishes must be valid.
    assert texts, [o["meta_info"]["finish_reason"] for o in outs]
    return texts


@pytest.mark.parametrize(
    "schema",
    [
        TREE,
        {
            "type": "object",
            "properties": {
                "word": {"type": "string", "pattern": "^[\\u00e9\\u00e8a-z]{2,6}$"},
                "code": {"type": "string", "pattern": "^\\d{3}-[A-Z]{2}$"},
            },
            "required": ["word", "code"],
        },
    ],
    ids=["tree", "ecma_patterns"],
)
def test_schemas_at_temperature(llg_engine, schema):
    import jsonschema

    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    prompt = chat(f"Answer with JSON matching this schema: {json.dumps(schema)}")
    for text in finished(sample(llg_engine, prompt, "json_schema", json.dumps(schema))):
        jsonschema.validate(json.loads(text), schema, format_checker=checker)


@pytest.mark.parametrize(
    "name", ["arithmetic", "arithmetic_gbnf", "lisp", "tool_call", "json_gbnf", "sql_select"]
)
def test_ebnf_at_temperature(llg_engine, name):
    case = next(c for c in GRAMMARS if c.name == name)
    for text in finished(sample(llg_engine, chat(case.question), "ebnf", case.text)):
        assert case.parses(text), (name, text)
