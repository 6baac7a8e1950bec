"""SGLang's native endpoints, with SGLang's request and response fields and SSE framing:

    POST|PUT /generate        text | input_ids (single or batch), sampling_params, rid, logprob
                              options, stream -> {"text", "output_ids", "meta_info"} (a list for a
                              batch or n > 1); stream: `data: {...}\\n\\n` chunks with the
                              cumulative text, then `data: [DONE]\\n\\n`
    GET  /get_model_info      model_path, tokenizer_path, is_generation, ...
    GET  /get_server_info     server args (API key redacted) + scheduler info and load + pids
    GET  /health              200 when ready and the engine runs; 503 otherwise (no API key needed)
    GET  /health_generate     runs a one-token generation (200 / 503)
    GET|POST /flush_cache     drops the prefix cache (400 while requests run)
    POST /abort_request       {"rid": ...} or {"abort_all": true}
    GET  /metrics             Prometheus text format

Threading: handlers run on uvicorn's event loop; see http_utils for disconnect handling.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import PlainTextResponse, Response

from radixlm._version import __version__
from radixlm.runtime.frontend import request_batch
from radixlm.runtime.frontend.tokenizer_manager import GenerateInput
from radixlm.runtime.server.errors import ApiError, to_api_error
from radixlm.runtime.server.http_utils import (
    SSE_DONE,
    SSEResponse,
    error_response,
    first_item,
    json_response,
    parse_body,
    run_until_disconnect,
    sse_event,
)
from radixlm.runtime.server.metrics import CONTENT_TYPE, HEALTH_RID_PREFIX
from radixlm.runtime.server.protocol import AbortRequest, FlushCacheRequest, GenerateRequest
from radixlm.runtime.server.state import ServerState

router = APIRouter()
HEALTH_GENERATE_TIMEOUT = 20.0


def _state(request: Request) -> ServerState:
    return request.app.state.server


@router.api_route("/generate", methods=["POST", "PUT"])
async def generate(request: Request) -> Response:
    state = _state(request)
    body = await parse_body(request, GenerateRequest)
    body.check()
    tm = state.engine
    batch = request_batch.expand_request(
        body.text, body.sampling_params, body.input_ids, body.return_logprob,
        body.logprob_start_len, body.top_logprobs_num, body.return_text_in_logprobs,
        body.stream, body.rid,
    )  # fmt: skip
    if body.stream:
        chunks = request_batch.stream(tm, batch)
        first, done = await first_item(request, chunks)
        return SSEResponse(_sse(first, done, chunks))
    results = await run_until_disconnect(request, request_batch.collect(tm, batch))
    return json_response(results[0] if batch.is_single else results)


async def _sse(
    first: Any, done: bool, chunks: AsyncIterator[dict[str, Any]]
) -> AsyncIterator[bytes]:
    """SGLang's framing: one `data:` event per chunk, an error event if the run fails midway
    (the status line is already sent), then `data: [DONE]`."""
    try:
        if not done:
            yield sse_event(first)
            async for chunk in chunks:
                yield sse_event(chunk)
    except Exception as exc:
        yield sse_event(to_api_error(exc).body())
    finally:
        await chunks.aclose()
    yield SSE_DONE


@router.get("/get_model_info")
async def get_model_info(request: Request) -> Response:
    state = _state(request)
    args = state.args
    tokenizer = state.tokenizer
    template = getattr(tokenizer, "chat_template", None)
    return json_response(
        {
            "model_path": state.model_path,
            "tokenizer_path": args.tokenizer_path or state.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "served_model_name": state.model_name,
            # radixlm's additions (clients such as RuntimeEndpoint render roles with them;
            # null without a tokenizer or template): the tokenizer's Jinja chat template
            # (a string, or a dict of named templates) and its special tokens.
            "chat_template": template if isinstance(template, str | dict) else None,
            "bos_token": getattr(tokenizer, "bos_token", None),
            "eos_token": getattr(tokenizer, "eos_token", None),
        }
    )


@router.get("/get_server_info")
async def get_server_info(request: Request) -> Response:
    state = _state(request)
    tm = state.engine
    resp = await tm.control("get_info", timeout=10.0)
    load = resp.data if resp.ok else {}
    return json_response(
        {
            **state.public_args(),
            **tm.info,
            **load,
            **state.pids(),
            "internal_states": [load],
            "model_name": state.model_name,
            "in_flight_requests": state.in_flight,
            # Requests the tokenizer manager tracks (0 when idle: nothing lingers after a test).
            "tm_requests": len(tm.states),
            "version": __version__,
        }
    )


@router.get("/health")
async def health(request: Request) -> Response:
    reason = _state(request).unhealthy_reason()
    if reason:
        return error_response(ApiError(503, reason, code="unhealthy"))
    return Response(status_code=200)


@router.get("/health_generate")
async def health_generate(request: Request) -> Response:
    state = _state(request)
    reason = state.unhealthy_reason()
    if reason:
        return error_response(ApiError(503, reason, code="unhealthy"))
    req = GenerateInput(
        input_ids=[0],
        sampling_params={"max_new_tokens": 1, "temperature": 0.0},
        rid=f"{HEALTH_RID_PREFIX}{time.time_ns()}",
    )
    try:
        await asyncio.wait_for(request_batch.run_one(state.engine, req), HEALTH_GENERATE_TIMEOUT)
    except asyncio.TimeoutError:
        msg = f"no generation within {HEALTH_GENERATE_TIMEOUT:.0f} s"
        return error_response(ApiError(503, msg, code="unhealthy"))
    except Exception as exc:
        return error_response(ApiError(503, f"generation failed: {exc}", code="unhealthy"))
    return Response(status_code=200)


@router.api_route("/flush_cache", methods=["GET", "POST"])
async def flush_cache(request: Request) -> Response:
    await parse_body(request, FlushCacheRequest, optional=True)
    resp = await _state(request).engine.control("flush_cache")
    if not resp.ok:
        raise ApiError(400, f"cache not flushed: {resp.error}", code="busy")
    return PlainTextResponse("Cache flushed.\n")


@router.post("/abort_request")
async def abort_request(request: Request) -> Response:
    body = await parse_body(request, AbortRequest)
    tm = _state(request).engine
    if body.abort_all:
        tm.abort("")
    elif body.rid:
        subs = [
            r
            for r in tm.states
            if r.startswith(body.rid + "-") and r[len(body.rid) + 1 :].isdigit()
        ]
        for rid in [body.rid, *subs]:
            tm.abort(rid)  # NOTE: the n > 1 sub-requests of `rid` are "{rid}-{k}"
    else:
        raise ApiError(400, "give the rid of the request to abort, or abort_all: true", "rid")
    return Response(status_code=200)


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    state = _state(request)
    if state.metrics is None:
        raise ApiError(404, "metrics are disabled (start the server with --enable-metrics)")
    info = None
    if state.tm is not None and not state.tm.dead:
        try:
            resp = await state.tm.control("get_info", timeout=5.0)
            info = resp.data if resp.ok else None
        except Exception:
            info = None
    admitted = len(state.tm.states) if state.tm is not None else 0
    state.metrics.update_load(info, state.in_flight, admitted)
    return Response(state.metrics.render(), media_type=CONTENT_TYPE)
