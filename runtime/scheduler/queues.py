"""`ReqQueues`: the scheduler's requests by state, and what leaves a request's KV or output.

    waiting  (intake.py appends; policy orders; retraction and jump-forward re-queue at the front)
    -> running  (admitted and prefilled; decoding one token per step)
       or chunked  (the one request whose prompt is being prefilled chunk by chunk)
    -> finished: `release` hands its KV to the prefix cache; `queue_output` adds its last
       message to `outputs`, which the process loop sends to the detokenizer.

Ownership: one object per `Scheduler`, handed to every component (intake, results, overlap,
info) by its constructor; all of them run on the scheduler's single thread.
"""

from __future__ import annotations

import torch

from radixlm.runtime.mem.prefix_cache import PrefixCache
from radixlm.runtime.processes import io
from radixlm.runtime.scheduler.output import error_output, make_output
from radixlm.runtime.scheduler.req import Req


class ReqQueues:
    def __init__(self, cache: PrefixCache, stream_interval: int) -> None:
        self.cache = cache
        self.stream_interval = stream_interval
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.chunked: Req | None = None
        self.outputs: list[io.ReqOut] = []  # due to the detokenizer

    @property
    def empty(self) -> bool:
        return not self.waiting and not self.running and self.chunked is None

    # ---- KV ------------------------------------------------------------------------------------
    def release(self, req: Req) -> None:
        """Hand a finished request's KV to the prefix cache and free its row."""
        if req.req_pool_idx is not None:
            self.cache.cache_finished_req(req)
            req.req_pool_idx = None

    def requeue(self, req: Req) -> None:
        """Hand a running request's KV to the prefix cache, free its row and put it first in the
        queue; its next extend re-matches that KV and computes the rest."""
        self.cache.cache_finished_req(req)
        req.req_pool_idx = None
        req.prefix_slots = torch.empty(0, dtype=torch.int64)
        req.last_node = None
        req.computed = 0
        self.waiting.insert(0, req)

    def drop_finished_running(self) -> None:
        """Running (or chunked) requests finished outside a step (aborted): release and report."""
        dropped = [r for r in self.running if r.finished]
        if self.chunked is not None and self.chunked.finished:
            dropped.append(self.chunked)
            self.chunked = None
        for req in dropped:
            if req in self.running:
                self.running.remove(req)
            self.release(req)
            self.queue_output(req)

    # ---- outputs -------------------------------------------------------------------------------
    def queue_output(self, req: Req) -> None:
        due = req.finished or (
            req.stream and (len(req.output_ids) - req.sent_ids) >= self.stream_interval
        )
        if due or (req.stream and not req.first_sent and req.output_ids):
            self.outputs.append(make_output(req))

    def emit_error(
        self, rid: str, prompt_tokens: int, message: str, status_code: int = 400
    ) -> None:
        """End a request that holds no KV with an error (400: invalid; 429: queue_timeout)."""
        self.outputs.append(error_output(rid, prompt_tokens, message, status_code))

    def take_outputs(self) -> list[io.ReqOut]:
        outs, self.outputs = self.outputs, []
        return outs
