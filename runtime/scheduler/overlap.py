"""Overlapped decode: step n + 1 is launched from step n's tokens on the device before the host
reads them (SGLang's overlap schedule), so the host's per-step work (reading tokens, stop checks,
outputs, the next batch's metadata) runs while the GPU computes.

Flow (`Scheduler.run_once`): an eligible decode batch is launched (`launch`: the one step path,
step.py, with its tokens left on the device) and kept in flight as a `StepOutput`; the next
iteration launches the following step for the same requests with the in-flight step's
`next_ids` as input ids (`step`), then applies the in-flight one through the one result path
(results.py). A request whose step-n token reaches a length limit is not launched
again; one that stops at step n on EOS or a stop condition has already been launched in step
n + 1: that token is dropped, and its KV (the finished token's) is valid and goes to the prefix
cache with the rest.

Ownership: `OverlapDecode` owns the in-flight step (`inflight`); it gets the step path, the
result path, the queues and the pool through its constructor.

Eligibility (exactness): a CUDA device (CPU only with `overlap_schedule_on_cpu`, for tests); every
request greedy with no logit processor (penalties, bias, pending min_new_tokens), no grammar, no
logprobs; no request waiting for a prefill; KV room for one more token each. Otherwise the
in-flight step is processed first and the batch runs the plain way.

# NOTE: `Req.computed` counts launched steps: while a step is in flight a request has KV for
# every token in `fill_ids` (`computed == seqlen`), so releasing it (abort, finish) hands the
# cache exactly the slots it holds; with nothing in flight `computed == seqlen - 1` as usual.
# Slots and req_to_token rows freed while a step is in flight may be reused at once: every later
# use is a kernel launched after it on the same stream.
"""

from __future__ import annotations

from typing import Any

import torch

from radixlm.runtime.executor.forward_batch import ForwardMode
from radixlm.runtime.executor.host_transfer import HostTransfer
from radixlm.runtime.sampling.sampling_batch import needs_processor
from radixlm.runtime.scheduler.queues import ReqQueues
from radixlm.runtime.scheduler.req import Req
from radixlm.runtime.scheduler.results import ResultPath
from radixlm.runtime.scheduler.schedule_batch import ScheduleBatch
from radixlm.runtime.scheduler.step import ModelStep, StepOutput


class OverlapDecode:
    def __init__(
        self,
        enabled: bool,
        step: ModelStep,
        results: ResultPath,
        queues: ReqQueues,
        transfer: HostTransfer,
        context_len: int,
        stats: dict[str, Any],
    ) -> None:
        self.enabled = enabled  # a CUDA device and not disabled, or `overlap_schedule_on_cpu`
        self.step_path = step
        self.results = results
        self.queues = queues
        self.allocator = step.allocator
        self.cache = step.cache
        self.transfer = transfer
        self.context_len = context_len
        self.stats = stats
        self.inflight: StepOutput | None = None  # launched, tokens not read yet

    def eligible(self, reqs: list[Req]) -> bool:
        queues = self.queues
        if not self.enabled or queues.waiting or queues.chunked is not None:
            return False
        if self.allocator.available() + self.cache.evictable_size() < len(reqs):
            return False
        return all(
            r.grammar is None
            and not r.return_logprob
            and r.sampling_params.is_greedy
            and not needs_processor(r)
            for r in reqs
        )

    def launch(self, batch: ScheduleBatch, input_ids: torch.Tensor | None = None) -> None:
        """Run a greedy decode step without reading its tokens; it stays in flight."""
        assert self.inflight is None
        self.inflight = self.step_path.run(batch, input_ids, greedy=True, to_host=True)

    def step(self) -> None:
        """Launch the step after the in-flight one when still eligible, then apply the
        in-flight one."""
        flight = self.inflight
        assert flight is not None
        self.inflight = None
        self.queues.drop_finished_running()
        reqs_in = flight.batch.reqs
        batch_ids = {id(r) for r in reqs_in}
        # Requests that certainly end with the in-flight token (length limits) are not launched
        # again; one that ends on EOS or a stop condition wastes its row of the next step.
        keep = [k for k, r in enumerate(reqs_in) if not r.finished and not self.ends_next(r)]
        reqs = [reqs_in[k] for k in keep]
        # NOTE: every running request must be in the batch (it always is: nothing is admitted
        # while a step is in flight); otherwise the plain path picks all of them up next.
        everyone = all(id(r) in batch_ids for r in self.queues.running)
        if reqs and everyone and self.eligible(reqs):
            assert flight.next_ids is not None
            ids = flight.next_ids
            if len(keep) != len(reqs_in):
                ids = ids.index_select(0, self.transfer.to_device(keep))
            self.launch(ScheduleBatch(reqs, ForwardMode.DECODE), ids)
            self.stats["overlapped_steps"] += 1
        self.results.apply(flight)

    def ends_next(self, req: Req) -> bool:
        """Whether the token in flight for `req` (not appended yet) reaches a length limit."""
        n = len(req.output_ids) + 1
        return n >= req.sampling_params.max_new_tokens or req.seqlen + 1 >= self.context_len

    def drain(self) -> None:
        """Apply the in-flight step, launching nothing after it."""
        if self.inflight is not None:
            flight, self.inflight = self.inflight, None
            self.results.apply(flight)
