"""`create_router_app(args)`: the router's FastAPI application.

    POST /generate, /v1/completions, /v1/chat/completions   routed (streaming too; proxy.py)
    GET  /v1/models, /v1/models/{id}, /get_model_info        answered by one healthy worker
    GET  /health          200 while at least one worker is healthy, else 503
    GET  /metrics         the router's own Prometheus metrics (metrics.py)
    GET  /workers         the router's view of each worker (healthy, load, tree size, last error)
    GET  /get_server_info the router's settings and the workers
    POST /add_worker?url=..., /remove_worker?url=...         change the pool at run time
    POST /flush_cache     flushes every healthy worker's cache and empties the trees

The lifespan owns the shared `httpx.AsyncClient`, the health-check task (worker.py) and the
eviction task (every `eviction_interval` s each tree is cut back to `max_tree_size` characters).
With `api_key` every path but /health needs `Authorization: Bearer <key>`.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict

import httpx
from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from radixlm._version import __version__
from radixlm.router.config import RouterArgs
from radixlm.router.metrics import CONTENT_TYPE, RouterMetrics
from radixlm.router.policy import make_policy
from radixlm.router.proxy import Router, RouterError
from radixlm.router.worker import WorkerPool

ROUTED = ("/generate", "/v1/completions", "/v1/chat/completions")


class ApiKeyMiddleware:
    """`Authorization: Bearer <key>` on every path but /health (pure ASGI: streams untouched)."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("path") != "/health":
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                msg = "a valid API key is required (Authorization: Bearer <key>)"
                await RouterError(401, msg, "invalid_api_key").response()(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_router_app(args: RouterArgs) -> FastAPI:
    # NOTE: no read timeout: a long generation is not a failure; a worker that stops answering
    # leaves the pool through its health checks, which ends its requests.
    timeout = httpx.Timeout(connect=args.health_check_timeout, read=None, write=60.0, pool=None)
    limits = httpx.Limits(max_connections=4096, max_keepalive_connections=256)
    client = httpx.AsyncClient(timeout=timeout, limits=limits)
    metrics = RouterMetrics()
    pool = WorkerPool(list(args.worker_urls), client, args.health_check_interval,
                      args.health_check_timeout, args.health_failure_threshold)  # fmt: skip
    router = Router(pool, make_policy(args.policy, args.cache_aware, args.random_seed), metrics,
                    client)  # fmt: skip

    async def evict_loop() -> None:
        while True:
            await asyncio.sleep(args.eviction_interval)
            for worker in pool.workers.values():
                worker.tree.evict(args.max_tree_size)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await pool.check_all()
        pool.start()
        evictor = asyncio.ensure_future(evict_loop())
        try:
            yield
        finally:
            evictor.cancel()
            await pool.stop()
            await client.aclose()

    app = FastAPI(title="radixlm router", version=__version__, lifespan=lifespan,
                  docs_url=None, redoc_url=None, openapi_url=None)  # fmt: skip
    app.state.router = router

    if args.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=args.api_key)

    @app.exception_handler(RouterError)
    async def router_error(request: Request, exc: RouterError) -> Response:
        return exc.response()

    async def routed(request: Request) -> Response:
        return await router.forward(request, request.url.path)

    for path in ROUTED:
        app.add_api_route(
            path, routed, methods=["POST", "PUT"] if path == "/generate" else ["POST"]
        )

    async def one_worker(request: Request) -> Response:
        return await router.any_worker(request, request.url.path)

    for path in ("/v1/models", "/v1/models/{model:path}", "/get_model_info"):
        app.add_api_route(path, one_worker, methods=["GET"])

    @app.get("/health")
    async def health() -> Response:
        if pool.healthy():
            return Response(status_code=200)
        return RouterError(503, "no healthy worker", "no_healthy_worker").response()

    @app.get("/metrics")
    async def get_metrics() -> Response:
        return Response(metrics.render(list(pool.workers.values())), media_type=CONTENT_TYPE)

    @app.get("/workers")
    async def workers() -> Response:
        return JSONResponse({"workers": [w.describe() for w in pool.workers.values()]})

    @app.get("/get_server_info")
    async def server_info() -> Response:
        info = {k: v for k, v in asdict(args).items() if k != "api_key"}
        info["workers"] = [w.describe() for w in pool.workers.values()]
        info["version"] = __version__
        return JSONResponse(info)

    @app.post("/add_worker")
    async def add_worker(url: str) -> Response:
        if not url.startswith(("http://", "https://")):
            raise RouterError(400, f"worker URL {url!r} must start with http://", "invalid_url")
        worker = pool.add(url)
        healthy = await pool.check(worker)
        return JSONResponse({"url": worker.url, "healthy": healthy})

    @app.post("/remove_worker")
    async def remove_worker(url: str) -> Response:
        if pool.remove(url) is None:
            raise RouterError(404, f"no worker {url!r} in the pool", "worker_not_found")
        return PlainTextResponse(f"removed {url}\n")

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache(request: Request) -> Response:
        headers = {k: v for k, v in request.headers.items() if k == "authorization"}
        healthy = pool.healthy()
        answers = await asyncio.gather(
            *(client.post(w.url + "/flush_cache", headers=headers) for w in healthy),
            return_exceptions=True,
        )
        failed = []
        for worker, answer in zip(healthy, answers):
            worker.tree.clear()
            if isinstance(answer, BaseException) or answer.status_code != 200:
                failed.append(worker.url)
        if failed:
            raise RouterError(400, f"cache not flushed on {', '.join(failed)}", "busy")
        return PlainTextResponse("Cache flushed.\n")

    return app
