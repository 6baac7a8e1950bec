"""Speculative execution (SGLang's `@function(num_api_spec_tokens=N)`): fewer requests per program.

A program such as `"Name:" + gen("name", stop="\\n") + "\\nBirthday:" + gen("birthday", stop="\\n")`
costs one request per `gen`, each re-sending the prompt. With speculation, the first `gen` asks
for max(its max_new_tokens, N) tokens with no stop string; the text is kept as `speculated_text`.
Each `gen` takes its value from the front of that text (up to its earliest stop string, else up to
its max_new_tokens characters), and each constant the program appends must be the next piece of
that text: then it is consumed; otherwise the speculation is dropped and the next `gen` asks
again. The values are exactly what the model wrote, so the result is what the program would get
if the model, unprompted, continued the same way.

Scope (as SGLang's completion path): outside chat roles, non-streaming, unconstrained `gen`s (no
regex / JSON schema / dtype, no logprobs); other `gen`s run normally. Owned by one executor's
worker thread: `speculated_text` lives on that executor and is passed in and returned here.
"""

from __future__ import annotations

import dataclasses
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


def speculative_gen(
    backend: Backend, text: str, params: SamplingParams, speculated: str, num_tokens: int
) -> tuple[str, dict[str, Any], str]:
    """`(value, meta_info, speculation left)` for one `gen` at the end of `text`."""
    meta: dict[str, Any] = {}
    max_chars = params.max_new_tokens or 128
    stops = [s for s in (params.stop or ()) if s]
    if not speculated or (not stops and len(speculated) < max_chars):
        ask = dataclasses.replace(
            params, max_new_tokens=max(params.max_new_tokens or 0, num_tokens), stop=()
        )
        speculated, meta = backend.generate(text, ask)
    positions = [p for p in (speculated.find(s) for s in stops) if p >= 0]
    end = min(positions) if positions else min(max_chars, len(speculated))
    return speculated[:end], meta, speculated[end:]
