"""Spec -> regex without the model: numeric ranges (against Python's arithmetic), the schema
rewrite (every unsupported feature is named), choices escaping, regex validation messages."""

from __future__ import annotations

import json
import re
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixlm.runtime.constrained import GrammarSpec, check_spec, spec_to_regex
from radixlm.runtime.constrained.num_range import integer_regex, number_regex
from radixlm.runtime.errors import GrammarError

bound = st.one_of(st.none(), st.integers(-5000, 5000))


@settings(max_examples=150, deadline=None)
@given(bound, bound, st.integers(-6000, 6000))
def test_integer_range_regex(lo, hi, n):
    if lo is not None and hi is not None and lo > hi:
        lo, hi = hi, lo
    rx = re.compile(integer_regex(lo, hi))
    inside = (lo is None or n >= lo) and (hi is None or n <= hi)
    assert bool(rx.fullmatch(str(n))) == inside
    assert not rx.fullmatch("-0") and not rx.fullmatch("01")


NUMBER_SCHEMAS = [
    {"minimum": 0, "maximum": 1},
    {"minimum": -5, "exclusiveMaximum": 3},
    {"exclusiveMinimum": 0},
    {"exclusiveMinimum": -2, "maximum": -1},
    {"maximum": 10},
    {"exclusiveMinimum": 1, "exclusiveMaximum": 2},
    {},
]


@pytest.mark.parametrize("schema", NUMBER_SCHEMAS, ids=str)
def test_number_range_regex(schema):
    rx = re.compile(number_regex(schema))
    for i in range(-40, 40):
        for frac in ("", ".0", ".5", ".05", ".999", ".10"):
            text = f"{i}{frac}"
            v = Fraction(text)
            ok = (
                v >= schema.get("minimum", v)
                and v <= schema.get("maximum", v)
                and ("exclusiveMinimum" not in schema or v > schema["exclusiveMinimum"])
                and ("exclusiveMaximum" not in schema or v < schema["exclusiveMaximum"])
            )
            canonical = not (frac.endswith("0") or (text.startswith("-0") and v == 0))
            if rx.fullmatch(text):
                assert ok, (schema, text)
            else:  # the regex may skip non-canonical spellings only
                assert not (ok and canonical), (schema, text)


def schema_spec(schema) -> GrammarSpec:
    return GrammarSpec("json_schema", json.dumps(schema))


REJECTED = [
    ({"type": "integer", "multipleOf": 2}, "'multipleOf' at /"),
    (
        {"type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}},
        "'uniqueItems' at /properties/a",
    ),
    ({"type": "object", "minProperties": 1}, "minProperties"),
    ({"type": "object", "patternProperties": {"^x": {}}}, "patternProperties"),
    ({"if": {"type": "string"}, "then": {"maxLength": 2}}, "'if'"),
    ({"allOf": [{"type": "object"}, {"required": ["a"]}]}, "allOf with several schemas"),
    (
        {"type": "object", "properties": {"a": {}}, "anyOf": [{"required": ["a"]}]},
        "'anyOf' combined with",
    ),
    ({"type": "string", "pattern": "[a-z]+", "maxLength": 3}, "pattern with ['maxLength']"),
    ({"type": "string", "format": "date", "maxLength": 3}, "format 'date' with"),
    ({"type": "string", "format": "ipv6"}, "format 'ipv6'"),
    ({"type": "string", "pattern": "a(?=b)"}, "look-around"),
    ({"type": "object", "properties": {'a"b': {}}}, "needs escaping"),
    ({"type": "object", "properties": {"a": {}}, "required": ["b"]}, "required ['b'] not listed"),
    ({"type": "number", "maximum": 2.5}, "maximum 2.5"),
    ({"type": "integer", "minimum": 5, "maximum": 1}, "integer bounds"),
    ({"$ref": "other.json#/x"}, "remote $ref"),
    ({"type": "object", "properties": {"a": False}}, "is `false`"),
    ({"type": "array", "prefixItems": [{}], "minItems": 2}, "prefixItems with"),
    ({"type": "foo"}, "invalid JSON schema"),
    ({"type": "string", "minLength": -1}, "invalid JSON schema"),
]


@pytest.mark.parametrize(("schema", "needle"), REJECTED, ids=lambda x: str(x)[:40])
def test_unsupported_schema_features_are_named(schema, needle):
    with pytest.raises(GrammarError) as info:
        check_spec(schema_spec(schema))
    assert needle in str(info.value)


def test_bad_json_and_non_schema():
    with pytest.raises(GrammarError, match="not valid JSON"):
        check_spec(GrammarSpec("json_schema", "{"))
    with pytest.raises(GrammarError, match="must be a JSON object"):
        check_spec(GrammarSpec("json_schema", "[1]"))


def test_rewritten_schemas_keep_semantics():
    rx = spec_to_regex(
        schema_spec(
            {
                "type": "object",
                "properties": {"n": {"type": "integer", "minimum": 3, "maximum": 7}},
                "required": ["n"],
            }
        )
    )
    assert re.fullmatch(rx, '{"n": 5}') and not re.fullmatch(rx, '{"n": 8}')
    rx = spec_to_regex(schema_spec({"type": "string", "format": "date"}))
    assert re.fullmatch(rx, '"2024-02-28"') and not re.fullmatch(rx, '"2024-02-30"')
    rx = spec_to_regex(schema_spec({"type": "object", "additionalProperties": False}))
    assert re.fullmatch(rx, "{}")
    assert spec_to_regex(schema_spec(True))  # `true` accepts any JSON value


@pytest.mark.parametrize(
    ("pattern", "needle"),
    [("(a", "invalid regex"), ("[z-a]", "invalid regex"), ("a{2,1}", "invalid regex"),
     (r"(a)\1", "unsupported regex feature"), ("(?<=a)b", "look-around"), (r"\p{L}", "unsupported")],
)  # fmt: skip
def test_regex_validation(pattern, needle):
    with pytest.raises(GrammarError) as info:
        check_spec(GrammarSpec("regex", pattern))
    assert needle in str(info.value) and info.value.field == "regex"


def test_choices_are_escaped_literals():
    choices = ("a.b", "C++", "(x|y)", "[z]", "^$", "100%", "日本")
    rx = spec_to_regex(GrammarSpec("choices", choices))
    for c in choices:
        assert re.fullmatch(rx, c)
    assert not re.fullmatch(rx, "aXb") and not re.fullmatch(rx, "x")


def test_ebnf_is_rejected_clearly():
    with pytest.raises(GrammarError, match="ebnf grammars are not supported"):
        check_spec(GrammarSpec("ebnf", "root ::= 'a'"))


# Strings without control characters: JSON would write those as \u escapes (not generated).
json_text = st.text(st.characters(blacklist_categories=("Cc", "Cs")), max_size=8)
json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(10**6), 10**6), json_text)
json_depth2 = st.dictionaries(
    json_text,
    st.one_of(
        json_scalars,
        st.lists(json_scalars, max_size=3),
        st.dictionaries(json_text, json_scalars, max_size=3),
    ),
    max_size=4,
)


@settings(max_examples=150, deadline=None)
@given(json_depth2)
def test_any_object_regex_accepts_json_objects_nested_twice(doc):
    rx = re.compile(spec_to_regex(GrammarSpec("json_schema", json.dumps({"type": "object"}))))
    for separators in ((", ", ": "), (",", ":")):
        assert rx.fullmatch(json.dumps(doc, separators=separators, ensure_ascii=False))


@pytest.mark.parametrize(
    "text, ok",
    [
        ("{}", True),
        ('{"a": {"b": [1, "x", null]}}', False),  # three levels deep
        ('{"a": [1, {"b": 2}]}', False),
        ('{"a": 1,}', False),
        ("[1, 2]", False),
        ('{"a": 01}', False),
        ('{"a": "\\u00e9"}', False),  # \u escapes are not in outlines-core's string grammar either
    ],
)
def test_any_object_regex_rejects_non_objects_and_deeper_nesting(text, ok):
    rx = re.compile(spec_to_regex(GrammarSpec("json_schema", json.dumps({"type": "object"}))))
    assert bool(rx.fullmatch(text)) == ok


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object"},
        {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
    ],
)
def test_empty_whitespace_pattern_means_compact_json(schema):
    rx = re.compile(spec_to_regex(GrammarSpec("json_schema", json.dumps(schema)), ""))
    assert rx.fullmatch('{"a":1}')
    assert not rx.fullmatch('{"a": 1}') and not rx.fullmatch('{ "a":1}')
