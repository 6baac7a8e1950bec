"""`RequestIntake`: how requests enter (and leave unstarted) the scheduler's queues.

    GenerateReq (validated and tokenized once, by the tokenizer manager: its values are
    trusted here) -> `Req` -> `queues.waiting`, or parked with the grammar workers until its
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
    ) -> None:
        self.queues = queues
        self.grammars = grammars
        self.eos_ids = eos_ids
        self.device = device
        self.rng = random.Random(seed)
        self.queue_timeout = queue_timeout

    def add_request(self, msg: io.GenerateReq) -> None:
        # NOTE: no validation here: TokenizerManager.prepare checked the prompt against the
        # vocabulary, the context length and the KV pool (this scheduler's own figures, from
        # its start-up info), and msgspec checked the message's types when it was decoded.
        sp = msg.sampling_params
        req = Req(
            msg.rid,
            msg.input_ids,
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
