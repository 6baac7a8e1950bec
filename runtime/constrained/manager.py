"""`GrammarManager`: constrained decoding inside the scheduler process.

- Compiles grammars off the scheduler loop: `submit` hands a request's spec to a small thread
  pool (identical specs in flight share one compile) and parks the request in `pending`;
  `poll` (every loop iteration) returns the requests whose grammar is ready, and those whose
  compile failed or ran past `grammar_compile_timeout` with the error message. A cached grammar
  skips the pool entirely. Every request's grammar is wrapped here when its sampling params carry
  a reasoning marker (reasoning.py: free `<think>` section, constrained answer).
- Builds the batch's packed bitmask (`build_mask`: rows filled as they are read, batch_mask.py)
  and plans/applies jump-forward (`try_jump`).

Threading: every method runs on the scheduler loop thread; only the compiler's `compile` runs
on the pool's threads. A timed-out compile keeps running in its thread (threads cannot be
killed); its result still lands in the compiler's cache.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from radixlm.runtime.constrained.base import Grammar, GrammarCompiler, GrammarSpec
from radixlm.runtime.constrained.batch_mask import BatchMask
from radixlm.runtime.constrained.jump_forward import apply_jump, plan_jump
from radixlm.runtime.constrained.reasoning import wrap_for_reasoning
from radixlm.runtime.errors import GrammarError

logger = logging.getLogger(__name__)

COMPILE_WORKERS = 2


@dataclass
class _Job:
    """One compile on the pool; `started` is set by the worker when it begins (queued time does
    not count against the timeout)."""

    future: Future | None = None
    started: float | None = None


@dataclass
class _Pending:
    req: Any  # scheduler Req
    spec: GrammarSpec
    job: _Job


class GrammarManager:
    def __init__(
        self,
        compiler: GrammarCompiler | None,
        vocab_size: int,
        compile_timeout: float,
        jump_forward: bool,
        tokenizer: Any = None,
        device: torch.device | None = None,
    ) -> None:
        self.compiler = compiler  # None: no tokenizer, constraints are rejected
        self.vocab_size = vocab_size
        self.words = (vocab_size + 31) // 32
        self.compile_timeout = compile_timeout
        self.jump_forward_enabled = jump_forward and compiler is not None
        self.tokenizer = tokenizer
        self.device = device or torch.device("cpu")
        self.pending: list[_Pending] = []
        self._inflight: dict[GrammarSpec, _Job] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._mask_buf = torch.empty(0, self.words, dtype=torch.int32)
        self.stats = {"jumps": 0, "jump_tokens": 0, "mask_s": 0.0, "mask_rows": 0}

    # ---- compile --------------------------------------------------------------------------------
    def submit(self, req: Any, spec: GrammarSpec) -> Grammar | None:
        """Start compiling `req`'s grammar. Returns the grammar at once on a cache hit (the
        caller queues the request); otherwise parks the request in `pending` and returns None."""
        if self.compiler is None:
            raise GrammarError(
                "constrained decoding needs a tokenizer (skip_tokenizer_init)", spec.kind
            )
        cached = getattr(self.compiler, "cached", None)
        grammar = cached(spec) if cached is not None else None
        if grammar is not None:
            return wrap_for_reasoning(grammar, req.sampling_params, self._vocab())
        job = self._inflight.get(spec)
        if job is None:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    COMPILE_WORKERS, thread_name_prefix="radixlm-grammar"
                )
            job = _Job()
            job.future = self._pool.submit(self._compile, self.compiler, spec, job)
            self._inflight[spec] = job
        self.pending.append(_Pending(req, spec, job))
        return None

    @staticmethod
    def _compile(compiler: GrammarCompiler, spec: GrammarSpec, job: _Job) -> Grammar:
        job.started = time.monotonic()  # NOTE: a float store: atomic, read by the loop thread
        return compiler.compile(spec)

    def _vocab(self) -> Any:
        """The compiler's `TokenVocab` (reasoning markers are matched on its bytes), if any."""
        return getattr(self.compiler, "vocab", None)

    def poll(self) -> tuple[list[Any], list[tuple[Any, str]]]:
        """(requests whose `grammar` is now set, [(request, error message)]) since the last poll."""
        if not self.pending:
            return [], []
        ready: list[Any] = []
        failed: list[tuple[Any, str]] = []
        now = time.monotonic()
        still: list[_Pending] = []
        for p in self.pending:
            future, started = p.job.future, p.job.started
            assert future is not None
            if future.done():
                exc = future.exception()
                if exc is None:
                    template: Grammar = future.result()
                    # NOTE: the future's grammar is shared by every request of this compile;
                    # each request gets its own copy (the template is never advanced).
                    # A reasoning request's grammar starts after its `</think>` (reasoning.py).
                    p.req.grammar = wrap_for_reasoning(
                        template.copy(), p.req.sampling_params, self._vocab()
                    )
                    ready.append(p.req)
                else:
                    failed.append((p.req, _message(p.spec, exc)))
            elif started is not None and now - started >= self.compile_timeout:
                failed.append(
                    (
                        p.req,
                        f"compiling the grammar ({p.spec.describe()}) took longer than "
                        f"grammar_compile_timeout={self.compile_timeout} s",
                    )
                )
            else:
                still.append(p)
        self.pending = still
        for spec in [s for s, j in self._inflight.items() if j.future and j.future.done()]:
            del self._inflight[spec]
        return ready, failed

    def abort(self, rid: str) -> list[Any]:
        """Remove pending requests with this id ("" = all); returns them."""
        gone = [p.req for p in self.pending if rid in ("", p.req.rid)]
        self.pending = [p for p in self.pending if rid not in ("", p.req.rid)]
        return gone

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    # ---- masks ----------------------------------------------------------------------------------
    def build_mask(self, reqs: list[Any]) -> BatchMask | None:
        """The batch's grammar mask (rows filled when the sampler reads them: batch_mask.py), or
        None when no request is constrained."""
        if all(r.grammar is None for r in reqs):
            return None
        bs = len(reqs)
        if self._mask_buf.shape[0] < bs:
            pin = self.device.type == "cuda"
            self._mask_buf = torch.empty(max(bs, 2 * self._mask_buf.shape[0]), self.words,
                                         dtype=torch.int32, pin_memory=pin)  # fmt: skip
        # NOTE: the buffer is reused every step; the previous step's host-to-device copy has
        # completed because sampling synchronised on its result.
        return BatchMask([r.grammar for r in reqs], self._mask_buf[:bs], self.device, self.stats)

    # ---- jump-forward ---------------------------------------------------------------------------
    def try_jump(self, req: Any) -> list[int] | None:
        """If `req`'s grammar forces a string worth jumping over: move the grammar and return
        the request's new output ids (the caller swaps them in and re-queues the request)."""
        if not self.jump_forward_enabled or req.grammar is None or req.finished:
            return None
        sp = req.sampling_params
        # NOTE: jumped tokens have no logprobs, and stop strings/ids are checked per sampled token.
        if req.return_logprob or sp.stop or sp.stop_regex or sp.stop_token_ids:
            return None
        compiler = self.compiler
        vocab = getattr(compiler, "vocab", None)
        if vocab is None:
            return None
        out = req.output_ids
        plan = plan_jump(
            req.grammar, out, vocab, self.tokenizer, req.sent_ids, sp.max_new_tokens - 1
        )
        if plan is None or not apply_jump(req.grammar, out, plan):
            return None
        self.stats["jumps"] += 1
        self.stats["jump_tokens"] += plan.added(len(out))
        return out[: plan.keep] + plan.tail


def _message(spec: GrammarSpec, exc: BaseException) -> str:
    if isinstance(exc, GrammarError):
        return str(exc)
    logger.exception("grammar compile failed", exc_info=exc)
    return f"cannot compile {spec.describe()}: {type(exc).__name__}: {exc}"
