"""Request intake of the scheduler (a mixin of `Scheduler`): new requests are validated (the last
line of defence after the tokenizer manager) and queued, or handed to the grammar workers until
their constraint compiles; queued requests past `queue_timeout` are shed; aborts by request id.

Runs on the scheduler loop thread only, like everything the scheduler owns.
"""

from __future__ import annotations

import time

from radixlm.runtime.constrained.base import GrammarSpec
from radixlm.runtime.errors import InvalidRequestError
from radixlm.runtime.processes import io
from radixlm.runtime.sampling.sampling_params import SamplingParams
from radixlm.runtime.scheduler.output import make_output
from radixlm.runtime.scheduler.req import Req


class RequestIntake:
    """Mixed into `Scheduler`: uses its args, config, grammars, waiting/running queues and
    pending outputs (no state of its own)."""

    def add_request(self, msg: io.GenerateReq) -> None:
        try:
            sp = SamplingParams.from_dict(msg.sampling_params, self.config.vocab_size)
            self.validate(msg, sp)
        except InvalidRequestError as exc:
            # NOTE: the tokenizer manager validates first; this is the last line of defence.
            self.emit_error(msg.rid, len(msg.input_ids), str(exc))
            return
        req = Req(
            msg.rid,
            list(msg.input_ids),
            sp,
            eos_ids=self.eos_ids,
            seed=self.rng.getrandbits(63),
            return_logprob=msg.return_logprob,
            logprob_start_len=msg.logprob_start_len,
            top_logprobs_num=msg.top_logprobs_num,
            stream=msg.stream,
            arrival_time=msg.arrival_time,
            device=self.device,
        )
        if sp.constraint is not None:
            try:
                req.grammar = self.grammars.submit(req, GrammarSpec.from_constraint(*sp.constraint))
            except InvalidRequestError as exc:
                self.emit_error(msg.rid, len(msg.input_ids), str(exc))
                return
            if req.grammar is None:
                return  # compiling: `poll_grammars` queues it when ready
        self.waiting.append(req)

    def poll_grammars(self) -> None:
        ready, failed = self.grammars.poll()
        self.waiting.extend(ready)
        for req, message in failed:
            self.emit_error(req.rid, len(req.origin_input_ids), message)

    def expire_waiting(self) -> None:
        """`queue_timeout`: drop queued requests that never started and waited too long (from
        their arrival at the tokenizer manager). NOTE: `counted` is set when a request is first
        admitted, so retracted and jump-forward requests (already started) are never dropped."""
        limit = self.args.queue_timeout
        if limit is None or not self.waiting:
            return
        now = time.time()
        expired = [r for r in self.waiting if not r.counted and now - r.arrival_time > limit]
        for req in expired:
            self.waiting.remove(req)
            message = (
                f"the request waited {now - req.arrival_time:.1f} s in the queue without starting "
                f"(queue_timeout={limit} s): the server is overloaded, retry later"
            )
            self.emit_error(req.rid, len(req.origin_input_ids), message, status_code=429)

    def validate(self, msg: io.GenerateReq, sp: SamplingParams) -> None:
        n = len(msg.input_ids)
        if n == 0:
            raise InvalidRequestError("the prompt is empty", "input_ids")
        if any(not 0 <= t < self.config.vocab_size for t in msg.input_ids):
            raise InvalidRequestError("input_ids holds ids outside the vocabulary", "input_ids")
        if n + sp.max_new_tokens > self.context_len:
            raise InvalidRequestError(
                f"prompt ({n} tokens) + max_new_tokens ({sp.max_new_tokens}) exceeds the context "
                f"length {self.context_len}",
                "max_new_tokens",
            )
        if n + sp.max_new_tokens > self.allocator.capacity:
            raise InvalidRequestError(
                f"prompt + max_new_tokens ({n + sp.max_new_tokens}) exceeds the KV pool "
                f"({self.allocator.capacity} tokens)",
                "max_new_tokens",
            )
        if sp.stop and self.tokenizer is None:
            raise InvalidRequestError("stop strings need a tokenizer (skip_tokenizer_init)", "stop")
        if sp.stop_regex and self.tokenizer is None:
            raise InvalidRequestError(
                "stop_regex needs a tokenizer (skip_tokenizer_init)", "stop_regex"
            )
        # NOTE: constraints are checked (again) and compiled by the grammar workers.

    def abort(self, rid: str) -> None:
        for req in self.grammars.abort(rid):
            req.abort("aborted")
            self.pending_outputs.append(make_output(req))
        for req in list(self.waiting):
            if rid in ("", req.rid):
                self.waiting.remove(req)
                req.abort("aborted")
                self.pending_outputs.append(make_output(req))
        for req in [*self.running, *([self.chunked_req] if self.chunked_req else [])]:
            if rid in ("", req.rid):
                req.abort("aborted")  # freed when the next batch result is processed
