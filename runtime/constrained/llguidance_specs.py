"""From a `GrammarSpec` to an llguidance grammar (the text `LLMatcher` compiles), with up-front
checks that name the problem.

- regex: a Python `re` pattern, matched in full (`re.fullmatch` is the promise on both backends):
  read by Python's own parser and re-written in the plain syntax llguidance's Rust-`regex` reader
  means the same way (constrained/regex_python.py; constructs other dialects read differently are
  refused by name);
- json_schema: llguidance's JSON-schema compiler (recursive `$ref`s included); keywords it cannot
  enforce are an error naming the keyword and its JSON pointer (never silently ignored);
- choices: a Lark alternation of string literals;
- ebnf: GBNF (llama.cpp, `root ::= ...`) or Lark (`start: ...`) text.

`check_spec_llguidance` validates the grammar without a tokenizer (no token masks are built): the
tokenizer manager calls it before a request is sent, and the compile workers call it again through
`spec_to_llguidance`. Pure, cached (LRU), thread-safe.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

from radixlm.runtime.constrained.base import GrammarSpec
from radixlm.runtime.constrained.json_schema import OWN_FORMATS
from radixlm.runtime.constrained.regex_python import translate
from radixlm.runtime.errors import GrammarError

MAX_PATTERN_CHARS = 100_000
MAX_CHOICES = 4096
# The outlines backend's default JSON whitespace (one optional space), so both backends produce
# the same layouts unless `constrained_json_whitespace_pattern` says otherwise.
DEFAULT_JSON_WHITESPACE = r"[ ]?"

# Keywords whose value is a map of name -> subschema / a list of subschemas / one subschema.
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SCHEMA_ONE = (
    "items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames",
    "unevaluatedProperties", "unevaluatedItems", "additionalItems",
)  # fmt: skip
_UNIMPLEMENTED = re.compile(r"Unimplemented keys: \[([^\]]*)\]")
_UNKNOWN_FORMAT = re.compile(r"Unknown format: (\S+)")
_KEYWORD_IN_TEXT = re.compile(
    r"\b(minProperties|maxProperties|oneOf|anyOf|allOf|additionalProperties|patternProperties|"
    r"pattern|format|minItems|maxItems|minLength|maxLength|multipleOf|enum|const|\$ref)\b"
)


def keyword_pointers(schema: Any, keyword: str, value: Any = None) -> list[str]:
    """JSON pointers of every place `keyword` is used as a keyword of a (sub)schema (never as a
    property name); with `value`, only where it has that value."""
    found: list[str] = []

    def walk(node: Any, ptr: str) -> None:
        if not isinstance(node, dict):
            return
        for key, sub in node.items():
            here = f"{ptr}/{_escape(key)}"
            if key == keyword and (value is None or sub == value):
                found.append(here)
            if key in _SCHEMA_MAPS and isinstance(sub, dict):
                for name, child in sub.items():
                    walk(child, f"{here}/{_escape(name)}")
            elif key in (*_SCHEMA_LISTS, "items") and isinstance(sub, list):
                for i, child in enumerate(sub):
                    walk(child, f"{here}/{i}")
            elif key in _SCHEMA_ONE:
                walk(sub, here)

    walk(schema, "")
    return found


_OPEN_KEYS = ("additionalProperties", "patternProperties", "unevaluatedProperties")
_COMPOSED = ("allOf", "anyOf", "oneOf", "$ref", "if")


def close_objects(schema: Any, in_all_of: bool = False) -> Any:
    """A copy where object schemas that list `properties` and say nothing about other keys get
    `additionalProperties: false` (the outlines backend's behaviour: only the listed keys are
    generated), and the string formats the outlines backend writes itself (bounded: e.g. at most
    9 fraction digits in a date-time, where llguidance's own allows any number) become that
    `pattern`. Both are narrowings: every output still validates against the original schema.
    NOTE: schemas composed with others (allOf members, nodes with allOf/anyOf/oneOf/$ref/if)
    are left open: closing them could make a valid combination unsatisfiable."""
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, sub in schema.items():
        if key in _SCHEMA_MAPS and isinstance(sub, dict):
            out[key] = {name: close_objects(child) for name, child in sub.items()}
        elif key in (*_SCHEMA_LISTS, "items") and isinstance(sub, list):
            out[key] = [close_objects(child, key == "allOf") for child in sub]
        elif key in _SCHEMA_ONE:
            out[key] = close_objects(sub)
        else:
            out[key] = sub
    fmt = out.get("format")
    if isinstance(fmt, str) and fmt in OWN_FORMATS and "pattern" not in out:
        del out["format"]
        out["pattern"] = "^" + OWN_FORMATS[fmt][1:-1] + "$"  # NOTE: the regex holds the quotes
    if (
        "properties" in out
        and not in_all_of
        and not any(k in out for k in (*_OPEN_KEYS, *_COMPOSED))
    ):
        out["additionalProperties"] = False
    return out


def _escape(token: str) -> str:
    return str(token).replace("~", "~0").replace("/", "~1")


def _explain(message: str, schema: Any) -> str:
    """llguidance's schema error, with the JSON pointer(s) of the keyword it names."""
    first = message.strip().splitlines()[0] if message.strip() else "invalid schema"
    hit = _UNIMPLEMENTED.search(first)
    if hit:
        keys = [k.strip().strip('"') for k in hit.group(1).split(",") if k.strip()]
        parts = []
        for key in keys:
            where = keyword_pointers(schema, key) or ["(unknown location)"]
            parts.append(f"{key!r} at {', '.join(where[:3])}")
        return (
            "unsupported JSON Schema keyword(s) for the llguidance grammar backend: "
            + "; ".join(parts)
        )
    hit = _UNKNOWN_FORMAT.search(first)
    if hit:
        fmt = hit.group(1).strip('"')
        where = keyword_pointers(schema, "format", fmt) or ["(unknown location)"]
        return (
            f"unsupported JSON Schema format {fmt!r} at {', '.join(where[:3])} (keyword 'format')"
        )
    hit = _KEYWORD_IN_TEXT.search(first)
    where = keyword_pointers(schema, hit.group(1)) if hit else []
    if hit and where:
        return f"cannot compile json_schema: {first} (keyword {hit.group(1)!r} at {where[0]})"
    return f"cannot compile json_schema: {first}"


def _parse_schema(text: str) -> Any:
    try:
        schema = json.loads(text)
    except (TypeError, ValueError) as exc:
        raise GrammarError(f"json_schema is not valid JSON: {exc}", "json_schema") from None
    if not isinstance(schema, (dict, bool)):
        raise GrammarError("json_schema must be a JSON object (or a boolean)", "json_schema")
    # NOTE: no metaschema check here: jsonschema's takes seconds on large schemas and rejects
    # valid ECMA-262 patterns (`\\p{Cc}`); llguidance reports invalid schemas itself.
    return schema


def _json_options(whitespace_pattern: str | None) -> dict[str, Any]:
    if whitespace_pattern == "":  # compact JSON, no whitespace at all
        return {"whitespace_flexible": False}
    return {"whitespace_pattern": whitespace_pattern or DEFAULT_JSON_WHITESPACE}


def _validate(grammar: str, kind: str, schema: Any = None, pattern: str = "") -> None:
    from llguidance import LLMatcher

    is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar)
    if not is_error:
        return
    message = messages[0] if messages else "invalid grammar"
    if kind == "json_schema":
        raise GrammarError(_explain(message, schema), kind)
    lines = message.strip().splitlines() or ["invalid grammar"]
    # NOTE: a regex parse error names the problem on its own `error: ...` line (Rust's regex
    # crate), after the pattern is echoed; the first line only says where.
    reason = next((ln[len("error: ") :] for ln in lines if ln.startswith("error: ")), None)
    if kind == "regex" and reason is not None:
        raise GrammarError(f"invalid regex {pattern!r}: {reason}", kind)
    detail = f"{lines[0]} ({reason})" if reason is not None else lines[0]
    raise GrammarError(f"cannot compile {kind}: {detail}", kind)


@functools.lru_cache(maxsize=1024)
def spec_to_llguidance(spec: GrammarSpec, whitespace_pattern: str | None = None) -> str:
    """The llguidance grammar of the spec, validated (raises GrammarError)."""
    import llguidance
    from llguidance import LLMatcher

    kind, value = spec.kind, spec.value
    if kind in ("regex", "ebnf", "json_schema") and (not isinstance(value, str) or not value):
        raise GrammarError(f"{kind} must be a non-empty string", kind)
    assert isinstance(value, (str, tuple))
    if kind == "regex":
        assert isinstance(value, str)
        if len(value) > MAX_PATTERN_CHARS:
            raise GrammarError(f"regex is longer than {MAX_PATTERN_CHARS} characters", kind)
        # NOTE: Rust's regex reads `[[:digit:]]`, `a{,3}`, `[\b]`... unlike Python: translate first
        grammar = LLMatcher.grammar_from_regex(translate(value))
        _validate(grammar, kind, pattern=value)
        return grammar
    if kind == "json_schema":
        assert isinstance(value, str)
        schema = _parse_schema(value)
        try:
            grammar = LLMatcher.grammar_from_json_schema(
                close_objects(schema), defaults=_json_options(whitespace_pattern)
            )
        except ValueError as exc:
            raise GrammarError(f"cannot compile json_schema: {exc}", kind) from None
        _validate(grammar, kind, schema)
        return grammar
    if kind == "choices":
        if (
            not isinstance(value, tuple)
            or not value
            or not all(isinstance(c, str) and c for c in value)
        ):
            raise GrammarError("choices must be a non-empty list of non-empty strings", kind)
        if len(value) > MAX_CHOICES:
            raise GrammarError(f"at most {MAX_CHOICES} choices are supported", kind)
        lark = "start: " + " | ".join(json.dumps(c, ensure_ascii=False) for c in value)
        grammar = LLMatcher.grammar_from_lark(lark)
        _validate(grammar, kind)
        return grammar
    if kind == "ebnf":
        assert isinstance(value, str)
        try:
            grammar = llguidance.grammar_from("ebnf", value)
        except ValueError as exc:
            raise GrammarError(f"invalid ebnf grammar: {exc}", kind) from None
        _validate(grammar, kind)
        return grammar
    raise GrammarError(f"unknown constraint kind {kind!r}", kind)


def check_spec_llguidance(spec: GrammarSpec, whitespace_pattern: str | None = None) -> None:
    """Cheap validation (no token masks): raise GrammarError naming the problem."""
    spec_to_llguidance(spec, whitespace_pattern)


def check_sampling_params_llguidance(sp: object, whitespace_pattern: str | None = None) -> None:
    """`check_spec_llguidance` for a `SamplingParams` (no-op without a constraint)."""
    constraint = getattr(sp, "constraint", None)
    if constraint is not None:
        check_spec_llguidance(GrammarSpec.from_constraint(*constraint), whitespace_pattern)
