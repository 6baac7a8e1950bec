"""Sampling parameters of `gen` and of a program run, and their translation to the native protocol.

Ownership: `SamplingParams` is an immutable value. A `gen(...)` node holds one whose unset fields
are `None`; `Function.run(...)` builds the program's defaults; the executor merges the two with
`merge` (the `gen` wins field by field) and hands the result to a backend, which calls
`to_native` to build SGLang's `/generate` payload fields. Nothing here is shared mutable state.
"""

from __future__ import annotations

import dataclasses
import json
import re
import warnings
from collections.abc import Sequence
from typing import Any

# NOTE: the same patterns as SGLang's `sglang.lang.ir`, so that programs written for SGLang constrain
# `dtype=` generations identically (these are regexes for the runtime's token FSM, not for `re`).
REGEX_INT = r"[-+]?[0-9]+[ \n]*"
REGEX_FLOAT = r"[-+]?[0-9]*\.?[0-9]+[ \n]*"
REGEX_BOOL = r"(True|False)"
REGEX_STR = r"\"[\w\d\s]*\""

# Fields sent inside `sampling_params` of the native protocol (SGLang's `/generate`).
_ENGINE_FIELDS = (
    "max_new_tokens",
    "min_new_tokens",
    "stop",
    "stop_token_ids",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "ignore_eos",
    "regex",
    "json_schema",
    "ebnf",
)
# Fields sent at the top level of the native request.
_LOGPROB_FIELDS = (
    "return_logprob",
    "logprob_start_len",
    "top_logprobs_num",
    "return_text_in_logprobs",
)


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Sampling parameters; `None` means "not set here" (the run's default applies)."""

    max_new_tokens: int | None = None
    min_new_tokens: int | None = None
    stop: tuple[str, ...] | None = None
    stop_token_ids: tuple[int, ...] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    ignore_eos: bool | None = None
    return_logprob: bool | None = None
    logprob_start_len: int | None = None
    top_logprobs_num: int | None = None
    return_text_in_logprobs: bool | None = None
    dtype: str | None = None  # "int" | "float" | "str" | "bool"
    regex: str | None = None
    json_schema: str | None = None
    ebnf: str | None = None  # a GBNF or Lark grammar (the llguidance grammar backend)

    def merge(self, override: SamplingParams) -> SamplingParams:
        """Return these parameters with every field that `override` sets replaced by its value."""
        changes = {
            f.name: getattr(override, f.name)
            for f in dataclasses.fields(override)
            if getattr(override, f.name) is not None
        }
        return dataclasses.replace(self, **changes)

    def with_extra_stop(self, extra: Sequence[str]) -> SamplingParams:
        """Add stop strings (e.g. the chat template's end-of-turn string), keeping order, no duplicates."""
        if not extra:
            return self
        stops = list(self.stop or ())
        stops += [s for s in extra if s not in stops]
        return dataclasses.replace(self, stop=tuple(stops))

    def to_native(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """Translate to SGLang's native protocol: `(sampling_params, top_level_fields)`.

        `dtype` becomes a regex (and, for numbers, whitespace stop strings) as SGLang's
        `RuntimeEndpoint` does; unset fields are left out so the runtime's defaults apply.
        """
        params = self._dtype_to_regex()
        sampling: dict[str, Any] = {}
        for name in _ENGINE_FIELDS:
            value = getattr(params, name)
            if value is None:
                continue
            sampling[name] = list(value) if isinstance(value, tuple) else value
        extra = {name: getattr(params, name) for name in _LOGPROB_FIELDS}
        return sampling, {k: v for k, v in extra.items() if v is not None}

    def _dtype_to_regex(self) -> SamplingParams:
        if self.dtype is None:
            return self
        regex, stops = _DTYPE_REGEX[self.dtype]
        if self.regex is not None and self.regex != regex:
            warnings.warn(
                f"gen() got both dtype={self.dtype!r} and regex={self.regex!r}; dtype wins (as in SGLang)",
                stacklevel=2,
            )
        return dataclasses.replace(self, regex=regex, dtype=None).with_extra_stop(stops)


_DTYPE_REGEX: dict[str, tuple[str, tuple[str, ...]]] = {
    "int": (REGEX_INT, (" ", "\n")),
    "float": (REGEX_FLOAT, (" ", "\n")),
    "str": (REGEX_STR, ()),
    "bool": (REGEX_BOOL, ()),
}

# The defaults of `Function.run` / `run_batch`, SGLang's values.
RUN_DEFAULTS = SamplingParams(
    max_new_tokens=128,
    stop=(),
    stop_token_ids=(),
    temperature=1.0,
    top_p=1.0,
    top_k=-1,
    min_p=0.0,
    frequency_penalty=0.0,
    presence_penalty=0.0,
    ignore_eos=False,
)


def normalize_stop(stop: str | Sequence[str] | None) -> tuple[str, ...] | None:
    """`"x"` -> `("x",)`; a list -> a tuple; `None` stays `None`."""
    if stop is None:
        return None
    if isinstance(stop, str):
        return (stop,)
    stops = tuple(stop)
    if not all(isinstance(s, str) for s in stops):
        raise TypeError(f"stop must be a string or a list of strings, got {stop!r}")
    return stops


def normalize_dtype(dtype: type | str | None) -> str | None:
    """Accept `int`, `float`, `str`, `bool` or their names, as SGLang does."""
    if dtype is None:
        return None
    name = dtype.__name__ if isinstance(dtype, type) else str(dtype)
    if name not in _DTYPE_REGEX:
        raise ValueError(f"dtype must be one of int, float, str, bool; got {dtype!r}")
    return name


def normalize_json_schema(schema: Any) -> str | None:
    """A JSON-schema string, a dict, or a pydantic model class -> a JSON-schema string."""
    if schema is None:
        return None
    if isinstance(schema, str):
        try:
            json.loads(schema)
        except json.JSONDecodeError as e:
            raise ValueError(f"json_schema is not valid JSON: {e}") from e
        return schema
    if isinstance(schema, dict):
        return json.dumps(schema)
    model_json_schema = getattr(schema, "model_json_schema", None)
    if callable(model_json_schema):  # a pydantic v2 model class
        return json.dumps(model_json_schema())
    raise TypeError(
        f"json_schema must be a JSON string, a dict or a pydantic model class; got {type(schema).__name__}"
    )


def check_ebnf(ebnf: str | None) -> str | None:
    """Reject a grammar that is not a non-empty string (the runtime compiles and checks it)."""
    if ebnf is not None and (not isinstance(ebnf, str) or not ebnf.strip()):
        raise ValueError(f"ebnf must be a non-empty grammar string, got {ebnf!r}")
    return ebnf


def check_regex(regex: str | None) -> str | None:
    """Reject a regex that does not even compile in Python (SGLang does the same check)."""
    if regex is not None:
        try:
            re.compile(regex)
        except re.error as e:
            raise ValueError(f"invalid regex {regex!r}: {e}") from e
    return regex
