"""`Router`: picks a worker for each request and relays the request and its answer, streaming
included, byte for byte (the worker's status, body and SSE events reach the client unchanged).

Data flow: the body is read once; its routing text (the prompt, the chat messages, or the
input ids spelled out) goes to the policy; the request goes to the chosen worker with the client's
`Authorization` header. The answer carries `X-Radixlm-Worker: <url>`.

Failures (every one ends the request; nothing waits forever):
- cannot connect: the worker leaves the pool and the request is retried on another one (it never
  reached the first);
- the connection breaks or the worker leaves the pool while the request runs: 502
  `worker_failed` / `worker_left` before the answer started, or, inside a stream, an SSE event
  `data: {"error": {...}}` followed by `data: [DONE]`. The request is not retried: the worker may
  already have run part of it;
- no healthy worker: 503 `no_healthy_worker`.
A client that disconnects closes the worker's connection too, which aborts the request there.

Threading: the router's event loop only.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

import httpx
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from radixlm.router.metrics import RouterMetrics
from radixlm.router.policy import Policy
from radixlm.router.worker import Worker, WorkerPool
from radixlm.runtime.server.http_utils import ClientDisconnected, run_until_disconnect

logger = logging.getLogger("radixlm.router")
T = TypeVar("T")
WORKER_HEADER = "X-Radixlm-Worker"
CLIENT_CLOSED = 499  # as the server answers a client gone before its answer
_PASS_HEADERS = ("content-type", "cache-control", "retry-after", "www-authenticate")


class RouterError(Exception):
    """An error the router answers itself, as `{"error": {...}}`."""

    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code

    def body(self) -> dict[str, Any]:
        kind = "service_unavailable_error" if self.status in (502, 503) else "invalid_request_error"
        return {"error": {"message": self.message, "type": kind, "param": None, "code": self.code}}

    def response(self) -> Response:
        return Response(json.dumps(self.body()), self.status, media_type="application/json")


class _WorkerLeft(Exception):
    pass


def routing_text(path: str, body: Any) -> str:
    """What the policy matches: the text whose prefix the worker's cache would hold."""
    if not isinstance(body, dict):
        return ""
    if path.endswith("/chat/completions"):
        parts = []
        for msg in body.get("messages") or []:
            if not isinstance(msg, dict):
                continue
            content = msg.get("content")
            if isinstance(content, list):  # content parts: the text ones
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
            parts.append(f"{msg.get('role', '')}:{content or ''}\n")
        return "".join(parts)
    value = body.get("prompt") if path.endswith("/completions") else body.get("text")
    if value is None and path == "/generate":
        value = body.get("input_ids")
    if isinstance(value, list) and value and isinstance(value[0], list | str):
        value = value[0]  # a batch goes to one worker, routed by its first prompt
    if isinstance(value, list):  # token ids: spelled out, so that their prefixes match
        return " ".join(str(v) for v in value)
    return value if isinstance(value, str) else ""


async def _race(awaitable: Awaitable[T], gone: asyncio.Event) -> T:
    """`awaitable`'s result, unless the worker leaves the pool first (_WorkerLeft)."""
    task = asyncio.ensure_future(awaitable)
    watcher = asyncio.ensure_future(gone.wait())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        raise _WorkerLeft()
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        elif not task.cancelled():
            task.exception()  # NOTE: done as we were cancelled: mark its outcome as seen


class Router:
    def __init__(
        self, pool: WorkerPool, policy: Policy, metrics: RouterMetrics, client: httpx.AsyncClient
    ) -> None:
        self.pool, self.policy, self.metrics, self.client = pool, policy, metrics, client

    def _pick(self, text: str, tried: set[str]) -> Worker:
        candidates = [w for w in self.pool.healthy() if w.url not in tried]
        if not candidates:
            what = "no healthy worker" + (" left" if tried else "")
            self.metrics.errors.labels("", "no_healthy_worker").inc()
            raise RouterError(503, f"{what} to serve the request", "no_healthy_worker")
        decision = self.policy.pick(text, candidates)
        self.metrics.decisions.labels(self.policy.name, decision.kind).inc()
        return decision.worker

    def _fail(self, worker: Worker, exc: BaseException, started: bool) -> RouterError:
        if isinstance(exc, _WorkerLeft):
            code, what = "worker_left", f"left the pool ({worker.last_error})"
        else:
            code, what = "worker_failed", f"failed: {type(exc).__name__}: {exc}"
            self.pool.mark_down(worker, f"a request failed: {type(exc).__name__}")
        self.metrics.errors.labels(worker.url, code).inc()
        stage = "while streaming" if started else "before answering"
        return RouterError(502, f"worker {worker.url} {what} {stage}", code)

    async def forward(self, request: Request, path: str) -> Response:
        raw = await request.body()
        try:
            body = json.loads(raw) if raw.strip() else {}
        except ValueError:
            body = None  # NOTE: the worker answers the 400 for a malformed body
        text = routing_text(path, body)
        stream = isinstance(body, dict) and bool(body.get("stream"))
        headers = {"content-type": request.headers.get("content-type", "application/json")}
        if "authorization" in request.headers:
            headers["authorization"] = request.headers["authorization"]
        tried: set[str] = set()
        while True:
            worker = self._pick(text, tried)
            tried.add(worker.url)
            self.metrics.requests.labels(worker.url, path).inc()
            worker.load += 1
            try:
                req = self.client.build_request(
                    request.method, worker.url + path, content=raw, headers=headers,
                    params=request.query_params,
                )  # fmt: skip
                sending = _race(self.client.send(req, stream=True), worker.gone)
                resp = await run_until_disconnect(request, sending)
            except ClientDisconnected:
                worker.load -= 1
                return Response(status_code=CLIENT_CLOSED)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                worker.load -= 1
                self.pool.mark_down(worker, f"cannot connect: {exc}")
                self.metrics.errors.labels(worker.url, "connect_failed").inc()
                continue  # NOTE: the request never reached this worker: safe to send elsewhere
            except (httpx.HTTPError, _WorkerLeft) as exc:
                worker.load -= 1
                raise self._fail(worker, exc, started=False) from exc
            break
        out_headers = {k: v for k, v in resp.headers.items() if k.lower() in _PASS_HEADERS}
        out_headers[WORKER_HEADER] = worker.url
        if stream and resp.status_code == 200:
            return StreamingResponse(
                self._relay(worker, resp), resp.status_code, headers=out_headers
            )
        try:
            content = await run_until_disconnect(request, _race(resp.aread(), worker.gone))
        except ClientDisconnected:
            return Response(status_code=CLIENT_CLOSED)
        except (httpx.HTTPError, _WorkerLeft) as exc:
            raise self._fail(worker, exc, started=False) from exc
        finally:
            worker.load -= 1
            await resp.aclose()
        return Response(content, resp.status_code, headers=out_headers)

    async def _relay(self, worker: Worker, resp: httpx.Response) -> AsyncIterator[bytes]:
        """The worker's SSE bytes; a failure midway becomes an error event, then [DONE]."""
        chunks = resp.aiter_raw()
        tail = b"\n\n"
        try:
            while True:
                try:
                    chunk = await _race(chunks.__anext__(), worker.gone)
                except StopAsyncIteration:
                    return
                if chunk:
                    tail = chunk[-2:]
                    yield chunk
        except (httpx.HTTPError, _WorkerLeft) as exc:
            err = self._fail(worker, exc, started=True)
            logger.warning("%s", err.message)
            sep = b"" if tail == b"\n\n" else b"\n\n"  # NOTE: never glue onto a cut event
            yield sep + b"data: " + json.dumps(err.body()).encode() + b"\n\n" + b"data: [DONE]\n\n"
        finally:
            worker.load -= 1
            await resp.aclose()

    async def any_worker(self, request: Request, path: str) -> Response:
        """A read-only GET answered by one healthy worker (model info, model list)."""
        healthy = self.pool.healthy()
        if not healthy:
            raise RouterError(503, "no healthy worker to serve the request", "no_healthy_worker")
        worker = min(healthy, key=lambda w: w.load)
        headers = {}
        if "authorization" in request.headers:
            headers["authorization"] = request.headers["authorization"]
        try:
            resp = await self.client.get(worker.url + path, headers=headers)
        except httpx.HTTPError as exc:
            raise self._fail(worker, exc, started=False) from exc
        out_headers = {k: v for k, v in resp.headers.items() if k.lower() in _PASS_HEADERS}
        out_headers[WORKER_HEADER] = worker.url
        return Response(resp.content, resp.status_code, headers=out_headers)
