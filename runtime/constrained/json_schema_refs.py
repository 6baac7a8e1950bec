"""Local `$ref` resolution and the recursion check of a JSON schema (before any conversion).

outlines-core unrolls a recursive schema to a fixed depth, and the deepest level comes out as an
object with a trailing comma and without its required properties: invalid JSON that still ends
with "stop". So a schema whose references form a cycle is refused by name, with the JSON pointer
of the `$ref` that closes the cycle. Only JSON-pointer references inside the document (`#` and
`#/...`) are supported; anchors (`#name`) and remote references are refused.
Pure functions; thread-safe.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from radixlm.runtime.errors import GrammarError

# Keywords whose value is a schema, a list of schemas, or a map of schemas (`$defs` are reached
# only through references: a definition nobody uses generates nothing).
_SCHEMA = ("items", "additionalProperties", "not", "if", "then", "else", "contains",
           "propertyNames", "unevaluatedItems", "unevaluatedProperties", "additionalItems")  # fmt: skip
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
_SCHEMA_MAPS = ("properties", "patternProperties", "dependentSchemas")


def _fail(message: str) -> GrammarError:
    return GrammarError(message, "json_schema")


def resolve(root: Any, ref: str, where: str) -> tuple[str, Any]:
    """(JSON pointer, subschema) of a local `$ref`; GrammarError when it cannot be resolved."""
    if not ref.startswith("#"):
        raise _fail(f"unsupported JSON-schema feature: remote $ref {ref!r} at {where}")
    fragment = unquote(ref[1:])
    if fragment and not fragment.startswith("/"):
        raise _fail(
            f"unsupported JSON-schema feature: $ref to the anchor {ref!r} at {where} (use a "
            "JSON pointer such as '#/$defs/name')"
        )
    node = root
    for part in fragment.split("/")[1:]:
        key = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            raise _fail(f"invalid JSON schema at {where}: $ref {ref!r} points to nothing")
    return fragment, node


def check_refs(root: Any) -> None:
    """Raise GrammarError naming the first `$ref` that makes the schema recursive, or that cannot
    be resolved."""
    _Walk(root).schema(root, "", ("",))


class _Walk:
    def __init__(self, root: Any) -> None:
        self.root = root
        self.done: set[str] = set()  # pointers whose expansion is known to be finite

    def schema(self, node: Any, path: str, active: tuple[str, ...]) -> None:
        if not isinstance(node, dict):
            return
        ref = node.get("$ref")
        if isinstance(ref, str):
            target, sub = resolve(self.root, ref, path or "/")
            if target in active:
                raise _fail(
                    f"unsupported JSON-schema feature: recursive $ref {ref!r} at {path or '/'} "
                    "(recursive schemas are not supported by the outlines grammar backend)"
                )
            if target not in self.done:
                self.schema(sub, target, (*active, target))
                self.done.add(target)
        for key in _SCHEMA:
            if isinstance(node.get(key), dict):
                self.schema(node[key], f"{path}/{key}", active)
        for key in _SCHEMA_LISTS:
            if isinstance(node.get(key), list):
                for i, sub in enumerate(node[key]):
                    self.schema(sub, f"{path}/{key}/{i}", active)
        for key in _SCHEMA_MAPS:
            if isinstance(node.get(key), dict):
                for name, sub in node[key].items():
                    self.schema(sub, f"{path}/{key}/{name}", active)
