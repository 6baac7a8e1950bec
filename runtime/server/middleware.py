"""`GuardMiddleware`: the checks every HTTP request passes before it reaches a route.

In order: API key (`Authorization: Bearer <key>` on every path but `/health`; 401), the drain
gate (while shutting down, new work gets 503), the body-size limit (413, from Content-Length or
while the body streams in), and the in-flight count the drain waits on. A pure ASGI middleware,
so streaming responses pass through untouched (and are counted until their last byte).

Threading: runs on uvicorn's event loop; `ServerState.in_flight` is only touched here.
"""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from radixlm.runtime.server.errors import ApiError
from radixlm.runtime.server.http_utils import dumps
from radixlm.runtime.server.state import WORK_PATHS, ServerState

OPEN_PATHS = frozenset({"/health"})


class GuardMiddleware:
    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app = app
        self.state = state
        key = state.args.api_key
        self.expected = f"Bearer {key}".encode() if key else None
        self.limit = state.args.max_request_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope.get("path", "")
        headers = dict(scope.get("headers") or [])
        if self.expected is not None and path not in OPEN_PATHS:
            given = headers.get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                err = ApiError(401, "a valid API key is required (Authorization: Bearer <key>)",
                               code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})  # fmt: skip
                await self._send_error(send, err)
                return
        work = path in WORK_PATHS
        if work and self.state.draining:
            err = ApiError(
                503, "the server is shutting down", code="draining", headers={"Retry-After": "1"}
            )
            await self._send_error(send, err)
            return
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            await self._send_error(send, self._too_large())
            return
        started = False

        async def limited_receive() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                nonlocal received
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise self._too_large()  # NOTE: routes turn ApiError into its response
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        received = 0
        if work:
            self.state.in_flight += 1
        try:
            await self.app(scope, limited_receive, tracking_send)
        except ApiError as err:
            if started:
                raise
            await self._send_error(send, err)
        finally:
            if work:
                self.state.in_flight -= 1

    def _too_large(self) -> ApiError:
        return ApiError(
            413,
            f"the request body exceeds {self.limit} bytes (max_request_body_bytes)",
            code="request_too_large",
        )

    async def _send_error(self, send: Send, err: ApiError) -> None:
        if self.state.metrics is not None:
            self.state.metrics.count_error(err.status, err.reason)
        await _send_error(send, err)


async def _send_error(send: Send, err: ApiError) -> None:
    body = dumps(err.body())
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in err.headers.items()]
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})
