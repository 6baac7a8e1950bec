"""`create_app(state)`: the FastAPI application of `radixlm serve`.

The lifespan builds the TokenizerManager on uvicorn's running loop (it owns asyncio objects and
ZMQ sockets bound to that loop), registers the metrics and request-log listeners, and closes it
at shutdown; the child processes belong to `launch_server`, which stops them after uvicorn returns.
Errors of every kind leave as `{"error": {...}}` JSON (see errors.py); request bodies are parsed
by the routes themselves, so FastAPI's 422 never appears. The OpenAPI schema (`/openapi.json`)
documents the request bodies (for clients and schema-driven fuzzing).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from radixlm._version import __version__
from radixlm.runtime.errors import RadixLMError
from radixlm.runtime.frontend.tokenizer_manager import TokenizerManager
from radixlm.runtime.server import compat_api, native_api, openai_api
from radixlm.runtime.server.errors import ApiError, to_api_error
from radixlm.runtime.server.http_utils import ClientDisconnected, error_response
from radixlm.runtime.server.metrics import ServerMetrics
from radixlm.runtime.server.middleware import GuardMiddleware
from radixlm.runtime.server.openai_protocol import ChatCompletionRequest, CompletionRequest
from radixlm.runtime.server.protocol import AbortRequest, FlushCacheRequest, GenerateRequest
from radixlm.runtime.server.request_log import log_request_end
from radixlm.runtime.server.state import ServerState

logger = logging.getLogger(__name__)
CLIENT_CLOSED = 499  # nginx's "client closed request": nobody reads it, but logs show it
_BODIES = {
    "/generate": GenerateRequest,
    "/abort_request": AbortRequest,
    "/flush_cache": FlushCacheRequest,
    "/v1/completions": CompletionRequest,
    "/v1/chat/completions": ChatCompletionRequest,
}


def create_app(state: ServerState) -> FastAPI:
    if state.args.enable_metrics and state.metrics is None:
        state.metrics = ServerMetrics(state.model_name)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if state.tm is None and state.procs is not None:
            procs = state.procs
            state.tm = TokenizerManager(
                state.args, procs.ports, state.tokenizer, procs.info, procs.describe_death
            )
            state.tm.start()
        if state.tm is not None:
            if state.metrics is not None:
                state.tm.listeners.append(state.metrics.on_request_end)
                state.metrics.set_limits(_limits(state))
            if state.args.log_requests:
                state.tm.listeners.append(log_request_end)
        state.extra_info.setdefault("started", time.time())
        try:
            yield
        finally:
            if state.tm is not None:
                await state.tm.close()

    app = FastAPI(title="radixlm", version=__version__, lifespan=lifespan,
                  docs_url=None, redoc_url=None)  # fmt: skip
    app.state.server = state
    app.include_router(native_api.router)
    app.include_router(openai_api.router)
    app.include_router(compat_api.router)
    app.add_middleware(GuardMiddleware, state=state)
    _add_error_handlers(app, state)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


def _limits(state: ServerState) -> dict[str, float | None]:
    """The admission limits /metrics publishes (`radixlm:admission_limit{limit}`)."""
    args, tm = state.args, state.tm
    assert tm is not None
    return {
        "max_queued_requests": args.max_queued_requests,
        "request_timeout_s": args.request_timeout,
        "queue_timeout_s": args.queue_timeout,
        "context_length": tm.context_len,
        "max_total_tokens": tm.max_total_tokens,
    }


def _add_error_handlers(app: FastAPI, state: ServerState) -> None:
    def answer(err: ApiError) -> Response:
        if state.metrics is not None:
            state.metrics.count_error(err.status, err.reason)
        return error_response(err)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> Response:
        return answer(exc)

    @app.exception_handler(RadixLMError)
    async def runtime_error(request: Request, exc: RadixLMError) -> Response:
        return answer(to_api_error(exc))

    @app.exception_handler(ValidationError)
    async def validation_error(request: Request, exc: ValidationError) -> Response:
        return answer(to_api_error(exc))

    @app.exception_handler(ClientDisconnected)
    async def disconnected(request: Request, exc: ClientDisconnected) -> Response:
        return Response(status_code=CLIENT_CLOSED)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 404:
            message = f"no such endpoint: {request.method} {request.url.path}"
        return answer(ApiError(exc.status_code, message, headers=exc.headers))

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> Response:
        return answer(to_api_error(exc))  # logs the traceback


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's schema plus the request bodies the routes parse themselves."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for path, model in _BODIES.items():
        body = model.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(body.pop("$defs", {}))
        components[model.__name__] = body
        for op in schema.get("paths", {}).get(path, {}).values():
            op["requestBody"] = {
                "required": model is not FlushCacheRequest,
                "content": {
                    "application/json": {
                        "schema": {"$ref": f"#/components/schemas/{model.__name__}"}
                    }
                },
            }
    app.openapi_schema = schema
    return schema
