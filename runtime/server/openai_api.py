"""The OpenAI-compatible endpoints (any OpenAI client with `base_url=http://host:port/v1` works):

    GET  /v1/models, /v1/models/{model}
    POST /v1/completions         prompt: str | [str] | [int] | [[int]]; echo, logprobs, n, stop, ...
    POST /v1/chat/completions    messages through the model's chat template; logprobs/top_logprobs,
                                 response_format (json_object | json_schema), `regex` extra field
Streaming: `data: {chunk}` events, then `data: [DONE]`; with `stream_options.include_usage` every
chunk carries `"usage": null` and a last chunk with empty `choices` carries the usage. Errors use
OpenAI's shape `{"error": {"message", "type", "param", "code"}}` with OpenAI's field names.
The `model` field is not checked (any name reaches the one served model), as in SGLang.
Threading: handlers run on uvicorn's event loop.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from radixlm.runtime.errors import RadixLMError
from radixlm.runtime.frontend import request_batch
from radixlm.runtime.frontend.request_batch import RequestBatch
from radixlm.runtime.server import openai_format as fmt
from radixlm.runtime.server import reasoning_stream
from radixlm.runtime.server.chat_tools import ToolStream, apply_to_response, plan_tools
from radixlm.runtime.server.errors import ApiError, to_api_error
from radixlm.runtime.server.http_utils import (
    SSE_DONE,
    SSEResponse,
    first_item,
    json_response,
    parse_body,
    run_until_disconnect,
    sse_event,
)
from radixlm.runtime.server.logprob_tokens import TokenBytes
from radixlm.runtime.server.openai_protocol import ChatCompletionRequest, CompletionRequest
from radixlm.runtime.server.openai_serving import (
    RENAME_CHAT,
    RENAME_COMPLETION,
    chat_batch,
    completion_batch,
)
from radixlm.runtime.server.reasoning_parsers import REASONING_PARSERS
from radixlm.runtime.server.reasoning_stream import ReasoningChunks
from radixlm.runtime.server.state import ServerState

router = APIRouter()


def _state(request: Request) -> ServerState:
    return request.app.state.server


def _model_card(state: ServerState, name: str) -> dict[str, Any]:
    return {
        "id": name,
        "object": "model",
        "created": int(state.extra_info.get("started", time.time())),
        "owned_by": "radixlm",
        "root": state.model_path,
        "max_model_len": state.context_length,
    }


@router.get("/v1/models")
async def list_models(request: Request) -> Response:
    state = _state(request)
    return json_response({"object": "list", "data": [_model_card(state, state.model_name)]})


@router.get("/v1/models/{model:path}")
async def retrieve_model(request: Request, model: str) -> Response:
    state = _state(request)
    if model != state.model_name:
        raise ApiError(404, f"the model '{model}' does not exist", "model", "model_not_found")
    return json_response(_model_card(state, model))


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    state = _state(request)
    body = await parse_body(request, CompletionRequest)
    try:
        batch = completion_batch(body)
        echo = None
        if body.echo:
            batch = request_batch.validate(state.engine, batch)  # NOTE: ids checked before decoding
            echo = _echo_texts(state, batch)
        n = len(batch.groups[0])
        model = body.model or state.model_name
        want_lp = body.logprobs is not None
        tb = TokenBytes.of(state.tokenizer) if want_lp else None
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            conv = fmt.StreamConverter(
                False, model, n, len(batch.flat), include_usage, want_lp, echo, tb
            )
            return await _stream(request, state, batch, conv, RENAME_COMPLETION)
        results = await run_until_disconnect(request, request_batch.collect(state.engine, batch))
        return json_response(fmt.completion_response(results, n, model, echo, want_lp, tb))
    except RadixLMError as exc:
        raise to_api_error(exc, RENAME_COMPLETION) from exc


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    state = _state(request)
    body = await parse_body(request, ChatCompletionRequest)
    rename = dict(RENAME_CHAT)
    if body.max_completion_tokens is None:
        rename["max_new_tokens"] = "max_tokens"
    try:
        tools = plan_tools(
            body.tools, body.tool_choice, body.parallel_tool_calls, state.args.tool_call_parser
        )
        batch = chat_batch(body, state, tools)
        parser_name = state.args.reasoning_parser
        separate = parser_name is not None and body.separate_reasoning is not False
        thinking = REASONING_PARSERS[parser_name] if separate and parser_name else None
        model = body.model or state.model_name
        want_lp = bool(body.logprobs)
        tb = TokenBytes.of(state.tokenizer) if want_lp else None
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            total = len(batch.flat)
            conv = fmt.StreamConverter(True, model, total, total, include_usage, want_lp, None, tb)
            filters: list[Any] = [ReasoningChunks(thinking)] if thinking else []
            filters += [ToolStream(tools)] if tools is not None else []
            return await _stream(request, state, batch, conv, rename, filters)
        results = await run_until_disconnect(request, request_batch.collect(state.engine, batch))
        response = fmt.chat_response(results, model, want_lp, tb)
        if thinking is not None:
            response = reasoning_stream.apply_to_response(thinking, response)
        return json_response(response if tools is None else apply_to_response(tools, response))
    except RadixLMError as exc:
        raise to_api_error(exc, rename) from exc


def _echo_texts(state: ServerState, batch: RequestBatch) -> list[str]:
    texts = []
    for subs in batch.groups:
        sub = subs[0]
        if sub.text is not None:
            texts.append(sub.text)
        elif state.tokenizer is None:
            raise ApiError(400, "echo needs a tokenizer (skip_tokenizer_init)", "echo")
        else:
            texts.append(state.tokenizer.decode(sub.input_ids, skip_special_tokens=False))
    return texts


async def _stream(
    request: Request, state: ServerState, batch: RequestBatch, conv: fmt.StreamConverter,
    rename: Mapping[str, str], filters: Sequence[Any] = (),
) -> Response:  # fmt: skip
    chunks = request_batch.stream(state.engine, batch)
    first, done = await first_item(request, chunks)  # errors before the first token: a 4xx/5xx

    def convert(chunk: dict[str, Any]) -> list[dict[str, Any]]:
        out = conv.convert(chunk)
        for f in filters:  # reasoning split, then tool calls
            out = f.filter(out)
        return out

    async def events() -> AsyncIterator[bytes]:
        try:
            if not done:
                for obj in convert(first):
                    yield sse_event(obj)
                async for chunk in chunks:
                    for obj in convert(chunk):
                        yield sse_event(obj)
                for obj in conv.tail():
                    yield sse_event(obj)
        except Exception as exc:
            yield sse_event(to_api_error(exc, rename).body())
        finally:
            await chunks.aclose()
        yield SSE_DONE

    return SSEResponse(events())
