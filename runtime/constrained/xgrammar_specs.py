"""From a `GrammarSpec` to an XGrammar `Grammar`, with up-front checks that name the problem.

- regex: a Python `re` pattern, matched in full (the promise on every backend): read by Python's
  own parser and re-written in plain syntax (constrained/regex_python.py), then `\\xHH` escapes
  re-spelled `\\u00HH` (XGrammar's `\\x` reads every hex digit that follows: `\\x5fa` is U+05FA);
- json_schema: XGrammar's converter in strict mode (only the listed properties; no extra array
  items) with the string formats radixlm writes itself as `pattern`s (as on llguidance). XGrammar
  *ignores* keywords it cannot enforce (`not`, `uniqueItems`, `if`, remote `$ref`s, ...), so
  every schema keyword outside `_ENFORCED` / `_ANNOTATIONS` is rejected here, naming the keyword
  and its JSON pointer; so are `oneOf` / multi-member `allOf` (XGrammar reads them as `anyOf` /
  the first member) and `$ref`s that leave the document;
- choices: an EBNF alternation of string literals;
- ebnf: GBNF (`root ::= ...`); a grammar without `::=` is read as Lark (`start: ...`).

Pure functions, cached (LRU): the tokenizer manager calls `check_spec_xgrammar` before a request
is sent; the compile workers call `spec_to_xgrammar` again (a cache hit). Thread-safe.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

from radixlm.runtime.constrained.base import GrammarSpec
from radixlm.runtime.constrained.json_schema import OWN_FORMATS
from radixlm.runtime.constrained.llguidance_specs import close_objects
from radixlm.runtime.constrained.regex_python import translate
from radixlm.runtime.constrained.xgrammar_ebnf import valid_utf8
from radixlm.runtime.errors import GrammarError

MAX_PATTERN_CHARS = 100_000
MAX_CHOICES = 4096

# Keywords XGrammar's converter enforces (checked by the walks of tests/constrained with
# jsonschema as the oracle), and keywords that constrain nothing (annotations).
_ENFORCED = frozenset((
    "type", "properties", "required", "additionalProperties", "items", "prefixItems", "minItems",
    "maxItems", "enum", "const", "anyOf", "allOf", "oneOf", "$ref", "$defs", "definitions",
    "pattern", "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum",
    "exclusiveMaximum", "format",
))  # fmt: skip
_ANNOTATIONS = frozenset((
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
    "readOnly", "writeOnly", "$anchor", "contentMediaType", "contentEncoding",
    "markdownDescription",
))  # fmt: skip
# Where a schema keyword holds subschemas (name -> schema maps; lists; one schema).
_MAPS = ("properties", "$defs", "definitions")
_LISTS = ("anyOf", "allOf", "oneOf", "prefixItems")
_ONE = ("items", "additionalProperties")
_FORMATS = ", ".join(OWN_FORMATS)
_HEX_ESCAPE = re.compile(r"\\x([0-9a-f]{2})")


def _escape(token: str) -> str:
    return str(token).replace("~", "~0").replace("/", "~1")


def _disjoint_types(branches: list) -> bool:
    """Every branch names its `type`s and no JSON value has two branches' types (so oneOf is
    anyOf). NOTE: "integer" is also a "number"."""
    seen: set[str] = set()
    for branch in branches:
        types = branch.get("type") if isinstance(branch, dict) else None
        names = {types} if isinstance(types, str) else set(types or ())
        if not names or not all(isinstance(t, str) for t in names):
            return False
        if "integer" in names or "number" in names:
            names |= {"integer", "number"}
        if names & seen:
            return False
        seen |= names
    return len(branches) <= 1 or bool(seen)


def unsupported_keywords(schema: Any) -> list[tuple[str, str]]:
    """(keyword, JSON pointer) of every schema keyword this backend cannot enforce."""
    found: list[tuple[str, str]] = []

    def walk(node: Any, ptr: str) -> None:
        if not isinstance(node, dict):
            return
        for key, sub in node.items():
            here = f"{ptr}/{_escape(key)}"
            if key not in _ENFORCED and key not in _ANNOTATIONS:
                found.append((key, here))
                continue
            if key == "oneOf" and isinstance(sub, list) and not _disjoint_types(sub):
                found.append((key, here))  # NOTE: XGrammar reads oneOf as anyOf
            elif key == "allOf" and isinstance(sub, list) and len(sub) > 1:
                found.append((key, here))  # NOTE: XGrammar keeps the first member only
            elif key == "$ref" and not (isinstance(sub, str) and sub.startswith("#")):
                found.append((key, f"{here} (remote {sub!r}; only '#...' refs)"))
            elif key == "format" and sub not in OWN_FORMATS:
                found.append((key, f"{here} (format {sub!r}; supported: {_FORMATS})"))
            if key in _MAPS and isinstance(sub, dict):
                for name, child in sub.items():
                    walk(child, f"{here}/{_escape(name)}")
            elif key in (*_LISTS, "items") and isinstance(sub, list):
                for i, child in enumerate(sub):
                    walk(child, f"{here}/{i}")
            elif key in _ONE:
                walk(sub, here)

    walk(schema, "")
    return found


def _strings(node: Any, ptr: str = "") -> Any:
    """A copy where every string `pattern` is Python's reading of it as the JSON text of the
    value (regex_python's JSON-string mode: `.` never emits a raw `"`, re.search semantics), and
    every `enum` / `const` node holds only the values its other keywords allow (`_values`).
    NOTE: XGrammar drops the length bounds of a string with a pattern (refused here, as on
    outlines); a length-bounded string keeps XGrammar's own rule (a repetition of one class:
    ~8 us a mask, where a pattern of the same repetition took ~3 ms), made valid JSON by
    xgrammar_ebnf.py."""
    if isinstance(node, list):
        return [_strings(child, f"{ptr}/{i}") for i, child in enumerate(node)]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, sub in node.items():
        if key in _MAPS and isinstance(sub, dict):
            out[key] = {n: _strings(c, f"{ptr}/{key}/{_escape(n)}") for n, c in sub.items()}
        elif key in (*_LISTS, *_ONE):
            out[key] = _strings(sub, f"{ptr}/{_escape(key)}")
        else:
            out[key] = sub
    if "enum" in out or "const" in out:
        return _values(out, ptr)
    lengths = [k for k in ("minLength", "maxLength") if k in out]
    pattern = out.get("pattern")
    if isinstance(pattern, str) and lengths:
        raise GrammarError(
            f"unsupported JSON Schema keyword(s) for the xgrammar grammar backend: {lengths[0]!r} "
            f"with 'pattern' at {ptr or '/'}",
            "json_schema",
        )
    if isinstance(pattern, str):
        try:
            body = translate(pattern, "json_schema", json_string=True)
        except GrammarError as exc:
            raise GrammarError(
                f"{exc} (the pattern at {ptr or '/'}/pattern)", "json_schema"
            ) from None
        out["pattern"] = "^" + _HEX_ESCAPE.sub(r"\\u00\1", body) + "$"
    return out


_LOCAL = ("type", "minLength", "maxLength", "pattern", "minimum", "maximum", "exclusiveMinimum",
          "exclusiveMaximum", "minItems", "maxItems", "format")  # fmt: skip


def _values(node: dict, ptr: str) -> dict:
    """An `enum` / `const` node as the enum of its values that also satisfy the node's own other
    keywords. NOTE: XGrammar generates the listed values alone (`{"minimum": 5, "const": 1}`
    would give 1)."""
    import jsonschema

    key = "const" if "const" in node else "enum"
    values = [node["const"]] if key == "const" else node["enum"]
    if not isinstance(values, list):
        raise GrammarError(f"'enum' at {ptr or '/'} must be a list", "json_schema")
    rest = {k: v for k, v in node.items() if k in _LOCAL}
    if "const" in node and "enum" in node:
        rest["enum"] = node["enum"]
    kept = [v for v in values if jsonschema.Draft202012Validator(rest).is_valid(v)]
    if not kept:
        raise GrammarError(
            f"unsatisfiable JSON Schema: no value of {key!r} at {ptr}/{key} satisfies the "
            "other keywords of its schema",
            "json_schema",
        )
    return {"enum": kept}


def _parse_schema(text: str) -> Any:
    try:
        schema = json.loads(text)
    except (TypeError, ValueError) as exc:
        raise GrammarError(f"json_schema is not valid JSON: {exc}", "json_schema") from None
    if not isinstance(schema, (dict, bool)):
        raise GrammarError("json_schema must be a JSON object (or a boolean)", "json_schema")
    return schema


def _json_options(whitespace_pattern: str | None) -> dict[str, Any]:
    """XGrammar has no whitespace regex: the default (one optional space, `[ ]?`) is narrowed to
    exactly one space after `,` and `:`; "" is compact JSON; other patterns are refused."""
    if whitespace_pattern == "":
        return {"any_whitespace": False, "separators": (",", ":")}
    if whitespace_pattern is None:
        return {"any_whitespace": False, "separators": (", ", ": ")}
    raise GrammarError(
        "the xgrammar grammar backend supports no constrained_json_whitespace_pattern other than "
        f"'' (compact) or the default; got {whitespace_pattern!r}",
        "json_schema",
    )


def _first_line(exc: BaseException) -> str:
    lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
    text = lines[-1] if lines else type(exc).__name__
    # NOTE: XGrammar prefixes "[hh:mm:ss] /project/cpp/file.cc:123: "; the reason follows.
    return re.sub(r"^\[[0-9:]+\] \S+:\d+: ", "", text)


def _ebnf_literal(text: str) -> str:
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def xgrammar_regex(pattern: str) -> str:
    """`pattern` (Python `re` syntax) in the syntax XGrammar reads the same way."""
    return _HEX_ESCAPE.sub(r"\\u00\1", translate(pattern))


@functools.lru_cache(maxsize=1024)
def spec_to_xgrammar(spec: GrammarSpec, whitespace_pattern: str | None = None) -> Any:
    """The XGrammar `Grammar` of the spec (raises GrammarError naming the problem)."""
    import xgrammar as xgr

    kind, value = spec.kind, spec.value
    if kind in ("regex", "ebnf", "json_schema") and (not isinstance(value, str) or not value):
        raise GrammarError(f"{kind} must be a non-empty string", kind)
    try:
        if kind == "regex":
            assert isinstance(value, str)
            if len(value) > MAX_PATTERN_CHARS:
                raise GrammarError(f"regex is longer than {MAX_PATTERN_CHARS} characters", kind)
            return valid_utf8(xgr.Grammar.from_regex(xgrammar_regex(value)))
        if kind == "json_schema":
            assert isinstance(value, str)
            schema = _parse_schema(value)
            bad = unsupported_keywords(schema) if isinstance(schema, dict) else []
            if bad:
                parts = [f"{key!r} at {ptr or '/'}" for key, ptr in bad[:3]]
                more = f" (and {len(bad) - 3} more)" if len(bad) > 3 else ""
                raise GrammarError(
                    "unsupported JSON Schema keyword(s) for the xgrammar grammar backend: "
                    + "; ".join(parts)
                    + more,
                    kind,
                )
            text = json.dumps(_strings(close_objects(schema)))
            return valid_utf8(
                xgr.Grammar.from_json_schema(
                    text, strict_mode=True, **_json_options(whitespace_pattern)
                ),
                json=True,
            )
        if kind == "choices":
            if (
                not isinstance(value, tuple)
                or not value
                or not all(isinstance(c, str) and c for c in value)
            ):
                raise GrammarError("choices must be a non-empty list of non-empty strings", kind)
            if len(value) > MAX_CHOICES:
                raise GrammarError(f"at most {MAX_CHOICES} choices are supported", kind)
            return xgr.Grammar.from_ebnf("root ::= " + " | ".join(map(_ebnf_literal, value)))
        if kind == "ebnf":
            assert isinstance(value, str)
            if "::=" in value:
                return valid_utf8(xgr.Grammar.from_ebnf(value, root_rule_name="root"))
            return valid_utf8(xgr.Grammar.from_lark(value))
    except GrammarError:
        raise
    except (RuntimeError, ValueError, TypeError) as exc:
        what = "invalid regex" if kind == "regex" else f"invalid {kind}"
        shown = f" {value!r}" if kind == "regex" and len(value) <= 80 else ""
        raise GrammarError(f"{what}{shown}: {_first_line(exc)}", kind) from None
    raise GrammarError(f"unknown constraint kind {kind!r}", kind)


def check_spec_xgrammar(spec: GrammarSpec, whitespace_pattern: str | None = None) -> None:
    """Cheap validation (no token masks): raise GrammarError naming the problem."""
    spec_to_xgrammar(spec, whitespace_pattern)
