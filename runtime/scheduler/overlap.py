"""Overlapped decode: step n + 1 is launched from step n's tokens on the device before the host
reads them (SGLang's overlap schedule), so the host's per-step work (reading tokens, stop checks,
outputs, the next batch's metadata) runs while the GPU computes.

Flow (`Scheduler.event_loop`): an eligible decode batch is launched (`launch_decode`) and left in
flight; the next iteration launches the following step for the same requests with the in-flight
step's next-token tensor as input ids (`step_inflight`), then reads and processes the in-flight
step (`process_decode`). A request whose step-n token reaches a length limit is not launched
again; one that stops at step n on EOS or a stop condition has already been launched in step
n + 1: that token is dropped, and its KV (the finished token's) is valid and goes to the prefix
cache with the rest.

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

from typing import NamedTuple

import torch

from radixlm.runtime.executor.forward_batch import ForwardMode
from radixlm.runtime.executor.host_transfer import HostTransfer
from radixlm.runtime.sampling.sampler import sample
from radixlm.runtime.sampling.sampling_batch import SamplingBatch, needs_processor
from radixlm.runtime.scheduler.req import Req
from radixlm.runtime.scheduler.schedule_batch import ScheduleBatch, prepare_decode


class InFlightDecode(NamedTuple):
    batch: ScheduleBatch
    next_ids: torch.Tensor  # [bs] int64 on the device: the next step's input ids
    host_ids: torch.Tensor  # [bs] int64 on the host (pinned on CUDA), valid once `copied`
    copied: torch.cuda.Event | None  # None: host_ids is already valid (CPU)


class OverlapDecode:
    """Mixed into `Scheduler` (uses its args, queues, pools, runner and stats)."""

    inflight: InFlightDecode | None
    transfer: HostTransfer

    def overlap_eligible(self, reqs: list[Req]) -> bool:
        if self.args.disable_overlap_schedule or self.waiting or self.chunked_req is not None:
            return False
        # NOTE: on CPU the forward is synchronous: launching ahead only delays each token's
        # delivery by a step, so it is off unless a test asks for it.
        if self.device.type != "cuda" and not self.args.overlap_schedule_on_cpu:
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

    def launch_decode(
        self, batch: ScheduleBatch, input_ids: torch.Tensor | None = None
    ) -> InFlightDecode:
        """Prepare, run and sample a greedy decode step without reading its tokens."""
        inputs = self.runner.decode_input_buffer(len(batch.reqs))
        fb = prepare_decode(batch, self.allocator, self.cache, self.transfer, inputs, input_ids)
        hidden = self.runner.forward(fb)
        self.forward_ct += 1
        for req in batch.reqs:
            req.computed += 1
        logits = self.runner.compute_logits(hidden)
        next_ids = sample(logits, SamplingBatch.greedy_only(len(batch.reqs))).next_token_ids
        # NOTE: the copy to the host is queued right behind this step (on its own stream):
        # reading the tokens must not wait for the step launched after it (.tolist() would).
        host_ids, copied = self.transfer.to_host(next_ids)
        return InFlightDecode(batch, next_ids, host_ids, copied)

    def step_inflight(self) -> None:
        """Launch the step after the in-flight one when still eligible, then process the
        in-flight one."""
        flight = self.inflight
        assert flight is not None
        self.drop_aborted_running()
        batch_ids = {id(r) for r in flight.batch.reqs}
        # Requests that certainly end with the in-flight token (length limits) are not launched
        # again; one that ends on EOS or a stop condition wastes its row of the next step.
        keep = [
            k for k, r in enumerate(flight.batch.reqs) if not r.finished and not self.ends_next(r)
        ]
        reqs = [flight.batch.reqs[k] for k in keep]
        ahead = None
        # NOTE: every running request must be in the batch (it always is: nothing is admitted
        # while a step is in flight); otherwise the plain path picks all of them up next.
        everyone = all(id(r) in batch_ids for r in self.running)
        if reqs and everyone and self.overlap_eligible(reqs):
            ids = flight.next_ids
            if len(keep) != len(flight.batch.reqs):
                ids = ids.index_select(0, self.transfer.to_device(keep))
            ahead = self.launch_decode(ScheduleBatch(reqs, ForwardMode.DECODE), ids)
            self.stats["overlapped_steps"] += 1
        self.process_decode(flight)
        self.inflight = ahead

    def ends_next(self, req: Req) -> bool:
        """Whether the token in flight for `req` (not appended yet) reaches a length limit."""
        n = len(req.output_ids) + 1
        return n >= req.sampling_params.max_new_tokens or req.seqlen + 1 >= self.context_len

    def drain_inflight(self) -> None:
        """Process the in-flight step, launching nothing after it."""
        if self.inflight is not None:
            flight, self.inflight = self.inflight, None
            self.process_decode(flight)

    def process_decode(self, flight: InFlightDecode) -> None:
        """Read the step's tokens (the one host sync) and apply them to the requests that were
        still running; requests finished or aborted meanwhile drop theirs."""
        if flight.copied is not None:
            flight.copied.synchronize()
        tokens = flight.host_ids.tolist()
        live = [(k, r) for k, r in enumerate(flight.batch.reqs) if not r.finished]
        for k, req in live:
            self.append_token(req, tokens[k], None, None, k)
        self.finish_decode(ScheduleBatch([r for _, r in live], ForwardMode.DECODE))
        self.decay_new_token_ratio()
