"""`Worker` (one `radixlm serve` behind the router) and `WorkerPool` (all of them, with health).

Ownership: the pool owns its workers; everything here runs on the router's event loop, so no
locks. A worker's `load` is the number of requests the router has in flight on it (what the
policies balance), its `tree` the policy's guess of its prefix cache.

Health: a periodic task GETs each worker's `/health` (`health_check_interval`); after
`health_failure_threshold` failures in a row a healthy worker leaves the pool, and one success
brings a worker back. A request that cannot connect to a worker (or whose connection breaks) marks
that worker down at once, without waiting for the next check. Leaving the pool sets the worker's
`gone` event, which every request still in flight on it waits on, so those requests end with an
error instead of hanging; a worker that leaves or rejoins starts with an empty tree (its cache is
cold, or at least unknown).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import httpx

from radixlm.router.approx_tree import ApproxTree

logger = logging.getLogger("radixlm.router")


class Worker:
    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.healthy = False  # NOTE: unknown until the first health check answers
        self.load = 0
        self.tree = ApproxTree()
        self.failures = 0
        self.last_error = "not checked yet"
        self.gone = asyncio.Event()  # set while out of the pool; requests in flight watch it
        self.gone.set()

    def describe(self) -> dict[str, object]:
        error = None if self.healthy else self.last_error
        return {"url": self.url, "healthy": self.healthy, "load": self.load,
                "tree_chars": self.tree.size, "last_error": error}  # fmt: skip


class WorkerPool:
    def __init__(
        self,
        urls: list[str],
        client: httpx.AsyncClient,
        interval: float,
        timeout: float,
        failure_threshold: int,
        on_change: Callable[[Worker], None] | None = None,
    ) -> None:
        self.workers: dict[str, Worker] = {}
        for url in urls:
            self.add(url)
        self.client = client
        self.interval = interval
        self.timeout = timeout
        self.failure_threshold = failure_threshold
        self.on_change = on_change
        self._task: asyncio.Task | None = None

    # ---- membership ----------------------------------------------------------------------------
    def add(self, url: str) -> Worker:
        worker = self.workers.get(url.rstrip("/"))
        if worker is None:
            worker = self.workers[url.rstrip("/")] = Worker(url)
        return worker

    def remove(self, url: str) -> Worker | None:
        worker = self.workers.pop(url.rstrip("/"), None)
        if worker is not None:
            self.mark_down(worker, "removed from the router")
        return worker

    def healthy(self) -> list[Worker]:
        return [w for w in self.workers.values() if w.healthy]

    def mark_down(self, worker: Worker, reason: str) -> None:
        worker.last_error = reason
        if not worker.healthy and worker.gone.is_set():
            return
        worker.healthy = False
        worker.gone.set()
        worker.tree.clear()
        logger.warning("worker %s left the pool: %s", worker.url, reason)
        if self.on_change is not None:
            self.on_change(worker)

    def mark_up(self, worker: Worker) -> None:
        worker.failures = 0
        if worker.healthy:
            return
        worker.healthy = True
        worker.gone = asyncio.Event()  # NOTE: a fresh event: requests of the old life keep theirs
        worker.tree.clear()
        logger.info("worker %s joined the pool", worker.url)
        if self.on_change is not None:
            self.on_change(worker)

    # ---- health checks -------------------------------------------------------------------------
    async def check(self, worker: Worker) -> bool:
        try:
            resp = await self.client.get(worker.url + "/health", timeout=self.timeout)
            ok, reason = resp.status_code == 200, f"/health answered {resp.status_code}"
        except httpx.HTTPError as exc:
            ok, reason = False, f"/health failed: {type(exc).__name__}: {exc}"
        if ok:
            self.mark_up(worker)
        else:
            worker.failures += 1
            worker.last_error = reason
            if worker.failures >= self.failure_threshold or not worker.healthy:
                self.mark_down(worker, reason)
        return ok

    async def check_all(self) -> None:
        await asyncio.gather(*(self.check(w) for w in list(self.workers.values())))

    async def _loop(self) -> None:
        while True:
            await self.check_all()
            await asyncio.sleep(self.interval)

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
