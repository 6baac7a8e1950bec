"""HTTP plumbing shared by the routes: JSON bodies in and out, SSE streams, client disconnects.

Threading: everything runs on uvicorn's event loop.
Disconnects: a non-streaming request runs as a task next to a watcher of the ASGI receive channel
(`run_until_disconnect`); when the client goes away the task is cancelled, which aborts its engine
requests (the TokenizerManager aborts in its generators' `finally`). A streaming response
(`SSEResponse`) is cancelled by Starlette on disconnect and, in every case, closes its iterator
when the response ends, so the abort never waits for garbage collection.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator, Awaitable, Mapping
from typing import Any, TypeVar

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from radixlm.runtime.server.errors import ApiError

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")
SSE_DONE = b"data: [DONE]\n\n"


class ClientDisconnected(Exception):
    """The client closed the connection before the response was ready."""


def dumps(obj: Any) -> bytes:
    """Strict JSON (non-finite floats -> null, as orjson does: -inf logprobs are not JSON)."""
    try:
        return json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
    except ValueError:
        return json.dumps(_finite(obj), ensure_ascii=False, separators=(",", ":")).encode()


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


def json_response(
    obj: Any, status: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    return Response(dumps(obj), status, headers=dict(headers or {}), media_type="application/json")


def error_response(err: ApiError) -> Response:
    return json_response(err.body(), err.status, err.headers)


async def parse_body(request: Request, model: type[M], optional: bool = False) -> M:
    """Read and validate a JSON body (any content type: `curl -d` sends a form type). The size
    limit is enforced before this by the middleware. `optional`: an empty body means `{}`."""
    raw = await request.body()
    if not raw.strip():
        if not optional:
            raise ApiError(400, "the request body is empty (expected a JSON object)")
        raw = b"{}"
    return model.model_validate_json(raw)


def sse_event(obj: Any) -> bytes:
    return b"data: " + dumps(obj) + b"\n\n"


async def _wait_disconnect(request: Request) -> None:
    # NOTE: only after the body was read: from then on uvicorn's receive() blocks until the client
    # disconnects (or the response completes).
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def run_until_disconnect(request: Request, awaitable: Awaitable[T]) -> T:
    """Await `awaitable`; if the client disconnects first, cancel it and raise ClientDisconnected."""
    task = asyncio.ensure_future(awaitable)
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        raise ClientDisconnected()
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def first_item(request: Request, agen: AsyncIterator[T]) -> tuple[T | None, bool]:
    """The first item of a stream, waited for under disconnect watch: (item, exhausted). Errors
    before the first item (validation, queue full, a rejected constraint) surface here, so they
    become a proper HTTP status instead of an error event inside a 200 stream."""
    try:
        return await run_until_disconnect(request, agen.__anext__()), False
    except StopAsyncIteration:
        return None, True


class SSEResponse(StreamingResponse):
    """`text/event-stream` that always closes its iterator when the response ends."""

    def __init__(
        self, body: AsyncIterator[bytes], headers: Mapping[str, str] | None = None
    ) -> None:
        base = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        super().__init__(body, headers={**base, **(headers or {})}, media_type="text/event-stream")
        self._body = body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            aclose = getattr(self._body, "aclose", None)
            if aclose is not None:
                await aclose()  # NOTE: aborts the engine requests of a disconnected client now
