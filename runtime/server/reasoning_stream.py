"""`--reasoning-parser` on `/v1/chat/completions`: `message.reasoning_content` (plain) and
`delta.reasoning_content` (streaming) hold the `<think>` section, `content` the answer. On by
default when the server has a parser; `separate_reasoning: false` (SGLang's field) keeps the raw
text. Runs before tool-call parsing, which then sees only the answer.

Ownership: `ReasoningChunks` belongs to one streaming response.
"""

from __future__ import annotations

from typing import Any

from radixlm.runtime.server.reasoning_parsers import ReasoningParser, ReasoningStream


def apply_to_response(parser: ReasoningParser, response: dict[str, Any]) -> dict[str, Any]:
    for choice in response["choices"]:
        message = choice["message"]
        reasoning, content = parser.split(message["content"] or "")
        message["reasoning_content"] = reasoning
        message["content"] = content
    return response


class ReasoningChunks:
    """Rewrites StreamConverter's content deltas into reasoning_content / content deltas."""

    def __init__(self, parser: ReasoningParser) -> None:
        self.parser = parser
        self.text: dict[int, str] = {}
        self.streams: dict[int, ReasoningStream] = {}

    def filter(self, chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for chunk in chunks:
            if not chunk["choices"] or "role" in chunk["choices"][0].get("delta", {}):
                out.append(chunk)
                continue
            choice = chunk["choices"][0]
            i, delta = choice["index"], choice.get("delta", {})
            stream = self.streams.setdefault(i, ReasoningStream(self.parser))
            self.text[i] = self.text.get(i, "") + (delta.pop("content", None) or "")
            final = choice["finish_reason"] is not None
            reasoning, content = stream.feed(self.text[i], final)
            if final and (reasoning or content):
                body = {"index": i, "delta": {}, "logprobs": None, "finish_reason": None}
                out.append({**chunk, "choices": [body]})
                target = body["delta"]
            else:
                target = delta
            if reasoning:
                target["reasoning_content"] = reasoning
            if content:
                target["content"] = content
            if final or reasoning or content or choice.get("logprobs"):
                out.append(chunk)
        return out
