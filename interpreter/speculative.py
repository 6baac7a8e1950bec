"""Speculative execution (SGLang's `@function(num_api_spec_tokens=N)`): fewer requests per program.

A program such as `"Name:" + gen("name", stop="\\n") + "\\nBirthday:" + gen("birthday", stop="\\n")`
costs one request per `gen`, each re-sending the prompt. With speculation, the first `gen` asks
for max(its max_new_tokens, N) tokens with no stop string; the text is kept as `speculated_text`.
Each `gen` takes its value from the front of that text (up to its earliest stop string, else up to
its max_new_tokens characters), and each constant the program appends must be the next piece of
that text: then it is consumed; otherwise the speculation is dropped and the next `gen` asks
again.

The speculative request follows the program's own format where it is known (`format_regex`): the
constants and `gen`s the program has already sent after this one (the rest of its expression and
the expressions queued behind it) make a regex, each `gen` a run of text free of its one-character
stop strings followed by the constant, which starts with that stop. The model then writes exactly
what the program will consume: each value is sampled as the non-speculative program would sample
it (after the same text), and the constants are jumped over instead of re-sent in new prompts, so
the speculation is not dropped at a constant and costs fewer prompt tokens than one request per
`gen`. Beyond the known part the text is free.

Scope (as SGLang's completion path): outside chat roles, non-streaming, unconstrained `gen`s (no
regex / JSON schema / dtype, no logprobs); other `gen`s run normally. Owned by one executor's
worker thread: `speculated_text` lives on that executor and is passed in and returned here.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from radixlm.interpreter.backend import Backend
    from radixlm.lang.sampling import SamplingParams


def can_speculate(params: SamplingParams, role: str | None) -> bool:
    return (
        role is None
        and params.regex is None
        and params.json_schema is None
        and params.dtype is None
        and not params.return_logprob
    )


def consume_constant(speculated: str, value: str) -> str:
    """The speculation left after the program appends `value` ("" once it diverges)."""
    return speculated[len(value) :] if speculated.startswith(value) else ""


_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _escape(text: str) -> str:
    """`text` as a regex literal (control characters spelt `\\n`, not as raw characters)."""
    return "".join(_ESCAPES.get(c) or re.escape(c) for c in text)


def _stop_chars(params: SamplingParams) -> str:
    return "".join(s for s in (params.stop or ()) if len(s) == 1)


def format_regex(params: SamplingParams, ahead: Sequence[tuple[str, Any]]) -> str | None:
    """The regex of the text a speculative request for a `gen` with `params` should write, from
    what follows it: ("text", constant) or ("gen", its params, None when it cannot speculate).
    None when nothing known follows in a form the speculation can consume."""
    parts: list[str] = []
    stops = _stop_chars(params)  # the gen before the next constant
    for kind, value in ahead:
        if kind == "text":
            if not value:
                continue
            if stops is not None:
                if value[0] not in stops:
                    break  # NOTE: the gen's value would run into the constant: not consumable
                parts.append(f"[^{_escape(stops)}]*")
            parts.append(_escape(value))
            stops = None
        elif kind == "gen" and stops is None and value is not None and _stop_chars(value):
            stops = _stop_chars(value)
        else:
            break
    if not parts:
        return None
    return "".join(parts) + r"[\s\S]*"


def speculative_gen(
    backend: Backend,
    text: str,
    params: SamplingParams,
    speculated: str,
    num_tokens: int,
    spec_format: Callable[[], str | None] = lambda: None,
) -> tuple[str, dict[str, Any], str]:
    """`(value, meta_info, speculation left)` for one `gen` at the end of `text`;
    `spec_format()` is the regex a new speculative request follows (`format_regex`)."""
    meta: dict[str, Any] = {}
    max_chars = params.max_new_tokens or 128
    stops = [s for s in (params.stop or ()) if s]
    if not speculated or (not stops and len(speculated) < max_chars):
        ask = dataclasses.replace(
            params, max_new_tokens=max(params.max_new_tokens or 0, num_tokens), stop=(),
            regex=spec_format(),
        )  # fmt: skip
        speculated, meta = backend.generate(text, ask)
    positions = [p for p in (speculated.find(s) for s in stops) if p >= 0]
    end = min(positions) if positions else min(max_chars, len(speculated))
    return speculated[:end], meta, speculated[end:]
