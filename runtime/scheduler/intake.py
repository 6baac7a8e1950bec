"""`RequestIntake`: how requests enter (and leave unstarted) the scheduler's queues.

    GenerateReq -> `Req` -> `queues.waiting`, or parked with the grammar workers until its
    constraint compiles (`poll_grammars` queues it, or ends it with the compile error);
    queued requests past `queue_timeout` are shed (429); aborts by request id.

Ownership: owns the request seed generator; writes `queues` (queues.py). Runs on the scheduler
loop thread only, like everything the scheduler owns.
"""

from __future__ import annotations

import random
import time
from typing import Any

import torch

from radixlm.runtime.constrained.base import GrammarSpec
from radixlm.runtime.errors import InvalidRequestError
from radixlm.runtime.processes import io
from radixlm.runtime.sampling.sampling_params import SamplingParams
from radixlm.runtime.scheduler.output import make_output
from radixlm.runtime.scheduler.queues import ReqQueues
from radixlm.runtime.scheduler.req import Req


class RequestIntake:
    def __init__(
        self,
        queues: ReqQueues,
        grammars: Any,  # constrained/manager.py `GrammarManager`
        eos_ids: tuple[int, ...],
        device: torch.device,
        seed: int | None,
        queue_timeout: float | None,
        limits: tuple[int, int, int],  # (vocab size, context length, KV pool capacity)
        has_tokenizer: bool,
    ) -> None:
        self.queues = queues
        self.grammars = grammars
        self.eos_ids = eos_ids
        self.device = device
        self.rng = random.Random(seed)
        self.queue_timeout = queue_timeout
        self.vocab_size, self.context_len, self.capacity = limits
        self.has_tokenizer = has_tokenizer

    def add_request(self, msg: io.GenerateReq) -> None:
        try:
            sp = SamplingParams.from_dict(msg.sampling_params, self.vocab_size)
            self.validate(msg, sp)
        except InvalidRequestError as exc:
            # NOTE: the tokenizer manager validates first; this is the last line of defence.
            self.queues.emit_error(msg.rid, len(msg.input_ids), str(exc))
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
                self.queues.emit_error(msg.rid, len(msg.input_ids), str(exc))
                return
            if req.grammar is None:
                return  # compiling: `poll_grammars` queues it when ready
        self.queues.waiting.append(req)

    def poll_grammars(self) -> None:
        ready, failed = self.grammars.poll()
        self.queues.waiting.extend(ready)
        for req, message in failed:
            self.queues.emit_error(req.rid, len(req.origin_input_ids), message)

    def expire_waiting(self) -> None:
        """`queue_timeout`: drop queued requests that never started and waited too long (from
        their arrival at the tokenizer manager). NOTE: `counted` is set when a request is first
        admitted, so retracted and jump-forward requests (already started) are never dropped."""
        limit = self.queue_timeout
        waiting = self.queues.waiting
        if limit is None or not waiting:
            return
        now = time.time()
        expired = [r for r in waiting if not r.counted and now - r.arrival_time > limit]
        for req in expired:
            waiting.remove(req)
            message = (
                f"the request waited {now - req.arrival_time:.1f} s in the queue without starting "
                f"(queue_timeout={limit} s): the server is overloaded, retry later"
            )
            self.queues.emit_error(req.rid, len(req.origin_input_ids), message, status_code=429)

    def validate(self, msg: io.GenerateReq, sp: SamplingParams) -> None:
        n = len(msg.input_ids)
        if n == 0:
            raise InvalidRequestError("the prompt is empty", "input_ids")
        if any(not 0 <= t < self.vocab_size for t in msg.input_ids):
            raise InvalidRequestError("input_ids holds ids outside the vocabulary", "input_ids")
        if n + sp.max_new_tokens > self.context_len:
            raise InvalidRequestError(
                f"prompt ({n} tokens) + max_new_tokens ({sp.max_new_tokens}) exceeds the context "
                f"length {self.context_len}",
                "max_new_tokens",
            )
        if n + sp.max_new_tokens > self.capacity:
            raise InvalidRequestError(
                f"prompt + max_new_tokens ({n + sp.max_new_tokens}) exceeds the KV pool "
                f"({self.capacity} tokens)",
                "max_new_tokens",
            )
        if sp.stop and not self.has_tokenizer:
            raise InvalidRequestError("stop strings need a tokenizer (skip_tokenizer_init)", "stop")
        if sp.stop_regex and not self.has_tokenizer:
            raise InvalidRequestError(
                "stop_regex needs a tokenizer (skip_tokenizer_init)", "stop_regex"
            )
        # NOTE: constraints are checked (again) and compiled by the grammar workers.

    def abort(self, rid: str) -> None:
        queues = self.queues
        for req in self.grammars.abort(rid):
            req.abort("aborted")
            queues.outputs.append(make_output(req))
        for req in list(queues.waiting):
            if rid in ("", req.rid):
                queues.waiting.remove(req)
                req.abort("aborted")
                queues.outputs.append(make_output(req))
        for req in [*queues.running, *([queues.chunked] if queues.chunked else [])]:
            if rid in ("", req.rid):
                req.abort("aborted")  # freed when the next batch result is processed
