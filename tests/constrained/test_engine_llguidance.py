"""The llguidance backend (the default) end to end on the default model (Engine API): recursive
schemas, ECMA patterns and ebnf grammars sampled at temperature 0.8 over 8 seeds, each output
checked by json.loads + jsonschema (format checks) or the `lark` oracle. The constrained corpus
with jump-forward on and off runs on it in test_engine_constrained.py."""

from __future__ import annotations

import json

import pytest
from constrained.corpus import chat
from constrained.oracles import validate
from constrained.test_llguidance import TREE

from radixlm.bench.grammar_corpus import GRAMMARS

SEEDS = range(8)
TEMPERATURE = 0.8


@pytest.fixture(scope="module")
def llg_engine(engine):
    """llguidance is the default grammar backend: the shared default engine."""
    assert engine.server_args.grammar_backend == "llguidance"
    return engine


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
    prompt = chat(f"Answer with JSON matching this schema: {json.dumps(schema)}")
    for text in finished(sample(llg_engine, prompt, "json_schema", json.dumps(schema))):
        validate(json.loads(text), schema)  # the real format rules (constrained/oracles.py)


@pytest.mark.parametrize(
    "name", ["arithmetic", "arithmetic_gbnf", "lisp", "tool_call", "json_gbnf", "sql_select"]
)
def test_ebnf_at_temperature(llg_engine, name):
    case = next(c for c in GRAMMARS if c.name == name)
    for text in finished(sample(llg_engine, chat(case.question), "ebnf", case.text)):
        assert case.parses(text), (name, text)
