"""The primitives a program appends to its state, with SGLang's names and arguments.

Each primitive only builds an immutable IR node (see `ir.py`); nothing runs until the node is
appended to a state (`s += gen(...)`). Argument errors (bad regex, bad schema, unknown dtype)
are raised here, at the line of the program that wrote them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from radixlm.formats.reasoning import MODEL_TYPES
from radixlm.formats.tools import any_call_schema, function_specs, named_call_schema
from radixlm.lang.choices import ChoicesSamplingMethod, resolve_choices_method
from radixlm.lang.errors import UnsupportedFeatureError
from radixlm.lang.ir import (
    Expr,
    ExprList,
    Gen,
    RoleBegin,
    RoleEnd,
    Select,
    SeparateReasoning,
    as_expr,
    walk,
)
from radixlm.lang.sampling import (
    SamplingParams,
    check_ebnf,
    check_regex,
    normalize_dtype,
    normalize_json_schema,
    normalize_stop,
)


def gen(
    name: str | None = None,
    max_tokens: int | None = None,
    min_tokens: int | None = None,
    stop: str | Sequence[str] | None = None,
    stop_token_ids: Sequence[int] | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    frequency_penalty: float | None = None,
    presence_penalty: float | None = None,
    ignore_eos: bool | None = None,
    return_logprob: bool | None = None,
    logprob_start_len: int | None = None,
    top_logprobs_num: int | None = None,
    return_text_in_logprobs: bool | None = None,
    dtype: type | str | None = None,
    choices: Sequence[str] | None = None,
    choices_method: ChoicesSamplingMethod | str | None = None,
    regex: str | None = None,
    json_schema: Any = None,
    ebnf: str | None = None,
    tools: list[dict[str, Any]] | None = None,
    tool_choice: str = "required",
) -> Gen | Select:
    """Generate text into variable `name`.

    Unset arguments take the run's defaults (`f.run(temperature=..., max_new_tokens=...)`).
    `regex` / `json_schema` (a JSON-schema string, a dict or a pydantic model class) constrain
    the output, and so does `ebnf` (a GBNF `root ::= ...` or Lark `start: ...` grammar; the
    runtime's llguidance grammar backend compiles it); `dtype` (`int`, `float`, `str`, `bool`) is
    a shorthand for SGLang's regexes; `choices` makes this a `select`. `tools` (OpenAI tool
    objects) makes this a tool call, constrained by the tools' schemas (formats/tools.py): with
    `tool_choice="required"` the value is a JSON list `[{"name", "parameters"}, ...]` of calls to
    any of them, with a function's name it is that function's arguments object.
    """
    if tools is not None:
        if regex is not None or json_schema is not None or ebnf is not None or dtype is not None:
            raise ValueError(
                "tools constrain the output: give no regex, json_schema, ebnf or dtype"
            )
        specs = function_specs(tools)
        json_schema = (
            any_call_schema(specs)
            if tool_choice == "required"
            else named_call_schema(specs, tool_choice)
        )
    if choices:
        return select(name, choices, 0.0 if temperature is None else temperature, choices_method)
    if max_tokens is not None and max_tokens < 0:
        raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
    params = SamplingParams(
        max_new_tokens=max_tokens,
        min_new_tokens=min_tokens,
        stop=normalize_stop(stop),
        stop_token_ids=None if stop_token_ids is None else tuple(stop_token_ids),
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        min_p=min_p,
        frequency_penalty=frequency_penalty,
        presence_penalty=presence_penalty,
        ignore_eos=ignore_eos,
        return_logprob=return_logprob,
        logprob_start_len=logprob_start_len,
        top_logprobs_num=top_logprobs_num,
        return_text_in_logprobs=return_text_in_logprobs,
        dtype=normalize_dtype(dtype),
        regex=check_regex(regex),
        json_schema=normalize_json_schema(json_schema),
        ebnf=check_ebnf(ebnf),
    )
    return Gen(name, params)


def gen_int(name: str | None = None, max_tokens: int | None = None, **kwargs: Any) -> Gen:
    """Generate an integer (SGLang's `REGEX_INT`); other arguments as `gen`."""
    node = gen(name, max_tokens, dtype=int, **kwargs)
    assert isinstance(node, Gen)
    return node


def gen_string(name: str | None = None, max_tokens: int | None = None, **kwargs: Any) -> Gen:
    """Generate a double-quoted string (SGLang's `REGEX_STR`); other arguments as `gen`."""
    node = gen(name, max_tokens, dtype=str, **kwargs)
    assert isinstance(node, Gen)
    return node


def select(
    name: str | None = None,
    choices: Sequence[str] | None = None,
    temperature: float = 0.0,
    choices_method: ChoicesSamplingMethod | str | None = None,
) -> Select:
    """Append the most likely of `choices` and store it in variable `name`.

    All choices are scored in one batched call from the model's input-token log-probabilities;
    `choices_method` is `token_length_normalized` (default), `greedy_token_selection` or
    `unconditional_likelihood_normalized` (an object from `radixlm` or its name).
    """
    if not choices:
        raise ValueError("select() needs a non-empty list of choices")
    if isinstance(choices, str) or not all(isinstance(c, str) for c in choices):
        raise TypeError(f"choices must be a list of strings, got {choices!r}")
    if "" in choices:
        # NOTE: the same rule as the `choices` sampling parameter: "" is never a choice.
        raise ValueError("select() choices must be non-empty strings (got the empty string)")
    return Select(name, tuple(choices), float(temperature), resolve_choices_method(choices_method))


def _role(role: str, expr: object | None) -> ExprList:
    if expr is None:
        return ExprList((RoleBegin(role), RoleEnd(role)))
    return ExprList((RoleBegin(role), as_expr(expr), RoleEnd(role)))


def system(expr: object | None = None) -> ExprList:
    """A system message whose content is `expr` (text and/or expressions)."""
    return _role("system", expr)


def user(expr: object | None = None) -> ExprList:
    """A user message whose content is `expr`."""
    return _role("user", expr)


def assistant(expr: object | None = None) -> ExprList:
    """An assistant message whose content is `expr` (typically a `gen`)."""
    return _role("assistant", expr)


def system_begin() -> RoleBegin:
    return RoleBegin("system")


def system_end() -> RoleEnd:
    return RoleEnd("system")


def user_begin() -> RoleBegin:
    return RoleBegin("user")


def user_end() -> RoleEnd:
    return RoleEnd("user")


def assistant_begin() -> RoleBegin:
    return RoleBegin("assistant")


def assistant_end() -> RoleEnd:
    return RoleEnd("assistant")


def image(path: Any) -> Expr:
    """Not supported: radixlm runs text-only models."""
    raise UnsupportedFeatureError(
        "radixlm does not support multimodal inputs: image() cannot be used (text-only models)"
    )


def video(path: Any, num_frames: int = 0) -> Expr:
    """Not supported: radixlm runs text-only models."""
    raise UnsupportedFeatureError(
        "radixlm does not support multimodal inputs: video() cannot be used (text-only models)"
    )


def separate_reasoning(expr: Expr, model_type: str) -> ExprList:
    """SGLang's `separate_reasoning(gen("answer"), model_type="qwen3")`: run `expr`, then split the
    `<think>` section off each named `gen` / `select` in it (formats/reasoning.py): `s["answer"]` and
    the state's text keep the answer, `s["answer_reasoning_content"]` the reasoning."""
    if model_type not in MODEL_TYPES:
        raise ValueError(f"model_type must be one of {sorted(MODEL_TYPES)}, got {model_type!r}")
    names = [n.name for n in walk(expr) if isinstance(n, Gen | Select) and n.name]
    if not names:
        raise ValueError("separate_reasoning needs a named gen or select")
    return ExprList((expr, *(SeparateReasoning(name, model_type) for name in names)))
