"""Reasoning parsers (`--reasoning-parser`, SGLang's names): split a reasoning model's
`<think>...</think>` section from its answer (the split itself: formats/reasoning.py).

    qwen3        Qwen3: the output may open with `<think>`; reasoning runs to `</think>`. An output
                 without `<think>` is all answer (thinking disabled in the template).
    deepseek-r1  DeepSeek-R1: the chat template already opened `<think>`, so the output starts
                 inside the reasoning (a leading `<think>` is tolerated); everything up to
                 `</think>` is reasoning, and an output that never closes it is all reasoning.

`grammar_params(tokenizer)`: the sampling params that leave the reasoning unconstrained.
`split(text)` works on a finished text; `ReasoningStream` splits a growing text for streaming
(text that may be the start of a tag is held back). Pure functions and per-response objects.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from radixlm.formats.reasoning import END_THINK, MODEL_TYPES, THINK, Split, split_reasoning


@dataclass(frozen=True)
class ReasoningParser:
    name: str
    starts_inside: bool  # the prompt already opened <think> (deepseek-r1)

    def split(self, text: str) -> Split:
        return split_reasoning(text, self.name)

    def grammar_params(self, tokenizer: Any) -> dict[str, list[int]]:
        """Sampling params that make a constraint start after the reasoning
        (constrained/reasoning.py): the `</think>` ids, and `<think>`'s unless the output starts
        inside the reasoning. Markers of several ordinary tokens are matched on their text."""

        def ids(tag: str) -> list[int]:
            return list(tokenizer.encode(tag, add_special_tokens=False))

        params = {"think_end_ids": ids(END_THINK)}
        if not self.starts_inside:
            params["think_start_ids"] = ids(THINK)
        return params


REASONING_PARSERS = {name: ReasoningParser(name, inside) for name, inside in MODEL_TYPES.items()}


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest proper prefix of `tag` that ends `text`."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


class ReasoningStream:
    """Splits one choice's cumulative text as it grows: `feed(text)` -> (reasoning delta, content
    delta), `finish()` -> the rest. The split of the whole text equals `parser.split(text)` up to
    the whitespace next to the tags."""

    def __init__(self, parser: ReasoningParser) -> None:
        self.parser = parser
        self.sent_reasoning = 0  # characters of the reasoning part already sent
        self.sent_content = 0

    def _parts(self, text: str, final: bool) -> tuple[str, str]:
        body = text.lstrip()
        if not final and len(body) < len(THINK) and THINK.startswith(body):
            return "", ""  # may still become <think>
        opened = body.startswith(THINK)
        if not opened and not self.parser.starts_inside:
            return "", text
        body = body[len(THINK) :] if opened else text
        end = body.find(END_THINK)
        if end >= 0:
            return body[:end], body[end + len(END_THINK) :]
        hold = 0 if final else _partial_suffix(body, END_THINK)
        return body[: len(body) - hold], ""

    def feed(self, text: str, final: bool = False) -> tuple[str, str]:
        # NOTE: leading whitespace is dropped from both parts, consistently as the text grows.
        reasoning, content = (part.lstrip() for part in self._parts(text, final))
        r_delta = reasoning[self.sent_reasoning :]
        c_delta = content[self.sent_content :]
        self.sent_reasoning += len(r_delta)
        self.sent_content += len(c_delta)
        return r_delta, c_delta
