"""`TokenizerManager`: the front of the runtime, in the user's process (Engine) or the server.

It validates and tokenizes each request once (`prepare`: a `GenerateInput` becomes a
`PreparedReq`, whose typed `io.GenerateReq` is what crosses to the scheduler), sends it
(`submit`), and turns the detokenizer's text deltas back into results and stream chunks.

Threading: every method runs on one asyncio event loop (the Engine's background loop thread, or
the server's uvicorn loop); nothing here is thread-safe. Ownership: a `ReqState` exists from
`send` until the request finishes; the receive loop is the only writer of its fields.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import zmq
import zmq.asyncio

from radixlm.runtime.errors import (
    EngineDeadError,
    InvalidRequestError,
    QueueFullError,
    QueueTimeoutError,
    RequestAbortedError,
    RequestTimeoutError,
)
from radixlm.runtime.frontend.prepare import (
    GenerateInput,
    PreparedReq,
    RequestLimits,
    prepare_request,
)
from radixlm.runtime.processes import io
from radixlm.runtime.processes.ipc import PortArgs, TypedReceiver, send
from radixlm.runtime.server_args import ServerArgs

logger = logging.getLogger(__name__)
EARLY_ABORT_TTL_S = 60.0  # how long an abort waits for its request to arrive
EARLY_ABORT_MAX = 1024


@dataclass
class ReqState:
    rid: str
    prompt_ids: list[int]
    return_text_in_logprobs: bool
    text: str = ""
    output_ids: list[int] = field(default_factory=list)
    finished: bool = False
    out: io.ReqOut | None = None
    event: asyncio.Event = field(default_factory=asyncio.Event)
    created: float = field(default_factory=time.perf_counter)
    first_token_time: float | None = None
    last_token_time: float | None = None
    output_logprobs: list[float] = field(default_factory=list)
    output_top: list[Any] = field(default_factory=list)
    input_logprobs: list[Any] | None = None
    input_logprob_ids: list[int] | None = None
    input_top: list[Any] | None = None
    error: BaseException | None = None
    stream: bool = False
    # Seconds per token between successive outputs (streaming requests; for metrics).
    itl: list[float] = field(default_factory=list)
    # How the request ended, set before `listeners` run: finished | aborted | error | timeout |
    # queue_timeout | cancelled (the caller went away).
    outcome: str = "running"
    # The last result's `meta_info` (set by `_result`; the listeners read the final one).
    meta_info: dict[str, Any] | None = None


class TokenizerManager:
    def __init__(
        self,
        args: ServerArgs,
        ports: PortArgs,
        tokenizer: Any,
        scheduler_info: dict[str, Any],
        is_alive: Callable[[], str] | None = None,
    ) -> None:
        self.args = args
        self.tokenizer = tokenizer
        self.info = scheduler_info
        self.context_len = int(scheduler_info["context_length"])
        self.max_total_tokens = int(scheduler_info["max_total_num_tokens"])
        self.vocab_size = int(scheduler_info["vocab_size"])
        self.limits = RequestLimits.of(args, self.vocab_size, self.context_len,
                                       self.max_total_tokens)  # fmt: skip
        self.ctx = zmq.asyncio.Context(1)
        self.recv_sock = self.ctx.socket(zmq.PULL)
        self.recv_sock.setsockopt(zmq.LINGER, 0)
        self.recv_sock.bind(ports.tokenizer_ipc)
        self.send_sock = self.ctx.socket(zmq.PUSH)
        self.send_sock.setsockopt(zmq.LINGER, 0)
        self.send_sock.connect(ports.scheduler_ipc)
        self.decoder = TypedReceiver(self.recv_sock, io.ToTokenizer)
        self.states: dict[str, ReqState] = {}
        self.control_futures: dict[int, asyncio.Future] = {}
        # NOTE: an abort can overtake its request (the caller's thread posts it while the request
        # is still being tokenized): it is kept briefly, by rid, and applied on registration.
        self.early_aborts: dict[str, float] = {}
        self.control_tokens = itertools.count()
        self.dead: str | None = None
        self.is_alive = is_alive
        # Metrics/logging hooks, called once per request when it ends, whatever the outcome.
        self.listeners: list[Callable[[ReqState], None]] = []
        self._tasks: list[asyncio.Task] = []

    def start(self) -> None:
        """Start the receive and watchdog tasks on the running loop."""
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._recv_loop()), loop.create_task(self._watchdog())]

    async def close(self) -> None:
        self.dead = self.dead or "the engine is shut down"
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for state in self.states.values():
            state.error = RequestAbortedError("the engine is shut down")
            state.event.set()
        self.recv_sock.close()
        self.send_sock.close()
        self.ctx.term()

    # ---- requests ------------------------------------------------------------------------------
    def prepare(self, req: GenerateInput) -> PreparedReq:
        """Validate and tokenize `req`, once (frontend/prepare.py); raises a typed
        `InvalidRequestError` naming the problem."""
        if self.dead:
            raise EngineDeadError(self.dead)
        return prepare_request(req, self.limits, self.tokenizer)

    def check_queue(self, incoming: int = 1) -> None:
        """Raise QueueFullError unless `incoming` more requests fit under max_queued_requests."""
        limit = self.args.max_queued_requests
        if limit is not None and len(self.states) + incoming > limit:
            raise QueueFullError(f"too many requests in flight (max_queued_requests={limit})")

    def generate(self, req: GenerateInput) -> AsyncIterator[dict[str, Any]]:
        """`submit(prepare(req))`: validation errors are raised here, before anything runs."""
        return self.submit(self.prepare(req))

    async def submit(self, req: PreparedReq) -> AsyncIterator[dict[str, Any]]:
        """Run one prepared request; yields stream chunks (cumulative text), the last one final.
        Without `stream`, yields the final result only."""
        self.check_queue()
        rid = req.msg.rid
        if rid in self.states:
            raise InvalidRequestError(f"duplicate request id {rid!r}", "rid")
        stream = req.msg.stream
        state = ReqState(rid, req.msg.input_ids, req.return_text_in_logprobs, stream=stream)
        self.states[rid] = state
        msg = msgspec.structs.replace(req.msg, arrival_time=time.time())
        timeout = self.args.request_timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        send(self.send_sock, msg)  # type: ignore[arg-type]
        aborted_at = self.early_aborts.pop(rid, None)
        if aborted_at is not None and time.monotonic() - aborted_at <= EARLY_ABORT_TTL_S:
            self.abort(rid)  # sent after the request: the scheduler ends it as aborted
        try:
            while True:
                wait = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    await asyncio.wait_for(state.event.wait(), wait)
                except asyncio.TimeoutError:
                    self.abort(rid)
                    state.outcome = "timeout"
                    raise RequestTimeoutError(
                        f"request {rid} timed out after {timeout} s (request_timeout)"
                    ) from None
                state.event.clear()
                if state.error is not None:
                    raise state.error
                if state.finished:
                    yield self._result(state)
                    return
                if stream:
                    yield self._result(state)
        finally:
            if not state.finished:
                self.abort(rid)  # the caller went away (disconnect, cancel, Ctrl-C)
            self.states.pop(rid, None)
            self._notify_end(state)

    def _notify_end(self, state: ReqState) -> None:
        if state.outcome == "running":
            if state.error is not None:
                state.outcome = "error"
            elif not state.finished:
                state.outcome = "cancelled"
            else:
                reason = (state.out.finish_reason if state.out else None) or {}
                state.outcome = "aborted" if reason.get("type") == "abort" else "finished"
        for listener in self.listeners:
            try:
                listener(state)
            except Exception:
                logger.exception("request listener failed")

    def abort(self, rid: str) -> None:
        if self.dead:
            return
        if rid and rid not in self.states:
            now = time.monotonic()
            for old in [r for r, t in self.early_aborts.items() if now - t > EARLY_ABORT_TTL_S]:
                del self.early_aborts[old]
            if len(self.early_aborts) >= EARLY_ABORT_MAX:
                del self.early_aborts[next(iter(self.early_aborts))]  # the oldest
            self.early_aborts[rid] = now
        send(self.send_sock, io.AbortReq(rid))  # type: ignore[arg-type]

    async def control(self, kind: str, timeout: float = 30.0) -> io.ControlResp:
        if self.dead:
            raise EngineDeadError(self.dead)
        token = next(self.control_tokens)
        fut = asyncio.get_running_loop().create_future()
        self.control_futures[token] = fut
        send(self.send_sock, io.ControlReq(kind, token))  # type: ignore[arg-type]
        try:
            return await asyncio.wait_for(fut, timeout)
        finally:
            self.control_futures.pop(token, None)

    # ---- results -------------------------------------------------------------------------------
    def _result(self, state: ReqState) -> dict[str, Any]:
        out = state.out
        assert out is not None
        meta: dict[str, Any] = {
            "id": state.rid,
            "finish_reason": _public_reason(out.finish_reason) if state.finished else None,
            "prompt_tokens": out.prompt_tokens,
            "completion_tokens": len(state.output_ids),
            "cached_tokens": out.cached_tokens,
            "e2e_latency": time.perf_counter() - state.created,
        }
        if out.spec_verify_ct:  # speculative decoding (docs/speculative.md)
            meta["spec_verify_ct"] = out.spec_verify_ct
            meta["spec_accept_length"] = (out.spec_committed or 0) / out.spec_verify_ct
        if state.input_logprobs is not None or state.output_logprobs:
            meta.update(self._logprob_meta(state))
        state.meta_info = meta
        return {"text": state.text, "output_ids": list(state.output_ids), "meta_info": meta}

    def _logprob_meta(self, state: ReqState) -> dict[str, Any]:
        with_text = state.return_text_in_logprobs and self.tokenizer is not None

        def text(tid: int) -> str | None:
            return self.tokenizer.decode([tid]) if with_text else None

        def triples(values: list, ids: list[int]) -> list[tuple]:
            return [(v, t, text(t)) for v, t in zip(values, ids)]

        def tops(rows: list | None) -> list:
            return [
                None if row is None else [(v, t, text(t)) for v, t in row] for row in rows or []
            ]

        return {
            "input_token_logprobs": triples(
                state.input_logprobs or [], state.input_logprob_ids or []
            ),
            "output_token_logprobs": triples(state.output_logprobs, state.output_ids),
            "input_top_logprobs": tops(state.input_top),
            "output_top_logprobs": tops(state.output_top),
        }

    async def _recv_loop(self) -> None:
        while True:
            frame = await self.recv_sock.recv()
            try:
                msg = self.decoder.decode(frame)
            except ValueError:
                logger.exception("dropping a malformed message")
                continue
            if isinstance(msg, io.BatchTextOut):
                for out in msg.outs:
                    self._on_output(out)
            elif isinstance(msg, io.ControlResp):
                fut = self.control_futures.get(msg.token)
                if fut is not None and not fut.done():
                    fut.set_result(msg)
            elif isinstance(msg, io.SchedulerDied):
                self._mark_dead(f"the scheduler crashed: {msg.error}")

    def _on_output(self, t: io.TextOut) -> None:
        state = self.states.get(t.rid)
        if state is None:
            return  # aborted and forgotten
        out = t.out
        now = time.perf_counter()
        if t.new_ids:
            if state.last_token_time is not None:
                state.itl.append((now - state.last_token_time) / len(t.new_ids))
            state.first_token_time = state.first_token_time or now
            state.last_token_time = now
        state.text += t.text_delta
        state.output_ids.extend(t.new_ids)
        if out.output_logprobs is not None:
            state.output_logprobs.extend(out.output_logprobs)
        if out.output_top is not None:
            state.output_top.extend(out.output_top)
        if out.input_logprobs is not None:
            state.input_logprobs = out.input_logprobs
            state.input_logprob_ids = out.input_ids
            state.input_top = out.input_top
        state.out = out
        if out.finished:
            state.finished = True
            reason = out.finish_reason or {}
            status = reason.get("status_code") if reason.get("type") == "abort" else None
            if status == 400:
                state.error = InvalidRequestError(reason.get("message", "invalid request"))
            elif status == 429:  # the scheduler dropped it unstarted (queue_timeout)
                state.error = QueueTimeoutError(reason.get("message", "queue timeout"))
                state.outcome = "queue_timeout"
        state.event.set()

    async def _watchdog(self) -> None:
        while self.dead is None:
            await asyncio.sleep(0.5)
            reason = self.is_alive() if self.is_alive else ""
            if reason:
                self._mark_dead(reason)

    def _mark_dead(self, reason: str) -> None:
        if self.dead:
            return
        self.dead = reason
        logger.error("engine is dead: %s", reason)
        for state in self.states.values():
            state.error = EngineDeadError(reason)
            state.event.set()
        for fut in self.control_futures.values():
            if not fut.done():
                fut.set_exception(EngineDeadError(reason))


def _public_reason(reason: dict[str, Any] | None) -> dict[str, Any] | None:
    if reason is None:
        return None
    return {k: v for k, v in reason.items() if k != "status_code"}
