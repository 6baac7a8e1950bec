"""The xgrammar backend without the model: every up-front rejection names its problem (keyword and
JSON pointer), the rewrites that keep XGrammar's masks valid (surrogates, overlong UTF-8, raw
control characters in length-bounded strings, `\\xHH` escapes) hold, enum/const values are
filtered by their schema, and `is_terminated` / jump-forward keep the seam's meaning."""

from __future__ import annotations

import functools
import json
import re

import pytest
from constrained.helpers import EOS, allowed_ids, make_compiler, tokenizer

from radixlm.runtime.constrained import GrammarSpec
from radixlm.runtime.errors import GrammarError


@pytest.fixture(scope="module")
def xgr():
    return make_compiler(backend="xgrammar")


def _schema(value: object) -> GrammarSpec:
    return GrammarSpec("json_schema", json.dumps(value))


REJECTED = [
    (_schema({"type": "array", "uniqueItems": True}), "'uniqueItems' at /uniqueItems"),
    (_schema({"properties": {"a": {"not": {"type": "null"}}}}), "'not' at /properties/a/not"),
    (_schema({"if": {"type": "string"}, "then": {"maxLength": 2}}), "'if' at /if"),
    (_schema({"type": "array", "contains": {"type": "integer"}}), "'contains' at /contains"),
    (_schema({"type": "object", "minProperties": 1}), "'minProperties' at /minProperties"),
    (_schema({"type": "integer", "multipleOf": 3}), "'multipleOf' at /multipleOf"),
    (_schema({"patternProperties": {"^x": {}}}), "'patternProperties' at /patternProperties"),
    (_schema({"oneOf": [{"type": "integer"}, {"type": "number"}]}), "'oneOf' at /oneOf"),
    (_schema({"allOf": [{"type": "integer"}, {"minimum": 3}]}), "'allOf' at /allOf"),
    (_schema({"$ref": "https://example.com/s.json"}), "'$ref' at /$ref (remote"),
    (_schema({"type": "string", "format": "hostname"}), "'format' at /format (format 'hostname'"),
    (_schema({"type": "string", "pattern": "a", "maxLength": 3}), "'maxLength' with 'pattern' at /"),
    (_schema({"type": "integer", "minimum": 5, "const": 1}), "no value of 'const' at /const"),
    (_schema({"type": "strin"}), 'Unsupported type "strin"'),
    (GrammarSpec("json_schema", "{not json"), "not valid JSON"),
    (GrammarSpec("regex", "(abc"), "invalid regex '(abc'"),
    (GrammarSpec("regex", "a(?=b)"), "look-around"),
    (GrammarSpec("regex", "[[:digit:]]"), "POSIX"),
    (GrammarSpec("ebnf", "root ::= missing"), "invalid ebnf"),
    (GrammarSpec("ebnf", "start: (("), "invalid ebnf"),
    (GrammarSpec("choices", ("a", "")), "non-empty strings"),
]  # fmt: skip


@pytest.mark.parametrize(("spec", "needle"), REJECTED, ids=[n for _, n in REJECTED])
def test_rejected_up_front_by_name(xgr, spec, needle):
    with pytest.raises(GrammarError, match=re.escape(needle)):
        xgr.validate(spec)


def test_custom_json_whitespace_is_rejected_by_name():
    compiler = make_compiler(backend="xgrammar", whitespace=r"[\n ]*")
    with pytest.raises(GrammarError, match="constrained_json_whitespace_pattern"):
        compiler.validate(_schema({"type": "integer"}))


def test_unsatisfiable_enum_values_are_dropped(xgr):
    from radixlm.runtime.constrained.xgrammar_specs import _strings

    assert _strings({"type": "string", "maxLength": 2, "enum": ["abc", "d"]}) == {"enum": ["d"]}
    assert _strings({"type": "integer", "enum": [1, 2.5, True]}) == {"enum": [1]}


@functools.lru_cache(maxsize=1)
def _ids() -> dict[bytes, int]:
    out: dict[bytes, int] = {}
    for i, b in enumerate(make_compiler(backend="xgrammar").vocab.token_bytes):
        if b is not None:
            out.setdefault(b, i)
    return out


def _token(data: bytes) -> int:
    return _ids()[data]


@pytest.mark.parametrize(
    "spec",
    [GrammarSpec("regex", "[^a]{0,8}"), _schema({"type": "string"}), _schema({"type": "string", "maxLength": 16})],
    ids=["negated-class", "json-string", "bounded-string"],
)  # fmt: skip
def test_no_surrogate_or_overlong_utf8(xgr, spec):
    """After a 3-byte lead, only continuation bytes that make UTF-8 are offered: not the
    surrogates (ED A0-BF) nor overlong forms (E0 80-9F)."""
    prefix = [] if spec.kind == "regex" else [_token(b'"')]
    for lead, bad in ((0xED, 0xA5), (0xE0, 0x95)):
        grammar = xgr.compile(spec)
        for t in [*prefix, _token(bytes([lead]))]:
            assert grammar.accept(t)
        mask = allowed_ids(grammar)
        assert not mask[_token(bytes([bad]))], (hex(lead), hex(bad))
        assert mask[_token(bytes([0xB0 if lead == 0xE0 else 0x80]))]


def test_bounded_string_refuses_raw_control_characters(xgr):
    grammar = xgr.compile(_schema({"type": "string", "maxLength": 12}))
    assert grammar.accept(_token(b'"'))
    mask = allowed_ids(grammar)
    assert not mask[_token(b"\x1c")] and not mask[_token(b"\n")] and mask[_token(b"a")]


def test_hex_escapes_read_as_python_does(xgr):
    from radixlm.runtime.constrained.xgrammar_specs import xgrammar_regex

    assert "\\x5f" not in xgrammar_regex("[_a-z]+")  # `\x5fa` would read as U+05FA
    grammar = xgr.compile(GrammarSpec("regex", "[_a-z]+"))
    assert allowed_ids(grammar)[_token(b"_")]


def test_terminated_means_only_eos_may_follow(xgr):
    digits = xgr.compile(GrammarSpec("regex", "[0-9]{3}"))
    ids = tokenizer().encode("123", add_special_tokens=False)
    for t in ids:
        assert not digits.is_terminated() and digits.accept(t)
    assert digits.is_terminated()  # complete and nothing else may follow: no EOS needed
    assert allowed_ids(digits).nonzero().flatten().tolist() == [EOS]
    words = xgr.compile(GrammarSpec("regex", "[a-z]+"))
    assert words.accept(_token(b"a")) and not words.is_terminated()
    assert words.accept(EOS) and words.is_terminated()
    words.rollback(1)
    assert not words.is_terminated() and words.num_accepted == 1


def test_jump_forward_and_copy(xgr):
    grammar = xgr.compile(GrammarSpec("regex", r'\{"name": "[a-z]+"\}'))
    assert grammar.jump_forward() == '{"name": "'
    copy = grammar.copy()
    assert copy.accept(_token(b"{"))
    assert grammar.num_accepted == 0 and copy.num_accepted == 1
    optional = xgr.compile(GrammarSpec("regex", "ab(cd)?"))
    for t in (_token(b"a"), _token(b"b")):
        assert optional.accept(t)
    assert optional.jump_forward() is None  # the output may end here
