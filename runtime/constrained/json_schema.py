"""JSON schema -> regex: checks, a rewrite into what outlines-core converts correctly, then
`outlines_core.json_schema.build_regex_from_schema`.

outlines-core silently ignores some assertions (numeric bounds, `multipleOf`, `uniqueItems`, ...)
and mis-converts some combinations (`pattern` with `minLength`, several `allOf` branches, property
names that need JSON escaping), which would let invalid outputs through. So, before converting:
- assertions we cannot enforce raise `GrammarError` naming the keyword and its JSON pointer;
- integer/number bounds and a few string formats are replaced by a numeric `const` *marker* that
  outlines-core copies verbatim into the regex, then swapped for our own sub-regex.
Pure functions; thread-safe.
"""

from __future__ import annotations

import json
import re
from typing import Any

from radixlm.runtime.constrained.json_schema_formats import OWN_FORMATS, SUPPORTED_FORMATS
from radixlm.runtime.constrained.json_schema_refs import check_refs
from radixlm.runtime.constrained.num_range import integer_bounds, integer_regex, number_regex
from radixlm.runtime.constrained.regex_python import translate
from radixlm.runtime.errors import GrammarError

# Assertions that would be silently dropped (outputs could violate them).
UNSUPPORTED_KEYWORDS = (
    "multipleOf", "uniqueItems", "minProperties", "maxProperties", "contains", "minContains",
    "maxContains", "dependentRequired", "dependentSchemas", "dependencies", "propertyNames",
    "patternProperties", "unevaluatedProperties", "unevaluatedItems", "additionalItems", "if",
    "then", "else", "not", "$dynamicRef", "$recursiveRef",
)  # fmt: skip
# Keywords that never constrain the output (annotations, identifiers, definitions).
ANNOTATIONS = {
    "title", "description", "default", "examples", "$comment", "$schema", "$id", "$anchor",
    "deprecated", "readOnly", "writeOnly", "contentMediaType", "contentEncoding", "$defs",
    "definitions", "discriminator", "nullable",
}  # fmt: skip
COMBINATORS = ("anyOf", "oneOf", "allOf", "$ref")
_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
# The keywords that apply to one kind of instance only: a branch of a type list keeps its own.
_BY_KIND = {
    "string": ("minLength", "maxLength", "pattern", "format"),
    "number": (*_BOUNDS, "multipleOf"),
    "object": ("properties", "required", "additionalProperties", "minProperties", "maxProperties",
               "patternProperties", "propertyNames", "dependentRequired", "dependentSchemas"),
    "array": ("items", "prefixItems", "minItems", "maxItems", "uniqueItems", "contains"),
}  # fmt: skip
_BY_KIND["integer"] = _BY_KIND["number"]
# The JSON grammar's strings and numbers, as outlines-core writes them; its default whitespace.
_JSON_STRING = r'"([^"\\\x00-\x1F\x7F-\x9F]|\\["\\/bfnrt])*"'
_JSON_NUMBER = r"(-)?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-][0-9]+)?"
_DEFAULT_WS = r"[ ]?"
_MARKER_BASE = 918273645500000000


def parse_schema(text: str) -> Any:
    """Parse and check against the metaschema; returns the schema object."""
    try:
        schema = json.loads(text)
    except (json.JSONDecodeError, TypeError) as exc:
        raise GrammarError(f"json_schema is not valid JSON: {exc}", "json_schema") from None
    if not isinstance(schema, (dict, bool)):
        raise GrammarError("json_schema must be a JSON object (a schema)", "json_schema")
    import jsonschema

    # NOTE: without `$schema`, a boolean exclusiveMinimum/Maximum can only mean draft 4.
    default = (
        jsonschema.Draft4Validator if _draft4_bounds(schema) else jsonschema.Draft202012Validator
    )
    cls = jsonschema.validators.validator_for(schema, default=default)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/" + "/".join(map(str, exc.path)) if exc.path else "the root"
        if exc.validator == "format" and exc.validator_value == "regex":
            try:  # NOTE: the metaschema's verdict has no reason: ours names the construct
                translate(str(exc.instance), "json_schema", json_string=True)
            except GrammarError as named:
                raise _fail(f"{named} (at {where})") from None
        raise GrammarError(
            f"invalid JSON schema at {where}: {exc.message}", "json_schema"
        ) from None
    return schema


def _draft4_bounds(node: Any) -> bool:
    """Whether a boolean `exclusiveMinimum`/`exclusiveMaximum` (draft 4's form) occurs."""
    if isinstance(node, dict):
        if any(isinstance(node.get(k), bool) for k in ("exclusiveMinimum", "exclusiveMaximum")):
            return True
        return any(_draft4_bounds(v) for v in node.values())
    if isinstance(node, list):
        return any(_draft4_bounds(v) for v in node)
    return False


def any_object_regex(whitespace_pattern: str | None = None, depth: int = 2) -> str:
    """Any JSON object whose values nest at most `depth` levels (objects/arrays inside it).

    NOTE: the schema `{"type": "object"}` (OpenAI's `response_format: json_object`) gets this
    instead of outlines-core's generic object regex: that one has ~4x the states and its index
    over a 49k vocabulary takes 15-25 s to build, against ~1.5 s here at depth 2 (depth 3 would
    take ~14 s again). Strings, numbers and literals are the JSON grammar's, exactly.
    """
    ws = whitespace_pattern if whitespace_pattern is not None else _DEFAULT_WS
    member = f"{_JSON_STRING}{ws}:{ws}"
    scalar = f"{_JSON_STRING}|{_JSON_NUMBER}|true|false|null"
    value = f"({scalar})"
    for _ in range(depth):
        items = rf"\[{ws}({value}({ws},{ws}{value})*)?{ws}\]"
        members = rf"\{{{ws}({member}{value}({ws},{ws}{member}{value})*)?{ws}\}}"
        value = f"({scalar}|{items}|{members})"
    return members


def _is_any_object(schema: Any) -> bool:
    return (
        isinstance(schema, dict)
        and schema.get("type") == "object"
        and set(schema) - ANNOTATIONS == {"type"}
    )


def schema_to_regex(text: str, whitespace_pattern: str | None = None) -> str:
    """The regex of every JSON document valid under the schema that radixlm can generate."""
    schema = parse_schema(text)
    if _is_any_object(schema):
        return any_object_regex(whitespace_pattern)
    check_refs(schema)
    rewriter = _Rewriter(text, schema, whitespace_pattern)
    rewritten = rewriter.node(schema, "")
    from outlines_core.json_schema import build_regex_from_schema

    try:
        regex = build_regex_from_schema(json.dumps(rewritten), whitespace_pattern)
    except (ValueError, TypeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise GrammarError(f"unsupported JSON schema: {first}", "json_schema") from None
    for marker, sub in rewriter.markers.items():
        regex = regex.replace(marker, f"({sub})")
    return regex


def _json_equal(value: Any, enum: list) -> bool:
    """`value` is in `enum` by JSON equality (1 == 1.0, True != 1)."""
    import jsonschema

    return jsonschema.Draft202012Validator({"enum": enum}).is_valid(value)


def _fail(message: str) -> GrammarError:
    return GrammarError(message, "json_schema")


class _Rewriter:
    def __init__(self, text: str, root: Any, whitespace_pattern: str | None = None) -> None:
        self.root = root
        self.whitespace_pattern = whitespace_pattern
        self.markers: dict[str, str] = {}
        self.base = _MARKER_BASE
        while str(self.base)[:12] in text:  # NOTE: markers must not occur in the user's schema
            self.base += 10**13

    def marker(self, regex: str) -> dict[str, Any]:
        value = self.base + len(self.markers)
        self.markers[str(value)] = regex
        return {"const": value}

    def node(self, node: Any, path: str) -> Any:
        out = self._node(node, path)
        if isinstance(node, dict) and isinstance(out, dict):
            # NOTE: definitions stay where `$ref` pointers expect them, also when the node itself
            # is replaced (a marker, an intersected enum, the anyOf of a type list).
            for key in ("$defs", "definitions"):
                if isinstance(node.get(key), dict) and key not in out:
                    out[key] = {k: self.node(v, f"{path}/{key}/{k}") for k, v in node[key].items()}
        return out

    def _node(self, node: Any, path: str) -> Any:
        if node is True:
            return {}
        if node is False:
            raise _fail(f"the schema at {path or '/'} is `false` (matches nothing)")
        if not isinstance(node, dict):
            return node
        if _is_any_object(node):  # NOTE: also as a branch of a type list or a property
            return self.marker(any_object_regex(self.whitespace_pattern))
        node = dict(node)
        for kw in UNSUPPORTED_KEYWORDS:
            if kw in node and not (kw == "uniqueItems" and node[kw] is False):
                raise _fail(f"unsupported JSON-schema feature '{kw}' at {path or '/'}")
        if "$ref" in node and not str(node["$ref"]).startswith("#"):
            raise _fail(
                f"unsupported JSON-schema feature: remote $ref {node['$ref']!r} at {path or '/'}"
            )
        self._check_combinators(node, path)
        if "enum" in node or "const" in node:
            return self._enum(node, path)
        types = node.get("type")
        if isinstance(types, list):
            types = list(dict.fromkeys(types))
            if len(types) > 1:
                # NOTE: every type of a list takes the path of a single type (checks, rewrites),
                # with the keywords that apply to it; outlines-core alone would drop some.
                return self.node({"anyOf": [self._branch(node, t) for t in types]}, path)
            node["type"] = types = types[0]
        kind = types
        # NOTE: plain integers/numbers too: outlines-core's are unbounded in length.
        if kind == "integer":
            lo, hi = integer_bounds(node)
            try:
                return self.marker(integer_regex(lo, hi))
            except ValueError as exc:
                raise _fail(f"integer bounds at {path or '/'}: {exc}") from None
        if kind == "number":
            try:
                return self.marker(number_regex(node))
            except ValueError as exc:
                raise _fail(f"unsupported JSON-schema feature: {exc} at {path or '/'}") from None
        if kind == "string":
            fmt = self._string(node, path)
            if fmt is not None:
                return fmt
        if kind == "object" or "properties" in node:
            self._object(node, path)
        if kind == "array" or "items" in node or "prefixItems" in node:
            self._array(node, path)
        for key in ("properties", "$defs", "definitions"):
            if isinstance(node.get(key), dict):
                node[key] = {k: self.node(v, f"{path}/{key}/{k}") for k, v in node[key].items()}
        for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
            if isinstance(node.get(key), list):
                node[key] = [self.node(v, f"{path}/{key}/{i}") for i, v in enumerate(node[key])]
        if isinstance(node.get("items"), (dict, bool)):
            node["items"] = self.node(node["items"], f"{path}/items")
        if isinstance(node.get("additionalProperties"), dict):
            node["additionalProperties"] = self.node(
                node["additionalProperties"], f"{path}/additionalProperties"
            )
        return node

    def _branch(self, node: dict, kind: str) -> dict:
        """The schema of one type of a type list: the node's keywords minus other kinds' own."""
        foreign = {k for other, kws in _BY_KIND.items() if other != kind for k in kws}
        foreign -= set(_BY_KIND.get(kind, ()))
        foreign |= {"$defs", "definitions"}  # NOTE: they stay on the node (see `node`)
        return {**{k: v for k, v in node.items() if k not in foreign}, "type": kind}

    def _enum(self, node: dict, path: str) -> dict:
        """`enum`/`const` intersected with the keywords beside them: only the listed values that
        validate against the whole node are kept (GrammarError when none is left)."""
        import jsonschema

        keyword = "const" if "const" in node else "enum"
        values = [node["const"]] if "const" in node else list(node["enum"])
        rest = {k: v for k, v in node.items() if k not in ("enum", "const", "format")}
        cls = jsonschema.validators.validator_for(self.root, jsonschema.Draft202012Validator)
        validator = cls(self.root).evolve(schema=rest)
        fmt = node.get("format")
        if fmt is not None and fmt not in OWN_FORMATS:
            raise _fail(
                f"unsupported JSON-schema feature: string format {fmt!r} at {path or '/'} "
                f"(supported: {', '.join(SUPPORTED_FORMATS)})"
            )
        kept = []
        for value in values:
            if "enum" in node and "const" in node and not _json_equal(value, node["enum"]):
                continue
            if not validator.is_valid(value):
                continue
            if (
                fmt is not None
                and isinstance(value, str)
                and not re.fullmatch(OWN_FORMATS[fmt], json.dumps(value))
            ):
                continue
            kept.append(value)
        if not kept:
            raise _fail(
                f"unsupported JSON-schema feature: '{keyword}' at {path or '/'} has no value "
                f"that satisfies the keywords beside it ({sorted(set(rest) - ANNOTATIONS)})"
            )
        return {"enum": kept}

    def _check_combinators(self, node: dict, path: str) -> None:
        present = [k for k in COMBINATORS if k in node]
        if not present:
            return
        others = [k for k in node if k not in ANNOTATIONS and k not in COMBINATORS]
        if len(present) > 1 or others:
            extra = present[1:] + others
            raise _fail(
                f"unsupported JSON-schema feature: '{present[0]}' combined with {extra} at "
                f"{path or '/'} (only annotations may sit next to anyOf/oneOf/allOf/$ref)"
            )
        if "allOf" in node and len(node["allOf"]) > 1:
            raise _fail(
                f"unsupported JSON-schema feature: allOf with several schemas at {path or '/'}"
            )

    def _string(self, node: dict, path: str) -> dict | None:
        fmt = node.get("format")
        lengths = [k for k in ("minLength", "maxLength") if k in node]
        if "pattern" in node and lengths:
            raise _fail(f"unsupported JSON-schema feature: pattern with {lengths} at {path or '/'}")
        if "pattern" in node:
            if fmt is not None:
                raise _fail(
                    f"unsupported JSON-schema feature: format {fmt!r} with pattern at {path or '/'}"
                )
            pattern = node["pattern"]
            if not pattern:
                return self.marker(_JSON_STRING)  # NOTE: "" matches every string
            # NOTE: the pattern constrains the *decoded* value (re.search semantics): its JSON-
            # escaped form is generated, so `.` never emits a raw `"` and `\n` becomes `\\n`.
            try:
                body = translate(pattern, "json_schema", json_string=True)
            except GrammarError as exc:
                raise _fail(f"{exc} (the pattern at {path or '/'})") from None
            return self.marker(f'"{body}"')
        if fmt is None:
            return None
        if "pattern" in node or lengths:
            raise _fail(
                f"unsupported JSON-schema feature: format {fmt!r} with pattern/length at {path or '/'}"
            )
        if fmt not in OWN_FORMATS:
            raise _fail(
                f"unsupported JSON-schema feature: string format {fmt!r} at {path or '/'} "
                f"(supported: {', '.join(SUPPORTED_FORMATS)})"
            )
        return self.marker(OWN_FORMATS[fmt])

    def _object(self, node: dict, path: str) -> None:
        props = node.get("properties") or {}
        for name in props:
            if any(c in name for c in '"\\') or any(ord(c) < 0x20 for c in name):
                raise _fail(
                    f"unsupported JSON-schema feature: property name {name!r} needs escaping"
                )
        missing = [r for r in node.get("required", []) if r not in props]
        if missing:
            raise _fail(
                f"unsupported JSON-schema feature: required {missing} not listed in properties at "
                f"{path or '/'}"
            )
        extra = node.get("additionalProperties")
        if extra is False or extra is True:
            # NOTE: outlines-core only emits the listed properties when there are some, so
            # `false` is already enforced; with no properties, `false` means the empty object.
            del node["additionalProperties"]
            if extra is False and "properties" not in node:
                node["properties"] = {}

    def _array(self, node: dict, path: str) -> None:
        if "prefixItems" in node:
            if node.get("items") is False:
                del node["items"]
            bad = [k for k in ("items", "minItems", "maxItems") if k in node]
            if bad:
                raise _fail(
                    f"unsupported JSON-schema feature: prefixItems with {bad} at {path or '/'}"
                )
        elif node.get("items") is False:
            raise _fail(f"unsupported JSON-schema feature: items false at {path or '/'}")
