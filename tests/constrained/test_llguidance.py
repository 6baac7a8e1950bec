"""The llguidance backend without the model: recursive schemas, ECMA-262 patterns, keyword errors
with JSON pointers, ebnf in both syntaxes, `rollback(k)` on both backends (the masks after a
rollback equal the masks seen before), and the first mask computed by the compile step."""

from __future__ import annotations

import json
import random
import re

import pytest
from constrained.corpus import TREE
from constrained.helpers import BACKENDS, EOS, allowed_ids, make_compiler, tokenizer
from constrained.test_compile_walks import random_walk

from radixlm.runtime.constrained import GrammarSpec
from radixlm.runtime.constrained.llguidance_backend import LLGuidanceGrammar
from radixlm.runtime.constrained.llguidance_specs import spec_to_llguidance
from radixlm.runtime.errors import GrammarError

LINKED_LIST = {
    "$defs": {
        "cell": {
            "type": "object",
            "properties": {
                "value": {"type": "integer"},
                "next": {"anyOf": [{"$ref": "#/$defs/cell"}, {"type": "null"}]},
            },
            "required": ["value", "next"],
        }
    },
    "$ref": "#/$defs/cell",
}


@pytest.fixture(scope="module")
def llg():
    return make_compiler(backend="llguidance")


def walk_many(compiler, spec, seeds: int = 8, steps: int = 600) -> list[str]:
    outs = []
    for seed in range(seeds):
        out = random_walk(compiler.compile(spec), compiler.vocab, random.Random(seed), steps)
        if out is not None:
            outs.append(out)
    return outs


@pytest.mark.parametrize("schema", [TREE, LINKED_LIST], ids=["tree", "linked_list"])
def test_recursive_schemas_walk_to_valid_json(llg, schema):
    import jsonschema

    outs = walk_many(llg, GrammarSpec("json_schema", json.dumps(schema)))
    assert len(outs) >= 4
    for out in outs:
        jsonschema.validate(json.loads(out), schema)
    assert any(out.count("{") >= 2 for out in outs)  # the recursion is really taken


def test_trailing_comma_and_missing_property_are_never_allowed(llg):
    """The held-out failure of issue 23: `{ "name" : "Ava_3", }` must be impossible."""
    grammar = llg.compile(GrammarSpec("json_schema", json.dumps(TREE)))
    for t in tokenizer().encode('{"name": "Ava_3"', add_special_tokens=False):
        assert grammar.accept(t)
    allowed = allowed_ids(grammar).nonzero().flatten().tolist()
    texts = {llg.vocab.token_bytes[t] for t in allowed if t != EOS}
    assert not any(b.lstrip().startswith(b"}") for b in texts if b)
    assert EOS not in allowed


@pytest.mark.parametrize(
    ("pattern", "good", "bad"),
    [
        (r"^[\u00e9\u00e8a-z]{2,6}$", "éte", "Ete"),
        (r"^\d{3}-\d{2}$", "123-45", "١٢٣-45"),
        (r"^[A-Z]\w{1,5}$", "Ab_1", "ab"),
        (r"^\u0041[\s]?[^\d]$", "A x", "A 1"),
    ],
)
def test_ecma_patterns(llg, pattern, good, bad):
    schema = {"type": "string", "pattern": pattern}
    spec = GrammarSpec("json_schema", json.dumps(schema))
    for text, ok in ((good, True), (bad, False)):
        grammar = llg.compile(spec)
        ids = tokenizer().encode(json.dumps(text, ensure_ascii=False), add_special_tokens=False)
        accepted = all(grammar.accept(t) for t in ids) and EOS in allowed_ids(grammar).nonzero()
        assert bool(accepted) == ok, (pattern, text)
    import jsonschema

    for out in walk_many(llg, spec):
        jsonschema.validate(json.loads(out), schema)
        assert re.search(pattern, json.loads(out), re.ASCII) or r"\s" in pattern


def test_regex_with_unicode_escapes_is_accepted(llg):
    for out in walk_many(llg, GrammarSpec("regex", r"[\u00e9\u00e8a-z]{2,6}")):
        assert re.fullmatch("[éèa-z]{2,6}", out)


@pytest.mark.parametrize(
    ("schema", "needles"),
    [
        ({"type": "array", "uniqueItems": True}, ["'uniqueItems'", "at /uniqueItems"]),
        (
            {"type": "object", "properties": {"a": {"if": {"type": "string"}, "then": {}}}},
            ["'if'", "/properties/a/if", "'then'"],
        ),
        (
            {"properties": {"not": {"type": "string", "format": "no-such-format"}}},
            ["'no-such-format'", "/properties/not/format"],
        ),
        ({"type": "object", "propertyNames": {"maxLength": 3}}, ["'propertyNames'", "at /"]),
    ],
)
def test_unsupported_keywords_named_with_pointer(llg, schema, needles):
    with pytest.raises(GrammarError) as info:
        llg.validate(GrammarSpec("json_schema", json.dumps(schema)))
    for needle in needles:
        assert needle in str(info.value), str(info.value)


# docs/constrained.md, "What it rejects" (llguidance): each refused by name before decoding
LLG_REJECTED = [
    ({"not": {"type": "string"}}, "'not' at /not"),
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "oneOf"),  # branches can overlap
    (
        {"type": "object", "properties": {"a": {}}, "additionalProperties": True,
         "minProperties": 2},
        "min/maxProperties",
    ),
    ({"$ref": "http://example.com/schema.json"}, "http://example.com/schema.json"),
    (
        {"type": "object", "properties": {f"k{i}": {"type": "integer"} for i in range(20000)}},
        "schema too large",
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    ("schema", "needle"),
    LLG_REJECTED,
    ids=["not", "oneOf", "minProperties", "remote_ref", "too_large"],
)
def test_documented_llguidance_rejections(llg, schema, needle):
    spec = GrammarSpec("json_schema", json.dumps(schema))
    with pytest.raises(GrammarError) as info:
        llg.validate(spec)
        llg.compile(spec)
    assert needle in str(info.value), str(info.value)


def test_min_max_properties_of_a_closed_object_are_enforced(llg):
    """Where the object is closed (radixlm adds `additionalProperties: false` to a schema that
    lists `properties`), llguidance takes min/maxProperties even when some key is optional."""
    import jsonschema

    for bounds in ({"minProperties": 1}, {"maxProperties": 1}):
        schema = {"type": "object", "properties": {"a": {"type": "integer"},
                  "b": {"type": "integer"}}, **bounds}  # fmt: skip
        outs = walk_many(llg, GrammarSpec("json_schema", json.dumps(schema)), seeds=16, steps=200)
        assert len(outs) >= 12
        for out in outs:
            jsonschema.validate(json.loads(out), schema)


def test_keyword_as_property_name_is_not_reported(llg):
    from radixlm.runtime.constrained.llguidance_specs import keyword_pointers

    schema = {"properties": {"if": {"type": "string"}}, "$defs": {"x": {"if": {}}}}
    assert keyword_pointers(schema, "if") == ["/$defs/x/if"]


@pytest.mark.parametrize(
    ("text", "good", "bad"),
    [
        ('root ::= "(" [0-9]+ ")" | "x"', "(12)", "(1"),
        ('start: "(" NUM ")" | "x"\nNUM: /[0-9]+/', "(12)", "(a)"),
    ],
    ids=["gbnf", "lark"],
)
def test_ebnf_both_syntaxes(llg, text, good, bad):
    spec = GrammarSpec("ebnf", text)
    for sample, ok in ((good, True), (bad, False)):
        grammar = llg.compile(spec)
        ids = tokenizer().encode(sample, add_special_tokens=False)
        accepted = all(grammar.accept(t) for t in ids) and bool(allowed_ids(grammar)[EOS])
        assert accepted == ok, (text, sample)


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        (GrammarSpec("ebnf", "root ::= missing"), "invalid ebnf grammar"),
        (GrammarSpec("ebnf", "start: x"), "cannot compile ebnf"),
        (GrammarSpec("regex", "(abc"), "invalid regex '(abc': missing ), unterminated subpattern"),
        (GrammarSpec("regex", "a(?=b)"), "unsupported regex feature in 'a(?=b)': look-around"),
        (GrammarSpec("json_schema", "{not json"), "not valid JSON"),
        (GrammarSpec("choices", ("a", "")), "choices"),
    ],
)
def test_bad_specs_rejected_by_name(llg, spec, needle):
    with pytest.raises(GrammarError, match=re.escape(needle)):
        llg.validate(spec)


@pytest.mark.parametrize("backend", BACKENDS)
def test_rollback_restores_masks(backend):
    compiler = make_compiler(backend=backend)
    spec = GrammarSpec("regex", r'\{"name": "[a-z]{1,8}", "age": [0-9]{1,2}\}')
    grammar = compiler.compile(spec)
    ids = tokenizer().encode('{"name": "bob", "age": 42}', add_special_tokens=False)
    masks = [allowed_ids(grammar)]
    for t in ids:
        assert grammar.accept(t)
        masks.append(allowed_ids(grammar))
    assert grammar.accept(EOS) and grammar.is_terminated()
    grammar.rollback(1)  # the EOS
    assert grammar.num_accepted == len(ids) and bool(allowed_ids(grammar)[EOS])
    for k in (1, 3, 2):
        grammar.rollback(k)
        n = grammar.num_accepted
        assert torch_equal(allowed_ids(grammar), masks[n]), (backend, k, n)
    assert grammar.num_accepted == len(ids) - 6
    for t in ids[grammar.num_accepted :]:  # the same tokens are accepted again
        assert grammar.accept(t)
    assert torch_equal(allowed_ids(grammar), masks[-1])
    with pytest.raises(ValueError):
        grammar.rollback(len(ids) + 1)
    copy = grammar.copy()
    copy.rollback(2)
    assert grammar.num_accepted == len(ids) and copy.num_accepted == len(ids) - 2


def torch_equal(a, b) -> bool:
    return bool((a == b).all())


def test_bytes_tokenizer_fallback_gives_the_same_masks(llg):
    """A tokenizer llguidance cannot read directly (not a fast one) is described by its token
    bytes; the masks are the same as through `llguidance.hf`."""
    from radixlm.runtime.constrained.llguidance_backend import _lltokenizer_from_bytes

    other = make_compiler(backend="llguidance")
    other._lltok = _lltokenizer_from_bytes(tokenizer(), llg.vocab_size, llg.eos_ids)
    spec = GrammarSpec("regex", r'\{"name": "[a-zé]{1,8}"\}')
    ga, gb = llg.compile(spec), other.compile(spec)
    for t in [*tokenizer().encode('{"name": "b', add_special_tokens=False), None]:
        assert torch_equal(allowed_ids(ga), allowed_ids(gb))
        if t is not None:
            assert ga.accept(t) and gb.accept(t)


def test_template_first_mask_is_computed_at_compile(llg):
    """The compile step computes the template's first mask (off the decode path): a request's
    copy starts from it, and its masks are those of a matcher that never saw the warm-up."""
    import llguidance

    spec = GrammarSpec("json_schema", json.dumps(TREE))
    grammar = llg.compile(spec)
    fresh = LLGuidanceGrammar(
        llguidance.LLMatcher(llg.lltokenizer, spec_to_llguidance(spec), log_level=0), (EOS,)
    )
    for token in tokenizer().encode('{"name": "a", "children": [', add_special_tokens=False):
        assert allowed_ids(grammar).tolist() == allowed_ids(fresh).tolist()
        assert grammar.accept(token) and fresh.accept(token)
    assert allowed_ids(grammar).tolist() == allowed_ids(fresh).tolist()


def test_unreachable_grammar_fails_at_compile(llg):
    # NOTE: byte 0x04 is no token's text: the first mask is empty, found by the compile step.
    with pytest.raises(GrammarError, match="no token of the model's vocabulary can start"):
        llg.compile(GrammarSpec("regex", "\x04"))
