"""Constraint promises without the model (issue 29, items 1-7): every schema or regex either
compiles to a regex whose strings are all valid (sampled from Python's reading of the compiled
regex, checked by json.loads + jsonschema with real format rules, or by re.fullmatch), or is
rejected by a GrammarError naming the keyword / construct. The oracles are tested too."""

from __future__ import annotations

import json
import random
import re

import pytest
from constrained.corpus import TREE
from constrained.oracles import FORMAT_CHECKER, check_json, is_email, sample
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from radixlm.runtime.constrained import GrammarSpec, check_spec, spec_to_regex
from radixlm.runtime.errors import GrammarError

SAMPLES = 40


def schema_regex(schema) -> str:
    return spec_to_regex(GrammarSpec("json_schema", json.dumps(schema)))


def assert_schema_outputs_valid(schema, n: int = SAMPLES) -> list:
    regex = schema_regex(schema)
    rng = random.Random(json.dumps(schema))
    return [check_json(sample(regex, rng), schema) for _ in range(n)]


def rejected(spec: GrammarSpec) -> str:
    with pytest.raises(GrammarError) as info:
        check_spec(spec)
    return str(info.value)


# ---- the oracles themselves (issue 28, point 2: format checks that check)

FORMAT_CASES = [
    ("date", "2024-02-29", ["2023-02-29", "2023-02-30", "0000-01-01", "2024-13-01", "x"]),
    ("time", "12:30:00Z", ["12:30:00", "24:00:00Z", "12:30Z", "x"]),
    ("date-time", "2024-01-02T03:04:05+01:00", ["2024-01-02T03:04:05", "2024-01-02 03:04:05Z"]),
    ("uri", "http://x.io/a%20b?q=1#f", ["http://x.io/100%", "http://x.io/%zz", "no scheme"]),
    ("email", "john.doe@mail.com", ["john.doe.@mail.com", ".a@b.io", "a..b@b.io", "a@b", "x"]),
    ("ipv4", "10.0.0.1", ["256.0.0.1", "1.2.3", "01.2.3.4"]),
    ("uuid", "123e4567-e89b-12d3-a456-426614174000", ["123e4567-e89b-12d3-a456", "x"]),
]


@pytest.mark.parametrize(("fmt", "good", "bad"), FORMAT_CASES, ids=lambda x: str(x)[:20])
def test_format_oracle_catches_invalid_values(fmt, good, bad):
    assert FORMAT_CHECKER.conforms(good, fmt)
    for value in bad:
        assert not FORMAT_CHECKER.conforms(value, fmt), (fmt, value)
    assert is_email("a.b+c@x-y.example.org")


# ---- 1. recursive $ref: refused by name, never a wrong regex

LINKED = {
    "type": "object",
    "properties": {
        "val": {"type": "string", "maxLength": 5},
        "next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]},
    },
    "required": ["val", "next"],
}
MUTUAL = {
    "definitions": {
        "a": {"type": "object", "properties": {"b": {"$ref": "#/definitions/b"}}},
        "b": {"type": "array", "items": {"$ref": "#/definitions/a"}},
    },
    "type": "object",
    "properties": {"root": {"$ref": "#/definitions/a"}},
}


@pytest.mark.parametrize(
    ("schema", "where"),
    [
        (LINKED, "'#' at /properties/next/anyOf/0"),
        (TREE, "'#/$defs/node' at /$defs/node/properties/children/items"),
        (MUTUAL, "at /definitions/"),
    ],
    ids=["linked-list", "defs-tree", "mutual"],
)
def test_recursive_ref_is_refused_by_name(schema, where):
    message = rejected(GrammarSpec("json_schema", json.dumps(schema)))
    assert "recursive $ref" in message and where in message, message


def test_shared_non_recursive_refs_still_compile():
    schema = {
        "$defs": {"name": {"type": "string", "maxLength": 4}},
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/name"}, "b": {"$ref": "#/$defs/name"}},
        "required": ["a", "b"],
    }
    assert_schema_outputs_valid(schema)
    assert "anchor" in rejected(GrammarSpec("json_schema", json.dumps({"$ref": "#foo"})))


# ---- 2. type lists go through the same checks and rewrites


@pytest.mark.parametrize(
    "schema",
    [
        {"type": ["string", "null"], "format": "date"},
        {"type": ["string", "null"], "format": "date-time"},
        {"type": ["null", "string"], "format": "time"},
        {"type": ["string", "null"], "pattern": "^[0-9]+$"},
        {"type": ["string", "null"], "maxLength": 3},
        {"type": ["object", "null"]},
        {"type": ["string", "integer"], "maxLength": 2, "minimum": 3, "maximum": 9},
        {"type": ["object", "null"], "properties": {"d": {"type": ["string"], "format": "date"}}},
        {"type": ["array", "string"], "items": {"type": "integer", "maximum": 3}, "maxItems": 2,
         "maxLength": 2},
    ],
    ids=str,
)  # fmt: skip
def test_type_lists_keep_every_keyword(schema):
    assert_schema_outputs_valid(schema)


def test_type_lists_are_checked_like_single_types():
    for schema, needle in [
        ({"type": ["string", "null"], "format": "hostname"}, "format 'hostname' at /"),
        ({"type": ["string", "null"], "pattern": "[0-9]+", "maxLength": 3}, "pattern with"),
        ({"type": ["integer", "null"], "multipleOf": 2}, "'multipleOf'"),
        ({"type": ["string", "null"], "pattern": "a*+"}, "possessive"),
    ]:
        assert needle in rejected(GrammarSpec("json_schema", json.dumps(schema))), schema


# ---- 3. a string pattern constrains the decoded value


@pytest.mark.parametrize(
    "pattern", ["^.{6}$", "^a\\nb$", "^[^a-z]{3}$", "^(?s:.){4}$", "\\W\\S", "^\\s{2}$", 'x"\\\\y']
)
def test_pattern_matches_the_decoded_string(pattern):
    for value in assert_schema_outputs_valid({"type": "string", "pattern": pattern}):
        assert re.search(pattern, value)


# ---- 4. enum / const beside other keywords


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        ({"type": "string", "maxLength": 2, "enum": ["abc", "d"]}, {"d"}),
        ({"type": "integer", "enum": [1, 2.5]}, {1}),
        ({"type": ["integer", "null"], "enum": [1, 2.5, None, "x"]}, {1, None}),
        ({"type": "string", "format": "date", "enum": ["2024-02-30", "2024-02-29"]}, {"2024-02-29"}),
        ({"type": "string", "pattern": "^a", "const": "ab"}, {"ab"}),
        ({"type": "integer", "minimum": 5, "enum": [1, 5, 9], "const": 9}, {9}),
    ],
    ids=str,
)  # fmt: skip
def test_enum_and_const_intersect_their_siblings(schema, expected):
    values = assert_schema_outputs_valid(schema)
    assert set(map(json.dumps, values)) == set(map(json.dumps, expected))


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "integer", "minimum": 5, "const": 1},
        {"type": "string", "maxLength": 1, "enum": ["ab", "cd"]},
        {"type": "integer", "enum": [2.5]},
    ],
)
def test_enum_with_no_value_left_is_refused_by_name(schema):
    message = rejected(GrammarSpec("json_schema", json.dumps(schema)))
    keyword = "const" if "const" in schema else "enum"
    assert f"'{keyword}' at /" in message and "no value" in message, message


# ---- 5. our own format regexes


@pytest.mark.parametrize("fmt", ["date", "time", "date-time", "uri", "email", "ipv4", "uuid"])
def test_format_regexes_only_produce_valid_values(fmt):
    assert_schema_outputs_valid({"type": "string", "format": fmt}, n=300)


@pytest.mark.parametrize(
    ("fmt", "text", "ok"),
    [
        ("uri", "http://x.io/100%", False), ("uri", "http://x.io/%zz", False),
        ("uri", "http://x.io/a%2Fb", True), ("email", "john.doe.@mail.com", False),
        ("email", "john..doe@mail.com", False), ("email", ".j@mail.com", False),
        ("email", "john.doe@mail.com", True), ("date", "0000-01-01", False),
        ("date", "2023-02-29", False), ("date", "2024-02-29", True), ("date", "2000-02-29", True),
        ("date", "1900-02-29", False), ("date", "2023-04-31", False), ("time", "12:00:00", False),
        ("date-time", "2024-01-01T12:00:00", False), ("date-time", "2024-01-01T12:00:00Z", True),
    ],
)  # fmt: skip
def test_format_regex_boundaries(fmt, text, ok):
    regex = schema_regex({"type": "string", "format": fmt})
    assert bool(re.fullmatch(regex, json.dumps(text))) == ok


# ---- 6 and 7. the regex dialect: Python's, or a rejection by name

REFUSED = [
    ("[[:digit:]]{3}", "POSIX"), ("[[:alpha:]]{2}", "POSIX"), ("[a-z&&[^aeiou]]{3}", "intersection"),
    ("[a-z--[aeiou]]{2}", "difference"), ("a*+a", "possessive"), ("a++", "possessive"),
    ("a?+", "possessive"), ("a{2}+", "possessive"), ("(?>ab)", "atomic"),
    ("\\x{e9}", "\\x{...}"), ("\\z", "\\z"), ("\\Qa.b\\E", "\\Q...\\E"), ("(?<n>a)", "(?P<name>"),
    ("\\0", "octal"), ("(?i)ab", "case-insensitive"), ("a\\bc", "word boundaries"),
    ("a^b", "anchors"), ("\\p{L}", "property"), ("(a)\\1", "back-references"),
    ("(?=a)a", "look-around"), ("[^\\s\\S]", "matches nothing"),
]  # fmt: skip


@pytest.mark.parametrize(("pattern", "needle"), REFUSED, ids=lambda x: str(x))
def test_regex_python_reads_differently_is_refused_by_name(pattern, needle):
    message = rejected(GrammarSpec("regex", pattern))
    assert needle in message and "Failed to build DFA" not in message, message
    schema = {"type": "string", "pattern": pattern}
    assert needle in rejected(GrammarSpec("json_schema", json.dumps(schema)))


@pytest.mark.parametrize(
    "pattern",
    ["[\\u4e00-\\u9fff]{2}", "a{,3}", "[\\b]x", "\\d{2}", "\\w\\W", "[^a-z]{2}", "^ab$|^c$", "(?s:.)x",
     "(?x) a b # comment", "\\u00e9+", "a*?b", "\\Aab\\Z"],
)  # fmt: skip
def test_regex_follows_python_semantics(pattern):
    regex = spec_to_regex(GrammarSpec("regex", pattern))
    rng = random.Random(pattern)
    for _ in range(SAMPLES):
        text = sample(regex, rng)
        assert re.fullmatch(pattern, text), (pattern, regex, text)


def test_empty_string_choice_is_refused_in_both_apis():
    import radixlm as rl

    assert "non-empty" in rejected(GrammarSpec("choices", ("a", "")))
    with pytest.raises(ValueError, match="empty string"):
        rl.select("x", choices=["a", ""])


# ---- the property: every schema compiles to valid outputs only, or is refused by name

PATTERNS = ["^.{2}$", "[^a-z]", "^\\d{1,2}$", '"', "\\\\", "^a\\nb$", "a*+", "[[:digit:]]", "\\bx"]
FORMATS = ["date", "time", "date-time", "email", "uri", "ipv4", "uuid", "hostname"]
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 12), st.sampled_from([2.5, "ab", "2024-02-29", 'x"y'])
)


@st.composite
def string_schemas(draw):
    schema = {"type": draw(st.sampled_from(["string", ["string", "null"], ["integer", "string"]]))}
    extra = draw(st.sampled_from(["pattern", "format", "maxLength", "enum", "const", "none"]))
    if extra == "pattern":
        schema["pattern"] = draw(st.sampled_from(PATTERNS))
    elif extra == "format":
        schema["format"] = draw(st.sampled_from(FORMATS))
    elif extra == "maxLength":
        schema["maxLength"] = draw(st.integers(0, 4))
    elif extra in ("enum", "const"):
        values = draw(st.lists(SCALARS, min_size=1, max_size=4))
        schema[extra] = values if extra == "enum" else values[0]
        schema.update(draw(st.sampled_from([{}, {"maxLength": 2}, {"minimum": 3}])))
    return schema


def integer_schemas():
    bounds = st.fixed_dictionaries(
        {}, optional={"minimum": st.integers(-5, 5), "maximum": st.integers(5, 50)}
    )
    return st.builds(
        lambda b, t: {"type": t, **b}, bounds, st.sampled_from(["integer", ["integer", "null"]])
    )


def objects(children):
    @st.composite
    def build(draw):
        props = draw(st.dictionaries(st.sampled_from("abcd"), children, min_size=1, max_size=3))
        required = draw(st.lists(st.sampled_from(sorted(props)), unique=True))
        types = draw(st.sampled_from(["object", ["object", "null"]]))
        return {"type": types, "properties": props, "required": required}

    return build()


REFS = st.sampled_from([{"$ref": "#"}, {"$ref": "#/$defs/leaf"}, {"$ref": "#/$defs/self"}])
LEAVES = st.one_of(string_schemas(), integer_schemas(), REFS)
SCHEMAS = st.recursive(
    LEAVES,
    lambda kids: st.one_of(
        objects(kids),
        st.builds(lambda s: {"type": "array", "items": s, "maxItems": 2}, kids),
        st.builds(lambda a, b: {"anyOf": [a, b]}, kids, kids),
    ),
    max_leaves=4,
)


@settings(max_examples=100, deadline=None)
@given(SCHEMAS, st.booleans())
def test_any_schema_compiles_to_valid_outputs_or_is_refused_by_name(schema, wrap):
    doc = {"$defs": {"leaf": {"type": "string", "maxLength": 3}, "self": {"$ref": "#"}}, **schema}
    if wrap:  # a recursive definition reached through $defs
        doc = {"$defs": {**doc["$defs"], "node": schema}, "$ref": "#/$defs/node"}
    spec = GrammarSpec("json_schema", json.dumps(doc))
    try:
        regex = spec_to_regex(spec)
    except GrammarError as exc:
        message = str(exc)
        named = ("unsupported" in message or "invalid JSON schema" in message) and (
            " at /" in message or "at the root" in message or "(at " in message
        )
        assert named, message
        return
    assume(len(regex) < 2_000_000)
    rng = random.Random(0)
    for _ in range(5):
        check_json(sample(regex, rng, max_extra=2), doc)


def test_schema_pattern_size_is_bounded_in_its_json_escaped_form():
    from radixlm.runtime.constrained.regex_guard import check_schema_patterns

    check_schema_patterns(json.dumps({"type": "string", "pattern": "^.{1,200}$"}))
    with pytest.raises(GrammarError, match="too complex once JSON-escaped"):
        check_schema_patterns(json.dumps({"type": "string", "pattern": "^.{300}$"}))
