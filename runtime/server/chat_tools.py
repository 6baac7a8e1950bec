"""OpenAI tool calling on `/v1/chat/completions`: `tools` + `tool_choice` -> the prompt, the
constraint, and the tool calls of the response (plain and streamed).

- The tools reach the model through its chat template (`apply_chat_template(tools=...)`). A
  template that never mentions `tools` (the default model's) gets them as a system message that
  lists the functions' JSON and the call format instead, so the model always sees them.
- `tool_choice` "none": no tools in the prompt, no parsing. "auto" (the default with tools): the
  model decides; its text is parsed with the server's `--tool-call-parser` (tool_parsers.py), and
  the choice needs one. "required" / a named function: the output is constrained by a JSON schema
  (SGLang's scheme): `[{"name": <one of the tools>, "parameters": <its schema>}, ...]` (at least
  one; exactly one with `parallel_tool_calls: false`), or, named, that function's `parameters`
  object itself, so the arguments always parse and validate against the function's schema.
- Calls are answered in OpenAI's shape: `message.tool_calls = [{"id", "type": "function",
  "function": {"name", "arguments": <JSON string>}}]`, `content` null (or the text before the
  calls), `finish_reason: "tool_calls"`. Streaming: content before the calls streams as usual;
  the calls come as `tool_calls` deltas (the first one per call has `id`, `type` and the name with
  `arguments: ""`, the next carries the arguments), then the finishing chunk says "tool_calls".

Ownership: `ToolPlan` is built per request (frozen); `ToolStream` belongs to one streaming
response.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from radixlm.formats.tools import any_call_schema, function_specs, named_call_schema
from radixlm.runtime.server.errors import ApiError
from radixlm.runtime.server.tool_parsers import ToolCall, ToolCallParser, get_parser

_JSON_ONLY = "json"  # the "parser" of constrained (required / named) outputs


@dataclass(frozen=True)
class ToolPlan:
    tools: list[dict[str, Any]]  # OpenAI's tool objects, validated
    choice: str  # "auto" | "required" | "named"
    name: str | None  # the named function
    parser: ToolCallParser | None  # auto: the server's parser
    schema: dict[str, Any] | None  # required / named: the JSON schema of the whole output

    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """(content, calls) of a finished output; no calls: the text stays content."""
        if self.schema is None:
            assert self.parser is not None
            content, calls = self.parser.parse(text)
            return (content or None) if calls else text, calls
        try:
            value = json.loads(text)
        except ValueError:
            return text, []
        if self.name is not None:
            return None, [ToolCall(self.name, json.dumps(value, ensure_ascii=False))]
        calls = [
            ToolCall(c["name"], json.dumps(c["parameters"], ensure_ascii=False)) for c in value
        ]
        return None, calls


def plan_tools(
    tools: Any, tool_choice: Any, parallel: bool | None, parser_name: str | None
) -> ToolPlan | None:
    """Validate `tools` / `tool_choice`; None when no tool calls can happen."""
    if not tools:
        if tool_choice not in (None, "none", "auto"):
            raise ApiError(400, "tool_choice needs tools", "tool_choice")
        return None
    try:
        fns = function_specs(tools)
    except ValueError as exc:
        raise ApiError(400, str(exc), "tools") from None
    choice = "auto" if tool_choice is None else tool_choice
    if choice == "none":
        return None
    if choice == "auto":
        if parser_name is None:
            raise ApiError(
                400,
                "tool_choice 'auto' needs the server's --tool-call-parser (llama3, qwen25, "
                "hermes, mistral, pythonic); 'required' or a named function need none",
                "tool_choice",
            )
        return ToolPlan(list(tools), "auto", None, get_parser(parser_name), None)
    if choice == "required":
        return ToolPlan(list(tools), "required", None, None, any_call_schema(fns, parallel))
    if isinstance(choice, dict) and choice.get("type") == "function":
        name = (choice.get("function") or {}).get("name")
        try:
            schema = named_call_schema(fns, name)
        except ValueError as exc:
            raise ApiError(400, str(exc), "tool_choice") from None
        return ToolPlan(list(tools), "named", name, None, schema)
    raise ApiError(
        400,
        "tool_choice must be 'none', 'auto', 'required' or {'type': 'function', 'function': {'name': ...}}",
        "tool_choice",
    )


def template_mentions_tools(tokenizer: Any) -> bool:
    template = getattr(tokenizer, "chat_template", None)
    texts = template.values() if isinstance(template, dict) else [template or ""]
    return any("tools" in t for t in texts)


def tools_system_message(plan: ToolPlan) -> dict[str, str]:
    """The tools as a system message, for chat templates that do not render `tools`."""
    listed = "\n".join(json.dumps(t.get("function", t), ensure_ascii=False) for t in plan.tools)
    if plan.schema is not None or plan.parser is None:
        how = "Answer with the call as JSON only."
    else:
        how = f"To call a function, answer with {plan.parser.HINT} (one per call)."
    return {"role": "system", "content": f"You can call these functions:\n{listed}\n{how}"}


def tool_call_objects(calls: list[ToolCall]) -> list[dict[str, Any]]:
    return [
        {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
         "function": {"name": c.name, "arguments": c.arguments}}
        for c in calls
    ]  # fmt: skip


def apply_to_response(plan: ToolPlan, response: dict[str, Any]) -> dict[str, Any]:
    for choice in response["choices"]:
        if choice["finish_reason"] not in ("stop", None):
            continue  # cut by max_tokens (or aborted): no complete calls to report
        message = choice["message"]
        content, calls = plan.parse(message["content"] or "")
        if calls:
            message["content"] = content
            message["tool_calls"] = tool_call_objects(calls)
            choice["finish_reason"] = "tool_calls"
    return response


class ToolStream:
    """Filters one streaming response's chunks (StreamConverter's output) per choice index."""

    def __init__(self, plan: ToolPlan) -> None:
        self.plan = plan
        self.text: dict[int, str] = {}  # everything generated, per choice
        self.sent: dict[int, int] = {}  # characters of it sent as content

    def filter(self, chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for chunk in chunks:
            if not chunk["choices"]:
                out.append(chunk)
                continue
            choice = chunk["choices"][0]
            i = choice["index"]
            delta = choice.get("delta", {})
            if "role" in delta:
                out.append(chunk)
                continue
            if choice["finish_reason"] is None:
                self.text[i] = self.text.get(i, "") + (delta.pop("content", None) or "")
                send = self._sendable(i)
                if send:
                    delta["content"] = send
                # NOTE: reasoning deltas (reasoning_stream.py runs first) pass through.
                if send or delta.get("reasoning_content") or choice.get("logprobs"):
                    out.append(chunk)
                continue
            out.extend(self._finish(chunk, choice, i))
        return out

    def _sendable(self, i: int) -> str:
        """Content that can go now: none for constrained outputs, else up to where calls may start."""
        if self.plan.schema is not None:
            return ""
        text, sent = self.text[i], self.sent.get(i, 0)
        assert self.plan.parser is not None
        start = self.plan.parser.start(text)
        end = len(text) if start < 0 else start
        self.sent[i] = max(sent, end)
        return text[sent:end] if end > sent else ""

    def _finish(
        self, chunk: dict[str, Any], choice: dict[str, Any], i: int
    ) -> list[dict[str, Any]]:
        text, sent = self.text.get(i, ""), self.sent.get(i, 0)
        calls: list[ToolCall] = []
        content: str | None = None
        if choice["finish_reason"] == "stop":
            content, calls = self.plan.parse(text)
        out = []
        if calls:
            before = (content or "")[sent:]
            if before:
                out.append(self._delta(chunk, i, {"content": before}))
            for k, obj in enumerate(tool_call_objects(calls)):
                fn = obj["function"]
                head = {"index": k, "id": obj["id"], "type": "function",
                        "function": {"name": fn["name"], "arguments": ""}}  # fmt: skip
                out.append(self._delta(chunk, i, {"tool_calls": [head]}))
                args = {"index": k, "function": {"arguments": fn["arguments"]}}
                out.append(self._delta(chunk, i, {"tool_calls": [args]}))
            choice["finish_reason"] = "tool_calls"
        elif len(text) > sent:
            out.append(self._delta(chunk, i, {"content": text[sent:]}))
        out.append(chunk)
        return out

    @staticmethod
    def _delta(chunk: dict[str, Any], i: int, delta: dict[str, Any]) -> dict[str, Any]:
        choices = [{"index": i, "delta": delta, "logprobs": None, "finish_reason": None}]
        return {**chunk, "choices": choices}
