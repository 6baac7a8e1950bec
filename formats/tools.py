"""Tool (function) declarations in OpenAI's format -> the JSON schema that constrains a call.

Shared by the language (`gen(tools=...)`) and the server's tool calling (runtime/server/
chat_tools.py), so both constrain calls the same way (SGLang's scheme):
- any of the tools: `[{"name": <one of them>, "parameters": <its parameters schema>}, ...]`, at
  least one call (exactly one with `parallel=False`);
- one named function: its `parameters` object itself.
Pure functions; errors are `ValueError`s whose message names the tool (`tools.<i>...`).

Bounds: a small model sampling a free-text string or an open list may never close it, and a call
cut by max_tokens does not parse. So in the constraint (not in what is validated) strings with
no `maxLength`, `enum`, `const`, `pattern` or `format` get `maxLength: STRING_BOUND`, and arrays
with no `maxItems` get `maxItems: ARRAY_BOUND`; a bounded call still validates against the
declared schema.
"""

from __future__ import annotations

from typing import Any

EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}
STRING_BOUND = 128
ARRAY_BOUND = 16


def bounded(schema: Any) -> Any:
    """A copy of `schema` with the bounds of the module docstring added."""
    if isinstance(schema, list):
        return [bounded(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: bounded(v) for k, v in schema.items()}
    if out.get("type") == "string" and not {
        "maxLength",
        "enum",
        "const",
        "pattern",
        "format",
    } & set(out):
        out["maxLength"] = STRING_BOUND
    if out.get("type") == "array" and "maxItems" not in out:
        out["maxItems"] = ARRAY_BOUND
    return out


def function_specs(tools: Any) -> list[dict[str, Any]]:
    """`[{"name", "description", "parameters"}]` of OpenAI tool objects (`{"type": "function",
    "function": {...}}`); ValueError naming the first bad one."""
    if not isinstance(tools, list) or not tools:
        raise ValueError("tools must be a non-empty list")
    specs = []
    for i, tool in enumerate(tools):
        where = f"tools.{i}"
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            raise ValueError(f"{where}: only tools of type 'function' are supported")
        fn = tool.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ValueError(f"{where}.function.name is required")
        params = fn.get("parameters", EMPTY_PARAMETERS)
        if not isinstance(params, dict):
            raise ValueError(f"{where}.function.parameters must be a JSON schema object")
        specs.append(
            {"name": fn["name"], "description": fn.get("description", ""), "parameters": params}
        )
    return specs


def any_call_schema(specs: list[dict[str, Any]], parallel: bool | None = None) -> dict[str, Any]:
    """The schema of a list of calls to any of `specs` (at least one; one if not `parallel`)."""
    items = [
        {"type": "object", "properties": {"name": {"const": f["name"]}, "parameters": bounded(f["parameters"])},
         "required": ["name", "parameters"], "additionalProperties": False}
        for f in specs
    ]  # fmt: skip
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": items}}
    schema["maxItems"] = 1 if parallel is False else ARRAY_BOUND
    return schema


def named_call_schema(specs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    for f in specs:
        if f["name"] == name:
            return bounded(f["parameters"])
    raise ValueError(f"tool_choice names {name!r}, which is not in tools")
