"""`Scheduler`: continuous batching over the radix cache, one iteration at a time.

Data flow of one iteration (`run_once`; process.py's loop calls it between receiving messages
(`handle`) and sending `take_outputs()` to the detokenizer):
    intake (intake.py): compiled grammars queue their requests; `queue_timeout` sheds
    -> a step in flight (overlap.py)? launch the next one from its device tokens, apply it
    -> else `get_next_batch`: an EXTEND batch (a chunked prompt's next chunk first, then
       waiting requests in policy order, admitted by `PrefillAdder`, policy.py) if any request
       can be admitted, else a DECODE batch of all running requests (retracting some back to
       `waiting` when the KV pool cannot hold one more token for each)
    -> `run_batch`: the one step path (step.py: ForwardBatch -> ModelRunner -> logits -> grammar
       mask -> sampler) gives a `StepOutput`; an eligible greedy decode is left in flight
       (overlap.py), any other is applied at once by the one result path (results.py: tokens,
       logprobs, stops, grammar, jump-forward, finishing, KV release, outputs).

Ownership: the scheduler owns the queues (queues.py), the prefix cache and the admission policy
state; the `ModelRunner` (passed in: it owns the model, the KV pool and `req_to_token`) is only
used through the step path. Single-threaded: everything here is touched only from the loop that
calls `handle` and `run_once`. No processes or sockets here: the process entry (process.py) owns
those, and tests drive a `Scheduler` in-process.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from radixlm.runtime.constrained.setup import make_grammar_manager
from radixlm.runtime.executor.forward_batch import ForwardMode
from radixlm.runtime.executor.host_transfer import HostTransfer
from radixlm.runtime.mem.radix_cache import make_prefix_cache
from radixlm.runtime.processes import io
from radixlm.runtime.sampling.stop_match import StopChecker
from radixlm.runtime.scheduler.info import SchedulerInfo, new_stats
from radixlm.runtime.scheduler.intake import RequestIntake
from radixlm.runtime.scheduler.overlap import OverlapDecode
from radixlm.runtime.scheduler.policy import NewTokenRatio, PrefillAdder, order_waiting
from radixlm.runtime.scheduler.queues import ReqQueues
from radixlm.runtime.scheduler.results import ResultPath
from radixlm.runtime.scheduler.schedule_batch import OutOfSlotsError, ScheduleBatch
from radixlm.runtime.scheduler.step import ModelStep
from radixlm.runtime.server_args import ServerArgs
from radixlm.runtime.speculative.setup import make_proposer
from radixlm.runtime.speculative.spec_step import SpeculativeStep

logger = logging.getLogger(__name__)


class Scheduler:
    def __init__(self, args: ServerArgs, runner: Any, tokenizer: Any = None) -> None:
        """`runner`: an executor/model_runner.py `ModelRunner` (or an object with its forward
        interface); `tokenizer`: None without one (`skip_tokenizer_init`)."""
        self.args = args
        self.runner = runner
        self.config = runner.config
        self.device = runner.device
        self.tokenizer = tokenizer
        self.eos_ids = tuple(self.config.eos_token_id)
        if tokenizer is not None and tokenizer.eos_token_id is not None:
            self.eos_ids = tuple(dict.fromkeys((*self.eos_ids, tokenizer.eos_token_id)))
        self.allocator = runner.kv_pool.allocator
        self.cache = make_prefix_cache(
            args.disable_radix_cache, runner.req_to_token, self.allocator
        )
        self.context_len = runner.context_len
        self.max_running = runner.max_running
        chunk = args.resolved().chunked_prefill_size  # NOTE: -1 disables chunked prefill
        self.chunk_size = None if chunk == -1 else chunk
        # Constrained decoding: compiles off this thread; requests wait in `grammars.pending`.
        self.grammars = make_grammar_manager(args, tokenizer, self.config.vocab_size,
                                             self.eos_ids, self.device)  # fmt: skip
        self.queues = ReqQueues(self.cache, args.stream_interval)
        self.ratio = NewTokenRatio(args.schedule_conservativeness)
        self.stats = new_stats()
        transfer = HostTransfer(self.device)
        stops = StopChecker(tokenizer) if tokenizer is not None else None
        self.step = ModelStep(runner, self.grammars, self.allocator, self.cache, transfer,
                              self.config.vocab_size)  # fmt: skip
        self.results = ResultPath(self.queues, self.grammars, stops, self.context_len,
                                  self.ratio, self.stats)  # fmt: skip
        proposer = make_proposer(args, runner)  # None: speculation off
        self.spec = None
        if proposer is not None:
            self.spec = SpeculativeStep(proposer, self.step, self.results, self.queues,
                                        self.grammars, self.context_len, self.stats,
                                        args.speculative_verify_all)  # fmt: skip
        overlap = not args.disable_overlap_schedule and (
            self.device.type == "cuda" or args.overlap_schedule_on_cpu
        )  # NOTE: on CPU the forward is synchronous: launching ahead only delays each token
        if overlap and self.spec is not None:
            logger.info("speculative decoding is on: the overlapped schedule is off")
            overlap = False
        self.overlap = OverlapDecode(overlap, self.step, self.results, self.queues, transfer,
                                     self.context_len, self.stats)  # fmt: skip
        self.intake = RequestIntake(self.queues, self.grammars, self.eos_ids, self.device,
                                    args.random_seed, args.queue_timeout)  # fmt: skip
        resolved = {} if proposer is None else {"speculative_num_draft_tokens": proposer.num_nodes}
        self.info = SchedulerInfo(runner, self.step, self.queues, self.grammars, self.ratio,
                                  self.stats, lambda: self.idle, self.chunk_size,
                                  self.eos_ids, resolved, proposer)  # fmt: skip

    @property
    def idle(self) -> bool:
        return self.queues.empty and self.overlap.inflight is None

    @property
    def has_work(self) -> bool:
        """Something to run or to send: the loop must not block on its socket."""
        return not self.idle or bool(self.queues.outputs)

    # ---- loop ----------------------------------------------------------------------------------
    def handle(self, msg: io.GenerateReq | io.AbortReq | io.ControlReq) -> io.ControlResp | None:
        """Apply one message; a control request's reply is returned (sent by the caller)."""
        if isinstance(msg, io.GenerateReq):
            self.intake.add_request(msg)
        elif isinstance(msg, io.AbortReq):
            self.intake.abort(msg.rid)
        elif isinstance(msg, io.ControlReq):
            self.overlap.drain()  # NOTE: control requests see no step in flight
            return self.info.control(msg)
        return None

    def run_once(self) -> None:
        """One iteration: intake housekeeping, then at most one forward launched and one applied."""
        self.intake.poll_grammars()
        self.intake.expire_waiting()
        start = time.perf_counter()
        if self.overlap.inflight is not None:
            self.overlap.step()
            self.info.count_time("decode", start)
            return
        batch = self.get_next_batch()
        if batch is not None:
            self.run_batch(batch)
            self.info.count_time("decode" if batch.mode == ForwardMode.DECODE else "extend", start)

    def take_outputs(self) -> list[io.ReqOut]:
        return self.queues.take_outputs()

    # ---- batching ------------------------------------------------------------------------------
    def get_next_batch(self) -> ScheduleBatch | None:
        self.queues.drop_finished_running()
        extend = self.get_extend_batch()
        if extend is not None:
            return extend
        if not self.queues.running:
            self.ratio.reset()
            return None
        return ScheduleBatch(list(self.queues.running), ForwardMode.DECODE)

    def get_extend_batch(self) -> ScheduleBatch | None:
        queues = self.queues
        if not queues.waiting and queues.chunked is None:
            return None
        adder = PrefillAdder(self.cache, queues.running, self.ratio.value,
                             self.args.max_prefill_tokens, self.chunk_size,
                             self.max_running)  # fmt: skip
        if queues.chunked is not None:
            adder.add_chunked(queues.chunked)
        if queues.waiting:
            order_waiting(queues.waiting, self.args.schedule_policy, self.cache)
            share_check = self.args.schedule_policy == "lpm" and not self.args.disable_radix_cache
            for req in list(queues.waiting):
                if not adder.add(req, share_check):
                    break
        if not adder.admitted:
            return None
        for req in adder.admitted:
            if not req.counted:
                req.counted = True
                self.stats["prompt_tokens"] += len(req.origin_input_ids)
                self.stats["cached_tokens"] += req.cached_tokens
        admitted = set(map(id, adder.admitted))
        queues.waiting = [r for r in queues.waiting if id(r) not in admitted]
        queues.chunked = adder.new_chunked
        return ScheduleBatch(adder.admitted, ForwardMode.EXTEND)

    def retract_for_decode(self) -> None:
        """Move requests back to `waiting` until every remaining one can take one more token."""
        running = self.queues.running
        order = sorted(running, key=lambda r: (len(r.output_ids), -len(r.origin_input_ids)))
        while len(running) > 1:
            if self.allocator.available() + self.cache.evictable_size() >= len(running):
                break
            victim = order.pop(0)
            running.remove(victim)
            self.queues.requeue(victim)
            victim.times_retracted += 1
            self.stats["retracted"] += 1
        self.ratio.retracted()

    # ---- forward -------------------------------------------------------------------------------
    def run_batch(self, batch: ScheduleBatch) -> None:
        if batch.mode == ForwardMode.EXTEND:
            spec = self.spec
            out = self.step.run(batch, keep_hidden=spec is not None and spec.needs_hidden)
            hidden = spec.proposer_hidden(out.hidden) if spec is not None else None
            self.results.apply(out)
            if spec is not None:
                spec.on_extended(batch.reqs, hidden)
            return
        if self.allocator.available() + self.cache.evictable_size() < len(batch.reqs):
            self.retract_for_decode()
            batch = ScheduleBatch(list(self.queues.running), ForwardMode.DECODE)
        try:
            if self.spec is not None:
                self.spec.run(batch)  # proposes, verifies and applies (spec_step.py)
                return
            if self.overlap.eligible(batch.reqs):
                self.overlap.launch(batch)  # applied by the next iteration
                return
            out = self.step.run(batch)
        except OutOfSlotsError:  # a single request filled the pool: it cannot grow
            for req in batch.reqs:
                req.finished_reason = {"type": "length", "length": len(req.output_ids)}
            self.results.finish_decode(batch.reqs)
            return
        self.results.apply(out)
