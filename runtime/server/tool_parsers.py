"""Tool-call parsers: a model's text -> OpenAI tool calls, in the formats SGLang names
(`--tool-call-parser`):

    llama3          Llama 3.x JSON: `{"name": f, "parameters": {...}}` objects (`;`-separated),
                    optionally after `<|python_tag|>`
    qwen25, hermes  `<tool_call>{"name": f, "arguments": {...}}</tool_call>` blocks (Qwen 2.5/3)
    mistral         `[TOOL_CALLS] [{"name": f, "arguments": {...}}, ...]`
    pythonic        `[f(a=1, b="x"), g()]` (Python call syntax, literal arguments)

A parser finds where tool calls start (`start`), so a stream can send the text before it as
content and hold back the rest; `parse(text)` returns the content before the calls and the calls.
Text that does not parse as calls stays content (a model may mention the format in prose).
Pure functions and frozen objects: safe from any thread.
"""

from __future__ import annotations

import ast
import json
import re
from abc import ABC, abstractmethod
from typing import Any, NamedTuple


class ToolCall(NamedTuple):
    name: str
    arguments: str  # a JSON object, as OpenAI sends it


class ParsedTools(NamedTuple):
    content: str
    calls: list[ToolCall]


class ToolCallParser(ABC):
    """One model family's tool-call format."""

    # How a call looks, for prompts whose chat template does not render tools itself.
    HINT = ""

    @abstractmethod
    def start(self, text: str) -> int:
        """Where tool calls begin in `text`, or -1 (a prefix of a marker at the end counts)."""

    @abstractmethod
    def parse_calls(self, text: str) -> list[ToolCall] | None:
        """The calls in `text` (which starts where `start` pointed); None if it does not parse."""

    def parse(self, text: str) -> ParsedTools:
        pos = self.start(text)
        if pos < 0:
            return ParsedTools(text, [])
        calls = self.parse_calls(text[pos:])
        if not calls:
            return ParsedTools(text, [])
        return ParsedTools(text[:pos].rstrip(), calls)


def _marker_start(text: str, marker: str) -> int:
    """Index of `marker` in `text`, or of a proper prefix of it that ends `text`; else -1."""
    pos = text.find(marker)
    if pos >= 0:
        return pos
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return len(text) - k
    return -1


def _call_from_object(obj: Any, args_key: str) -> ToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get(args_key, obj.get("arguments", obj.get("parameters", {})))
    if isinstance(args, str):  # some models send the arguments JSON-encoded
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False))


def _json_values(text: str) -> list[Any] | None:
    """Consecutive JSON values in `text`, separated by whitespace, `;` or `,`; None if junk."""
    decoder = json.JSONDecoder()
    values, i = [], 0
    while True:
        while i < len(text) and text[i] in " \t\r\n;,":
            i += 1
        if i == len(text):
            return values
        try:
            value, i = decoder.raw_decode(text, i)
        except ValueError:
            return None
        values.append(value)


class HermesParser(ToolCallParser):
    START, END = "<tool_call>", "</tool_call>"
    HINT = '<tool_call>{"name": <function name>, "arguments": {...}}</tool_call>'

    def start(self, text: str) -> int:
        return _marker_start(text, self.START)

    def parse_calls(self, text: str) -> list[ToolCall] | None:
        calls = []
        for body in re.findall(
            re.escape(self.START) + r"(.*?)(?:" + re.escape(self.END) + r"|$)", text, re.S
        ):
            values = _json_values(body.strip())
            if not values or len(values) != 1:
                return None
            call = _call_from_object(values[0], "arguments")
            if call is None:
                return None
            calls.append(call)
        return calls or None


class Llama3Parser(ToolCallParser):
    TAG = "<|python_tag|>"
    HINT = '{"name": <function name>, "parameters": {...}}'

    def start(self, text: str) -> int:
        tag = _marker_start(text, self.TAG)
        if tag >= 0:
            return tag
        stripped = text.lstrip()
        return len(text) - len(stripped) if stripped.startswith("{") else -1

    def parse_calls(self, text: str) -> list[ToolCall] | None:
        text = text.removeprefix(self.TAG)
        values = _json_values(text.strip())
        if not values:
            return None
        calls = [_call_from_object(v, "parameters") for v in values]
        return None if any(c is None for c in calls) else calls  # type: ignore[return-value]


class MistralParser(ToolCallParser):
    TAG = "[TOOL_CALLS]"
    HINT = '[TOOL_CALLS] [{"name": <function name>, "arguments": {...}}]'

    def start(self, text: str) -> int:
        return _marker_start(text, self.TAG)

    def parse_calls(self, text: str) -> list[ToolCall] | None:
        values = _json_values(text.removeprefix(self.TAG).strip())
        if not values:
            return None
        items = values[0] if len(values) == 1 and isinstance(values[0], list) else values
        calls = [_call_from_object(v, "arguments") for v in items]
        return None if not calls or any(c is None for c in calls) else calls  # type: ignore[return-value]


class PythonicParser(ToolCallParser):
    HINT = "[function_name(argument=value, ...)]"

    def start(self, text: str) -> int:
        stripped = text.lstrip()
        return len(text) - len(stripped) if stripped.startswith("[") else -1

    def parse_calls(self, text: str) -> list[ToolCall] | None:
        try:
            tree = ast.parse(text.strip(), mode="eval")
        except SyntaxError:
            return None
        if not isinstance(tree.body, ast.List):
            return None
        calls = []
        for node in tree.body.elts:
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
                return None
            try:
                args = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg}
            except ValueError:
                return None
            calls.append(ToolCall(node.func.id, json.dumps(args, ensure_ascii=False)))
        return calls or None


TOOL_CALL_PARSERS: dict[str, type[ToolCallParser]] = {
    "llama3": Llama3Parser,
    "qwen25": HermesParser,
    "qwen": HermesParser,
    "hermes": HermesParser,
    "mistral": MistralParser,
    "pythonic": PythonicParser,
}


def get_parser(name: str) -> ToolCallParser:
    return TOOL_CALL_PARSERS[name]()
