"""The router's own Prometheus metrics (`GET /metrics` of the router), on a private registry.

- `radixlm_router:requests_total{worker, route}`: requests sent to each worker;
- `radixlm_router:routing_decisions_total{policy, decision}`: cache_hit | cache_miss | balance
  (cache_aware), or the policy's name;
- `radixlm_router:request_errors_total{worker, reason}`: requests that ended with a router error
  (connect_failed, worker_failed, worker_left, no_healthy_worker);
- gauges, refreshed on each scrape: `worker_healthy{worker}`, `worker_load{worker}` (requests in
  flight through the router), `tree_size_chars{worker}` (the approximate tree), `healthy_workers`.

Threading: updated on the router's event loop only.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from radixlm.router.worker import Worker

CONTENT_TYPE = CONTENT_TYPE_LATEST
PREFIX = "radixlm_router:"


class RouterMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter(PREFIX + "requests", "Requests sent to each worker.",
                                ["worker", "route"], registry=r)  # fmt: skip
        self.decisions = Counter(PREFIX + "routing_decisions", "Routing decisions by kind.",
                                 ["policy", "decision"], registry=r)  # fmt: skip
        self.errors = Counter(PREFIX + "request_errors", "Requests ended by a router error.",
                              ["worker", "reason"], registry=r)  # fmt: skip
        self.healthy = Gauge(PREFIX + "worker_healthy", "1 while the worker is in the pool.",
                             ["worker"], registry=r)  # fmt: skip
        self.load = Gauge(PREFIX + "worker_load", "Requests in flight on the worker.",
                          ["worker"], registry=r)  # fmt: skip
        self.tree = Gauge(PREFIX + "tree_size_chars", "Characters in the approximate tree.",
                          ["worker"], registry=r)  # fmt: skip
        self.healthy_workers = Gauge(PREFIX + "healthy_workers", "Workers in the pool.",
                                     registry=r)  # fmt: skip

    def render(self, workers: list[Worker]) -> bytes:
        for w in workers:
            self.healthy.labels(w.url).set(1 if w.healthy else 0)
            self.load.labels(w.url).set(w.load)
            self.tree.labels(w.url).set(w.tree.size)
        self.healthy_workers.set(sum(w.healthy for w in workers))
        return generate_latest(self.registry)
