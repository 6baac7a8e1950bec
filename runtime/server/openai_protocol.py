"""Request bodies of the OpenAI-compatible API (`/v1/completions`, `/v1/chat/completions`).

Field names are OpenAI's; the SGLang extensions (`top_k`, `min_p`, `regex`, `json_schema`, `ebnf`,
`ignore_eos`, ...) are accepted as extra body fields, as SGLang and vLLM do. Like OpenAI, unknown
top-level fields are rejected (400 naming them). Fields OpenAI clients commonly send that do not
change a completion here (`user`, `metadata`, `store`, `service_tier`, ...) are accepted and
ignored; fields that would change it but are not implemented (`tools`, `audio`, `suffix`, ...)
are rejected by `openai_serving` when set. Chat messages tolerate extra keys, since clients echo
back whole assistant messages (`refusal`, `annotations`, ...).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from radixlm.runtime.server.protocol import StrictModel


class StreamOptions(StrictModel):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class JsonSchemaFormat(StrictModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(StrictModel):
    type: Literal["text", "json_object", "json_schema", "grammar"]
    json_schema: JsonSchemaFormat | None = None
    grammar: str | None = None  # type "grammar": an EBNF (GBNF or Lark) grammar, as `ebnf`


class _SamplingExtras(StrictModel):
    """Fields shared by both endpoints: OpenAI's sampling fields and SGLang's extensions."""

    model: str | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    n: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    response_format: ResponseFormat | None = None
    # SGLang / vLLM extensions (extra body fields).
    top_k: int | None = None
    min_p: float | None = None
    min_tokens: int | None = None
    repetition_penalty: float | None = None
    regex: str | None = None
    json_schema: str | None = None
    ebnf: str | None = None
    stop_token_ids: list[int] | None = None
    no_stop_trim: bool | None = None
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    rid: str | None = None
    # Accepted and ignored: they do not change the completion.
    user: str | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    priority: int | None = None


class CompletionRequest(_SamplingExtras):
    """`POST /v1/completions`."""

    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool | None = False
    best_of: int | None = None
    suffix: str | None = None  # rejected when set


class ContentPart(BaseModel):
    """One part of a message's content; only text parts are supported."""

    model_config = ConfigDict(extra="allow")

    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None


class ChatCompletionRequest(_SamplingExtras):
    """`POST /v1/chat/completions`."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = None
    # Accepted and ignored.
    parallel_tool_calls: bool | None = None
    reasoning_effort: str | None = None
    verbosity: str | None = None
    modalities: list[str] | None = None
    # SGLang chat extensions.
    continue_final_message: bool | None = False
    chat_template_kwargs: dict[str, Any] | None = None
    separate_reasoning: bool | None = None
    stream_reasoning: bool | None = None
    # OpenAI tool calling (chat_tools.py).
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    # Rejected when set (not implemented).
    functions: list[Any] | None = None
    function_call: Any = None
    audio: Any = None
    prediction: Any = None
    web_search_options: Any = None


UNSUPPORTED_CHAT_FIELDS = (
    "functions",
    "function_call",
    "audio",
    "prediction",
    "web_search_options",
)
