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
from typing import Any

from radixlm.runtime.constrained import num_range
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
_TIME = (
    r"(2[0-3]|[01][0-9]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,9})?(Z|[+-](2[0-3]|[01][0-9]):[0-5][0-9])"
)
_DATE = (
    r"[0-9]{4}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)"
    r"|02-(0[1-9]|1[0-9]|2[0-8]))"
)
_IPV4_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_HEX = "[0-9a-fA-F]"
_URI_CHARS = r"[a-zA-Z0-9._~%!$&'()*+,;=:@/-]"
# Formats we write ourselves. outlines-core's versions let invalid outputs through: dates like
# 2023-02-30 and negative years, a time without offset and a broken fraction, an email with a
# quoted local part and a URI with unescaped `"` (which end the JSON string early).
OWN_FORMATS = {
    "date": f'"{_DATE}"',
    "time": f'"{_TIME}"',
    "date-time": f'"{_DATE}T{_TIME}"',
    "ipv4": f'"({_IPV4_OCTET}\\.){{3}}{_IPV4_OCTET}"',
    "uuid": f'"{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}"',
    "email": r'"[a-zA-Z0-9._%+-]{1,64}@[a-zA-Z0-9-]{1,63}(\.[a-zA-Z0-9-]{1,63}){0,3}\.[a-zA-Z]{2,24}"',
    "uri": (
        rf'"(https?|ftp)://[a-zA-Z0-9.-]{{1,253}}(:[0-9]{{1,5}})?(/{_URI_CHARS}*)?'
        rf'(\?{_URI_CHARS}*)?(#{_URI_CHARS}*)?"'
    ),
}
SUPPORTED_FORMATS = tuple(OWN_FORMATS)
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
    rewriter = _Rewriter(text)
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


def _fail(message: str) -> GrammarError:
    return GrammarError(message, "json_schema")


class _Rewriter:
    def __init__(self, text: str) -> None:
        self.markers: dict[str, str] = {}
        self.base = _MARKER_BASE
        while str(self.base)[:12] in text:  # NOTE: markers must not occur in the user's schema
            self.base += 10**13

    def marker(self, regex: str) -> dict[str, Any]:
        value = self.base + len(self.markers)
        self.markers[str(value)] = regex
        return {"const": value}

    def node(self, node: Any, path: str) -> Any:
        if node is True:
            return {}
        if node is False:
            raise _fail(f"the schema at {path or '/'} is `false` (matches nothing)")
        if not isinstance(node, dict):
            return node
        node = dict(node)
        for kw in UNSUPPORTED_KEYWORDS:
            if kw in node and not (kw == "uniqueItems" and node[kw] is False):
                raise _fail(f"unsupported JSON-schema feature '{kw}' at {path or '/'}")
        if "$ref" in node and not str(node["$ref"]).startswith("#"):
            raise _fail(
                f"unsupported JSON-schema feature: remote $ref {node['$ref']!r} at {path or '/'}"
            )
        self._check_combinators(node, path)
        types = node.get("type")
        if isinstance(types, list) and len(types) > 1 and any(k in node for k in _BOUNDS):
            rest = {k: v for k, v in node.items() if k != "type"}
            return self.node({"anyOf": [{**rest, "type": t} for t in types]}, path)
        kind = types[0] if isinstance(types, list) and len(types) == 1 else types
        if "enum" not in node and "const" not in node:
            # NOTE: plain integers/numbers too: outlines-core's are unbounded in length.
            if kind == "integer":
                lo, hi = num_range.integer_bounds(node)
                try:
                    return self.marker(num_range.integer_regex(lo, hi))
                except ValueError as exc:
                    raise _fail(f"integer bounds at {path or '/'}: {exc}") from None
            if kind == "number":
                try:
                    return self.marker(num_range.number_regex(node))
                except ValueError as exc:
                    raise _fail(
                        f"unsupported JSON-schema feature: {exc} at {path or '/'}"
                    ) from None
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
            from radixlm.runtime.constrained.patterns import check_regex

            pattern = str(node["pattern"]).removeprefix("^")
            if pattern.endswith("$") and not pattern.endswith("\\$"):
                pattern = pattern[:-1]
            check_regex(pattern, "json_schema")
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
