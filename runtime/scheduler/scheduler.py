"""The scheduler process: continuous batching over the radix cache.

Data flow of one iteration (`event_loop`):
    recv (scheduler/intake.py): GenerateReq -> validated `Req` in `waiting`; AbortReq; ControlReq
    -> `get_next_batch`: an EXTEND batch (a chunked prompt's next chunk first, then waiting
       requests in policy order, admitted by `PrefillAdder`) if any request can be admitted,
       else a DECODE batch of all running requests (retracting some back to `waiting` when the
       KV pool cannot hold one more token for each)
    -> `run_batch`: ForwardBatch -> ModelRunner -> logits -> sampler (a greedy decode batch
       is launched and left in flight instead; the next iteration launches the following step
       from its device-side tokens, then reads and processes it: scheduler/overlap.py)
    -> `append_token` per sampled request: tokens, logprobs, stop checks, grammar; then
       `finish_extend` / `finish_decode`: finished requests hand their KV to the prefix cache;
       unfinished extended ones insert their prompt KV too (so it is shared)
    -> `stream_outputs`: BatchTokenOut to the detokenizer (every `stream_interval` steps for
       streaming requests, once at the end for the others).
Runs in its own process, single-threaded; everything it owns (pools, cache, requests) is touched
only from this loop.
"""

from __future__ import annotations

import gc
import logging
import os
import random
import time
from typing import Any

import torch
import zmq

from radixlm.runtime.constrained.setup import make_grammar_manager
from radixlm.runtime.executor.forward_batch import ForwardMode
from radixlm.runtime.executor.host_transfer import HostTransfer
from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.frontend.tokenizer import load_server_tokenizer
from radixlm.runtime.mem.radix_cache import make_prefix_cache
from radixlm.runtime.models.loader import resolve_model
from radixlm.runtime.processes import io
from radixlm.runtime.processes.ipc import PortArgs, TypedReceiver, pull_socket, push_socket, send
from radixlm.runtime.sampling.sampler import sample
from radixlm.runtime.sampling.sampling_batch import SamplingBatch
from radixlm.runtime.sampling.stop_match import StopChecker
from radixlm.runtime.scheduler.info import SchedulerInfo
from radixlm.runtime.scheduler.intake import RequestIntake
from radixlm.runtime.scheduler.output import error_output, make_output
from radixlm.runtime.scheduler.overlap import OverlapDecode
from radixlm.runtime.scheduler.policy import PrefillAdder, order_waiting
from radixlm.runtime.scheduler.req import Req
from radixlm.runtime.scheduler.schedule_batch import (
    OutOfSlotsError,
    ScheduleBatch,
    input_logprobs,
    prepare_decode,
    prepare_extend,
)
from radixlm.runtime.server_args import ServerArgs

logger = logging.getLogger(__name__)

INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO = 0.1
NEW_TOKEN_RATIO_DECAY = 0.001


class Scheduler(RequestIntake, OverlapDecode, SchedulerInfo):
    def __init__(self, args: ServerArgs, ports: PortArgs) -> None:
        self.args = args
        source = resolve_model(args.model_path, args.load_format)
        self.runner = ModelRunner(args, source)
        self.config = source.config
        self.device = self.runner.device
        self.transfer = HostTransfer(self.device)
        self.tokenizer = load_server_tokenizer(args, source.gguf)
        self.stops = StopChecker(self.tokenizer) if self.tokenizer is not None else None
        self.eos_ids = tuple(self.config.eos_token_id)
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            self.eos_ids = tuple(dict.fromkeys((*self.eos_ids, self.tokenizer.eos_token_id)))
        self.cache = make_prefix_cache(
            args.disable_radix_cache, self.runner.req_to_token, self.runner.kv_pool.allocator
        )
        self.allocator = self.runner.kv_pool.allocator
        self.context_len = self.runner.context_len
        self.max_running = self.runner.max_running
        chunk = args.resolved().chunked_prefill_size  # NOTE: -1 disables chunked prefill
        self.chunk_size = None if chunk == -1 else chunk
        self.rng = random.Random(args.random_seed)
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.chunked_req: Req | None = None
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO * args.schedule_conservativeness
        self.forward_ct = 0
        self.stats = {
            "prompt_tokens": 0,
            "cached_tokens": 0,
            "generated_tokens": 0,
            "retracted": 0,
            "overlapped_steps": 0,
            # Wall time of the loop iterations that ran a forward, by kind (an extend iteration
            # ends at its tokens' read-back; an overlapped decode iteration launches one step
            # and reads the previous one).
            "extend_iterations": 0,
            "extend_seconds": 0.0,
            "decode_iterations": 0,
            "decode_seconds": 0.0,
        }
        self.inflight = None  # a decode step launched and not read yet (overlap.py)
        self.ctx = zmq.Context(2)
        self.recv_sock = TypedReceiver(pull_socket(self.ctx, ports.scheduler_ipc), io.ToScheduler)
        self.detok_sock = push_socket(self.ctx, ports.detokenizer_ipc)
        self.tokenizer_sock = push_socket(self.ctx, ports.tokenizer_ipc)
        self.pending_outputs: list[io.ReqOut] = []
        # Constrained decoding: compiles off this thread; requests wait in `grammars.pending`.
        self.grammars = make_grammar_manager(args, self.tokenizer, self.config.vocab_size,
                                             self.eos_ids, self.device)  # fmt: skip

    @property
    def idle(self) -> bool:
        return (
            not self.waiting
            and not self.running
            and self.chunked_req is None
            and self.inflight is None
        )

    # ---- loop ----------------------------------------------------------------------------------
    def event_loop(self) -> None:
        while True:
            if self.idle and not self.pending_outputs:
                self.recv_sock.poll(5 if self.grammars.pending else 1000)
            for msg in self.recv_sock.recv_all():
                self.handle(msg)
            self.poll_grammars()
            self.expire_waiting()
            start = time.perf_counter()
            if self.inflight is not None:
                self.step_inflight()
                self.count_time("decode", start)
            else:
                batch = self.get_next_batch()
                if batch is not None:
                    self.run_batch(batch)
                    self.count_time(
                        "decode" if batch.mode == ForwardMode.DECODE else "extend", start
                    )
            self.stream_outputs()

    def handle(self, msg: Any) -> None:
        if isinstance(msg, io.GenerateReq):
            self.add_request(msg)
        elif isinstance(msg, io.AbortReq):
            self.abort(msg.rid)
        elif isinstance(msg, io.ControlReq):
            self.drain_inflight()  # NOTE: control requests see no step in flight
            send(self.tokenizer_sock, self.control(msg))

    # ---- batching ------------------------------------------------------------------------------
    def get_next_batch(self) -> ScheduleBatch | None:
        self.drop_aborted_running()
        extend = self.get_extend_batch()
        if extend is not None:
            return extend
        if not self.running:
            self.new_token_ratio = INIT_NEW_TOKEN_RATIO * self.args.schedule_conservativeness
            return None
        return ScheduleBatch(list(self.running), ForwardMode.DECODE)

    def drop_aborted_running(self) -> None:
        dropped = [r for r in self.running if r.finished]
        if self.chunked_req is not None and self.chunked_req.finished:
            dropped.append(self.chunked_req)
            self.chunked_req = None
        for req in dropped:
            if req in self.running:
                self.running.remove(req)
            self.release(req)
            self.queue_output(req)

    def get_extend_batch(self) -> ScheduleBatch | None:
        if not self.waiting and self.chunked_req is None:
            return None
        adder = PrefillAdder(
            self.cache,
            self.running,
            self.new_token_ratio,
            self.args.max_prefill_tokens,
            self.chunk_size,
            self.max_running,
        )
        if self.chunked_req is not None:
            adder.add_chunked(self.chunked_req)
        if self.waiting:
            order_waiting(self.waiting, self.args.schedule_policy, self.cache)
            share_check = self.args.schedule_policy == "lpm" and not self.args.disable_radix_cache
            for req in list(self.waiting):
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
        self.waiting = [r for r in self.waiting if id(r) not in admitted]
        self.chunked_req = adder.new_chunked
        return ScheduleBatch(adder.admitted, ForwardMode.EXTEND)

    def retract_for_decode(self) -> None:
        """Move requests back to `waiting` until every remaining one can take one more token."""
        order = sorted(self.running, key=lambda r: (len(r.output_ids), -len(r.origin_input_ids)))
        while len(self.running) > 1:
            if self.allocator.available() + self.cache.evictable_size() >= len(self.running):
                break
            victim = order.pop(0)
            self.running.remove(victim)
            self.requeue(victim)
            victim.times_retracted += 1
            self.stats["retracted"] += 1
        self.new_token_ratio = 1.0

    def requeue(self, req: Req) -> None:
        """Hand a running request's KV to the prefix cache, free its row and put it first in the
        queue; its next extend re-matches that KV and computes the rest."""
        self.cache.cache_finished_req(req)
        req.req_pool_idx = None
        req.prefix_slots = torch.empty(0, dtype=torch.int64)
        req.last_node = None
        req.computed = 0
        self.waiting.insert(0, req)

    def jump_forward(self, reqs: list[Req]) -> None:
        """Append the string each request's grammar forces (see constrained/jump_forward.py):
        the KV of the old ids goes to the cache, the new ids are computed by an extend round."""
        for req in reqs:
            new_ids = self.grammars.try_jump(req)
            if new_ids is None:
                continue
            if req in self.running:
                self.running.remove(req)
            # NOTE: requeue caches the KV under the *old* ids before they are replaced.
            self.requeue(req)
            req.output_ids = new_ids

    # ---- forward -------------------------------------------------------------------------------
    def run_batch(self, batch: ScheduleBatch) -> None:
        if batch.mode == ForwardMode.DECODE:
            if self.allocator.available() + self.cache.evictable_size() < len(batch.reqs):
                self.retract_for_decode()
                batch = ScheduleBatch(list(self.running), ForwardMode.DECODE)
            try:
                if self.overlap_eligible(batch.reqs):
                    self.inflight = self.launch_decode(batch)  # read by the next iteration
                    return
                inputs = self.runner.decode_input_buffer(len(batch.reqs))
                fb = prepare_decode(batch, self.allocator, self.cache, self.transfer, inputs)
            except OutOfSlotsError:  # a single request filled the pool: it cannot grow
                for req in batch.reqs:
                    req.finished_reason = {"type": "length", "length": len(req.output_ids)}
                self.finish_decode(batch)
                return
        else:
            fb = prepare_extend(batch, self.allocator, self.cache, self.device)
        hidden = self.runner.forward(fb)
        self.forward_ct += 1
        sampling = batch.sampling_reqs
        lp_results = (
            input_logprobs(hidden, batch, self.runner.compute_logits) if batch.lp_rows else []
        )
        next_ids = logprobs = top = None
        if sampling:
            rows = [r for r in batch.sample_rows if r >= 0]
            last = hidden  # NOTE: decode samples every row, in order: no gather
            if rows != list(range(hidden.shape[0])):
                last = hidden.index_select(0, torch.tensor(rows, device=hidden.device))
            logits = self.runner.compute_logits(last)
            sb = SamplingBatch.from_reqs(sampling, self.config.vocab_size, self.device)
            sb.set_vocab_mask(self.grammars.build_mask(sampling))
            want_lp = any(r.return_logprob for r in sampling)
            top_n = max((r.top_logprobs_num for r in sampling), default=0)
            out = sample(logits, sb, want_lp, top_n)
            next_ids = out.next_token_ids.tolist()
            logprobs = out.logprobs.tolist() if out.logprobs is not None else None
            if out.top_logprobs is not None:
                top = [list(zip(v, i)) for v, i in zip(*(t.tolist() for t in out.top_logprobs))]
        for (i, _, _, _), (values, tops) in zip(batch.lp_rows, lp_results):
            req = batch.reqs[i]
            req.input_logprobs.extend(values)
            if tops is not None:
                req.input_top.extend(tops)
        for req in batch.reqs:
            req.computed += req.extend_len
            if not req.input_logprobs_done and req.computed >= len(req.origin_input_ids):
                req.input_logprobs_done = True
        if next_ids is not None:
            for k, req in enumerate(sampling):
                self.append_token(req, next_ids[k], logprobs, top, k)
            if self.grammars.jump_forward_enabled:
                self.jump_forward(sampling)
        if batch.mode == ForwardMode.DECODE:
            self.finish_decode(batch)
            self.decay_new_token_ratio()
        else:
            self.finish_extend(batch)

    def decay_new_token_ratio(self) -> None:
        self.new_token_ratio = max(
            MIN_NEW_TOKEN_RATIO, self.new_token_ratio - NEW_TOKEN_RATIO_DECAY
        )

    def append_token(self, req: Req, token: int, logprobs, top, k: int) -> None:
        if req.finished:  # aborted meanwhile
            return
        if req.sampling_params.max_new_tokens == 0 and not req.output_ids:
            req.finished_reason = {"type": "length", "length": 0}
            return
        if req.grammar is not None and not req.grammar.accept(token):
            # Only reachable when every token was masked out (e.g. by other logit processors).
            req.abort(f"constrained decoding failed: the grammar rejected token {token}")
            return
        req.output_ids.append(token)
        self.stats["generated_tokens"] += 1
        if req.return_logprob and logprobs is not None:
            req.output_logprobs.append(logprobs[k])
            if req.top_logprobs_num and top is not None:
                req.output_top.append(top[k][: req.top_logprobs_num])
        req.check_finished(self.stops, self.context_len)

    def finish_extend(self, batch: ScheduleBatch) -> None:
        for req in batch.reqs:
            if req is self.chunked_req and not req.finished:
                self.cache.cache_unfinished_req(req)  # its next chunk goes first next round
                continue
            req.is_chunked = False
            if req.finished:
                self.release(req)
            elif req.req_pool_idx is None:
                pass  # NOTE: jump-forward already put it back in the queue (without a row)
            else:
                self.cache.cache_unfinished_req(req)
                self.running.append(req)
            self.queue_output(req)

    def finish_decode(self, batch: ScheduleBatch) -> None:
        for req in batch.reqs:
            if req.finished:
                if req in self.running:
                    self.running.remove(req)
                self.release(req)
            self.queue_output(req)

    def release(self, req: Req) -> None:
        """Hand a finished request's KV to the prefix cache and free its row."""
        if req.req_pool_idx is not None:
            self.cache.cache_finished_req(req)
            req.req_pool_idx = None

    # ---- outputs -------------------------------------------------------------------------------
    def queue_output(self, req: Req) -> None:
        due = req.finished or (
            req.stream and (len(req.output_ids) - req.sent_ids) >= self.args.stream_interval
        )
        if due or (req.stream and not req.first_sent and req.output_ids):
            self.pending_outputs.append(make_output(req))

    def emit_error(
        self, rid: str, prompt_tokens: int, message: str, status_code: int = 400
    ) -> None:
        """End a request that holds no KV with an error (400: invalid; 429: queue_timeout)."""
        self.pending_outputs.append(error_output(rid, prompt_tokens, message, status_code))

    def stream_outputs(self) -> None:
        if self.pending_outputs:
            send(self.detok_sock, io.BatchTokenOut(self.pending_outputs))
            self.pending_outputs = []


def run_scheduler_process(args: ServerArgs, ports: PortArgs, pipe: Any) -> None:
    """Entry point of the scheduler process (started with the spawn method)."""
    from radixlm.runtime.processes.process_utils import configure_child_process

    configure_child_process("scheduler", args.log_level)
    try:
        scheduler = Scheduler(args, ports)
    except Exception as exc:
        logger.exception("scheduler failed to start")
        pipe.send({"status": "error", "error": f"{type(exc).__name__}: {exc}"})
        raise SystemExit(1) from exc
    # NOTE: the model, tokenizer and library modules are permanent: frozen, the cyclic GC no
    # longer walks them, so a full collection inside the loop costs microseconds, not a stall.
    gc.collect()
    gc.freeze()
    pipe.send({"status": "ready", "info": scheduler.info(), "pid": os.getpid()})
    try:
        scheduler.event_loop()
    except Exception as exc:
        logger.exception("scheduler crashed")
        send(scheduler.tokenizer_sock, io.SchedulerDied(f"{type(exc).__name__}: {exc}"))
        time.sleep(0.2)
        raise SystemExit(1) from exc
