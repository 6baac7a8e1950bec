"""Splitting a reasoning model's `<think>...</think>` section from its answer (SGLang's reasoning
parsers, by model type). Pure functions, shared by the language (`separate_reasoning`) and the
server (`--reasoning-parser`, runtime/server/reasoning_parsers.py).

    qwen3        the output may open with `<think>`; reasoning runs to `</think>`. An output
                 without `<think>` is all answer (thinking disabled in the template).
    deepseek-r1  the chat template already opened `<think>`, so the output starts inside the
                 reasoning (a leading `<think>` is tolerated); an unclosed section is all reasoning.
"""

from __future__ import annotations

from typing import NamedTuple

THINK, END_THINK = "<think>", "</think>"
# model type -> whether the output starts inside the reasoning section
MODEL_TYPES = {"qwen3": False, "deepseek-r1": True}


class Split(NamedTuple):
    reasoning: str | None  # None: no reasoning section
    content: str


def split_reasoning(text: str, model_type: str) -> Split:
    if model_type not in MODEL_TYPES:
        raise ValueError(
            f"reasoning model_type must be one of {sorted(MODEL_TYPES)}, got {model_type!r}"
        )
    body = text.lstrip()
    if body.startswith(THINK):
        body = body[len(THINK) :]
    elif MODEL_TYPES[model_type]:
        body = text
    else:
        return Split(None, text)
    end = body.find(END_THINK)
    if end < 0:
        return Split(body.strip(), "")
    return Split(body[:end].strip(), body[end + len(END_THINK) :].lstrip())
