"""Prometheus metrics of the server (`GET /metrics`), on a private `CollectorRegistry`.

Names follow SGLang's (`sglang:*` -> `radixlm:*`):
- histograms: `time_to_first_token_seconds` and `inter_token_latency_seconds` (streaming requests:
  a non-streaming request gets its tokens only at the end, so it has neither), and
  `e2e_request_latency_seconds` (every request);
- counters: `prompt_tokens_total`, `generation_tokens_total`, `cached_tokens_total`,
  `requests_total{outcome}` (finished | aborted | error | timeout | queue_timeout | cancelled),
  `rejected_requests_total{status, reason}` (every 4xx/5xx answer; `reason` is the error's
  `code` (queue_full, queue_timeout, request_timeout, context_length_exceeded, engine_dead,
  draining, invalid_api_key, request_too_large, ...) or its `type` when it has no code);
- gauges, refreshed from the scheduler on each scrape: `num_running_reqs`, `num_queue_reqs`,
  `token_usage` (KV slots held by requests or the cache / capacity), `cache_hit_rate` (cached /
  prompt tokens since start), `engine_healthy`, `http_requests_in_flight`, `admitted_requests`
  (requests the tokenizer manager holds: what `--max-queued-requests` bounds);
- speculative decoding (docs/speculative.md), from each finished request's `meta_info` when it
  carries `spec_verify_ct` / `spec_accept_length` (speculation on; a request without verify steps
  is not observed): the histogram `spec_accept_length` (the request's mean tokens committed per
  verify step, bonus token included; buckets 1..16) and the counters `spec_verify_steps_total`
  and `spec_accepted_tokens_total` (their ratio: the server-wide mean accepted length);
- `admission_limit{limit}`: the configured limits (`max_queued_requests`, `request_timeout_s`,
  `queue_timeout_s`, `context_length`, `max_total_tokens`), set once at start; an unset limit is
  absent.

Threading: updated on uvicorn's event loop only (TokenizerManager listeners and the /metrics route).
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from radixlm.runtime.frontend.tokenizer_manager import ReqState

CONTENT_TYPE = CONTENT_TYPE_LATEST
HEALTH_RID_PREFIX = "HEALTH_CHECK_"
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0)
_ITL_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)
_SPEC_ACCEPT_BUCKETS = tuple(float(n) for n in range(1, 17))  # tokens per verify step
_E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0)


class ServerMetrics:
    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        self.labels = {"model_name": model_name}
        names = list(self.labels)
        r = self.registry

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Any:
            return Histogram(f"radixlm:{name}", doc, names, buckets=buckets, registry=r).labels(
                **self.labels
            )

        def counter(name: str, doc: str) -> Any:
            return Counter(f"radixlm:{name}", doc, names, registry=r).labels(**self.labels)

        def gauge(name: str, doc: str) -> Any:
            return Gauge(f"radixlm:{name}", doc, names, registry=r).labels(**self.labels)

        self.ttft = hist(
            "time_to_first_token_seconds",
            "Time to first token (streaming requests).",
            _LATENCY_BUCKETS,
        )
        self.itl = hist(
            "inter_token_latency_seconds", "Time between output tokens (streaming).", _ITL_BUCKETS
        )
        self.e2e = hist(
            "e2e_request_latency_seconds", "Request latency, arrival to last token.", _E2E_BUCKETS
        )
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of ended requests.")
        self.generation_tokens = counter("generation_tokens", "Generated tokens of ended requests.")
        self.cached_tokens = counter("cached_tokens", "Prompt tokens served from the prefix cache.")
        self._requests = Counter("radixlm:requests", "Requests that ran, by how they ended.",
                                 [*names, "outcome"], registry=r)  # fmt: skip
        self._rejected = Counter("radixlm:rejected_requests",
                                 "HTTP errors answered, by status and reason (the error code).",
                                 [*names, "status", "reason"], registry=r)  # fmt: skip
        self.spec_accept_length = hist(
            "spec_accept_length",
            "Speculative decoding: a request's mean tokens committed per verify step.",
            _SPEC_ACCEPT_BUCKETS,
        )
        self.spec_verify_steps = counter("spec_verify_steps", "Speculative verify steps.")
        self.spec_accepted_tokens = counter(
            "spec_accepted_tokens", "Tokens committed by speculative verify steps."
        )
        self.num_running = gauge("num_running_reqs", "Requests running in the scheduler.")
        self.num_queue = gauge("num_queue_reqs", "Requests waiting in the scheduler's queue.")
        self.token_usage = gauge("token_usage", "Fraction of KV slots in use (requests + cache).")
        self.cache_hit_rate = gauge("cache_hit_rate", "Cached / prompt tokens since start.")
        self.healthy = gauge("engine_healthy", "1 while the scheduler and detokenizer run.")
        self.in_flight = gauge("http_requests_in_flight", "HTTP requests running the engine.")
        self.admitted = gauge("admitted_requests", "Requests held by the tokenizer manager.")
        self._limits = Gauge("radixlm:admission_limit", "Configured admission limits.",
                             [*names, "limit"], registry=r)  # fmt: skip
        self.started = time.time()

    # ---- hooks ---------------------------------------------------------------------------------
    def on_request_end(self, state: ReqState) -> None:
        """TokenizerManager listener: called once per request, whatever its outcome."""
        if state.rid.startswith(HEALTH_RID_PREFIX):
            return
        now = time.perf_counter()
        self._requests.labels(**self.labels, outcome=state.outcome).inc()
        self.e2e.observe(now - state.created)
        if state.out is not None:
            self.prompt_tokens.inc(state.out.prompt_tokens)
            self.cached_tokens.inc(state.out.cached_tokens)
        self.generation_tokens.inc(len(state.output_ids))
        if state.stream and state.first_token_time is not None:
            self.ttft.observe(state.first_token_time - state.created)
            for gap in state.itl:
                self.itl.observe(gap)
        if state.finished and state.meta_info is not None:  # NOTE: a stream cut short: partial
            self.observe_spec(state.meta_info)

    def observe_spec(self, meta_info: dict[str, Any]) -> None:
        """Speculative decoding's per-request figures, when `meta_info` has them (absent: off)."""
        steps = meta_info.get("spec_verify_ct")
        accept = meta_info.get("spec_accept_length")
        if not steps or accept is None:
            return
        self.spec_accept_length.observe(float(accept))
        self.spec_verify_steps.inc(int(steps))
        self.spec_accepted_tokens.inc(round(float(accept) * int(steps)))

    def count_error(self, status: int, reason: str) -> None:
        """One HTTP error answered (by a route, an error handler or the guard middleware)."""
        self._rejected.labels(**self.labels, status=str(status), reason=reason).inc()

    def set_limits(self, limits: dict[str, float | None]) -> None:
        """Publish the admission limits (None: not configured, left out)."""
        for name, value in limits.items():
            if value is not None:
                self._limits.labels(**self.labels, limit=name).set(value)

    def update_load(self, info: dict[str, Any] | None, in_flight: int, admitted: int = 0) -> None:
        """Refresh the gauges from the scheduler's `get_info` (None: the engine is dead)."""
        self.in_flight.set(in_flight)
        self.admitted.set(admitted)
        self.healthy.set(0 if info is None else 1)
        if info is None:
            return
        self.num_running.set(info.get("num_running", 0))
        self.num_queue.set(info.get("num_waiting", 0))
        capacity = max(1, int(info.get("capacity", 1)))
        free = int(info.get("free_slots", 0))
        self.token_usage.set((capacity - free) / capacity)
        prompt = int(info.get("prompt_tokens", 0))
        self.cache_hit_rate.set(int(info.get("cached_tokens", 0)) / prompt if prompt else 0.0)

    def render(self) -> bytes:
        return generate_latest(self.registry)
