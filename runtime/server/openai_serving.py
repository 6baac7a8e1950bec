"""OpenAI requests -> engine requests (`RequestBatch`es of `GenerateInput`s).

- sampling: `max_tokens` / `max_completion_tokens` -> max_new_tokens, `min_tokens` ->
  min_new_tokens; temperature, top_p, seed, stop, n, penalties, logit_bias and SGLang's extras map
  to the same-named sampling params; `response_format` json_object -> json_schema `{"type":
  "object"}`, json_schema -> its schema, grammar (`{"type": "grammar", "grammar": ...}`) -> ebnf;
  `regex` / `json_schema` / `ebnf` extra fields as is.
- chat: the tokenizer's chat template renders the messages (`add_generation_prompt`), then the
  text is tokenized without adding special tokens again (the template has them).
- defaults: completions max_tokens 16 (OpenAI's); chat: up to the context length.
Errors name OpenAI's field (`RENAME_*` maps engine names back).
"""

from __future__ import annotations

import json
from typing import Any

from jinja2 import TemplateError

from radixlm.runtime.frontend import request_batch
from radixlm.runtime.frontend.request_batch import RequestBatch
from radixlm.runtime.server.chat_tools import (
    ToolPlan,
    template_mentions_tools,
    tools_system_message,
)
from radixlm.runtime.server.errors import ApiError
from radixlm.runtime.server.openai_protocol import (
    UNSUPPORTED_CHAT_FIELDS,
    ChatCompletionRequest,
    CompletionRequest,
)
from radixlm.runtime.server.reasoning_parsers import REASONING_PARSERS
from radixlm.runtime.server.state import ServerState

MAX_TOP_LOGPROBS = 20
_COMMON_RENAME = {"min_new_tokens": "min_tokens", "sampling_params": "body"}
RENAME_COMPLETION = {
    **_COMMON_RENAME, "max_new_tokens": "max_tokens", "text": "prompt", "input_ids": "prompt",
    "top_logprobs_num": "logprobs", "logprob_start_len": "echo",
}  # fmt: skip
RENAME_CHAT = {
    **_COMMON_RENAME, "max_new_tokens": "max_completion_tokens", "text": "messages",
    "input_ids": "messages", "top_logprobs_num": "top_logprobs",
}  # fmt: skip
_SAME_NAME = (
    "temperature", "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty",
    "repetition_penalty", "seed", "stop", "stop_token_ids", "ignore_eos", "no_stop_trim",
    "skip_special_tokens", "spaces_between_special_tokens", "logit_bias", "n", "regex",
    "json_schema", "ebnf",
)  # fmt: skip


def sampling_params(
    req: CompletionRequest | ChatCompletionRequest, max_new_tokens: int
) -> dict[str, Any]:
    if req.stream_options is not None and not req.stream:
        raise ApiError(  # NOTE: OpenAI's 400 too
            400, "stream_options is only allowed when stream is true", "stream_options"
        )
    sp: dict[str, Any] = {"max_new_tokens": max_new_tokens}
    for name in _SAME_NAME:
        value = getattr(req, name)
        if value is not None:
            sp[name] = value
    if req.min_tokens is not None:
        sp["min_new_tokens"] = req.min_tokens
    fmt = req.response_format
    if fmt is not None and fmt.type == "grammar":
        if not fmt.grammar:
            raise ApiError(400, "response_format grammar needs a grammar string", "response_format")
        if any(k in sp for k in ("ebnf", "regex", "json_schema")):
            raise ApiError(
                400, "give either response_format or ebnf / regex / json_schema", "response_format"
            )
        sp["ebnf"] = fmt.grammar
    elif fmt is not None and fmt.type != "text":
        if "json_schema" in sp:
            raise ApiError(
                400, "give either response_format or json_schema, not both", "response_format"
            )
        schema = fmt.json_schema.schema_ if fmt.type == "json_schema" and fmt.json_schema else None
        if fmt.type == "json_schema" and fmt.json_schema is None:
            raise ApiError(
                400, "response_format json_schema needs a json_schema object", "response_format"
            )
        sp["json_schema"] = json.dumps(schema if schema is not None else {"type": "object"})
    return sp


def completion_batch(req: CompletionRequest) -> RequestBatch:
    if req.suffix:
        raise ApiError(400, "suffix is not supported", "suffix")
    n = req.n or 1
    if req.best_of is not None and req.best_of != n:
        raise ApiError(400, "best_of is not supported (only best_of == n)", "best_of")
    logprobs = req.logprobs
    if logprobs is not None and not 0 <= logprobs <= MAX_TOP_LOGPROBS:
        raise ApiError(
            400, f"logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {logprobs}", "logprobs"
        )
    max_tokens = 16 if req.max_tokens is None else req.max_tokens
    if max_tokens < 0:
        raise ApiError(400, f"max_tokens must be >= 0, got {max_tokens}", "max_tokens")
    prompt = req.prompt
    if isinstance(prompt, list) and not prompt:
        raise ApiError(400, "prompt is empty", "prompt")
    as_ids = isinstance(prompt, list) and isinstance(prompt[0], int | list)
    want_lp = logprobs is not None
    return request_batch.expand_request(
        prompt=None if as_ids else prompt,
        input_ids=prompt if as_ids else None,
        sampling_params=sampling_params(req, max_tokens),
        return_logprob=want_lp,
        logprob_start_len=0 if (want_lp and req.echo) else None,
        top_logprobs_num=logprobs or 0,
        return_text_in_logprobs=want_lp,
        stream=bool(req.stream),
        rid=req.rid,
    )


def chat_batch(
    req: ChatCompletionRequest, state: ServerState, tools: ToolPlan | None = None
) -> RequestBatch:
    for name in UNSUPPORTED_CHAT_FIELDS:
        # NOTE: "set" includes an empty value: `web_search_options: {}` asks for web search
        if getattr(req, name) is not None:
            raise ApiError(400, f"{name} is not supported by radixlm", name)
    if req.top_logprobs is not None:
        if not req.logprobs:
            raise ApiError(400, "top_logprobs needs logprobs: true", "top_logprobs")
        if not 0 <= req.top_logprobs <= MAX_TOP_LOGPROBS:
            msg = f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {req.top_logprobs}"
            raise ApiError(400, msg, "top_logprobs")
    ids = chat_prompt_ids(req, state.tokenizer, tools)
    given = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    name = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    if given is not None and given < 1:
        raise ApiError(400, f"{name} must be >= 1, got {given}", name)
    tm = state.engine
    limit = min(tm.context_len, tm.max_total_tokens)
    max_new = given if given is not None else max(1, limit - len(ids))
    sp = sampling_params(req, max_new)
    if tools is not None and tools.schema is not None:
        taken = [k for k in ("json_schema", "regex", "ebnf") if k in sp]
        if taken:
            raise ApiError(400, f"tool_choice {tools.choice!r} constrains the output: drop {taken[0]}",
                           "tool_choice")  # fmt: skip
        sp["json_schema"] = json.dumps(tools.schema)
    parser = state.args.reasoning_parser
    if (
        parser
        and req.separate_reasoning is not False
        and constrained(sp)
        and state.tokenizer is not None
    ):
        # NOTE: the constraint applies to the answer only, after `</think>` (reasoning.py).
        sp.update(REASONING_PARSERS[parser].grammar_params(state.tokenizer))
    return request_batch.expand_request(
        input_ids=ids,
        sampling_params=sp,
        return_logprob=bool(req.logprobs),
        top_logprobs_num=req.top_logprobs or 0,
        return_text_in_logprobs=bool(req.logprobs),
        stream=bool(req.stream),
        rid=req.rid,
    )


def constrained(sp: dict[str, Any]) -> bool:
    return any(sp.get(k) is not None for k in ("regex", "json_schema", "choices", "ebnf"))


def chat_prompt_ids(
    req: ChatCompletionRequest, tokenizer: Any, tools: ToolPlan | None = None
) -> list[int]:
    if tokenizer is None:
        raise ApiError(
            400, "chat needs a tokenizer (the server runs with skip_tokenizer_init)", "messages"
        )
    if not getattr(tokenizer, "chat_template", None):
        raise ApiError(400, "the model has no chat template; use /v1/completions", "messages")
    messages = []
    for i, msg in enumerate(req.messages):
        content = msg.content
        if isinstance(content, list):
            texts = []
            for part in content:
                if part.type != "text" or part.text is None:
                    raise ApiError(400, f"content part type {part.type!r} is not supported (text only)",
                                   f"messages.{i}.content")  # fmt: skip
                texts.append(part.text)
            content = "\n".join(texts)
        role = "system" if msg.role == "developer" else msg.role
        message: dict[str, Any] = {"role": role, "content": content or ""}
        for key in ("tool_calls", "tool_call_id", "name"):  # tool-use turns, for the template
            if getattr(msg, key, None) is not None:
                message[key] = getattr(msg, key)
        messages.append(message)
    cont = bool(req.continue_final_message)
    template_kwargs = dict(req.chat_template_kwargs or {})
    if tools is not None:
        if template_mentions_tools(tokenizer):
            template_kwargs["tools"] = tools.tools
        else:
            messages.insert(0, tools_system_message(tools))
    try:
        text = tokenizer.apply_chat_template(
            messages,
            tokenize=False,
            add_generation_prompt=not cont,
            continue_final_message=cont,
            **template_kwargs,
        )
    except (TemplateError, ValueError, TypeError) as exc:
        raise ApiError(
            400, f"the chat template failed on these messages: {exc}", "messages"
        ) from exc
    return tokenizer.encode(text, add_special_tokens=False)
