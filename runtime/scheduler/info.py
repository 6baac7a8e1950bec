"""What the scheduler reports about itself: static info, live load and counters, the control
requests (`get_info`, `flush_cache`, `check_invariants`) and the timing of its iterations.

Ownership: owns the scheduler's counters (`stats`, written by the components it is shared with);
reads everything else it reports (pool, cache, queues, grammars) without copying it. Runs on the
scheduler's thread: control requests are handled between iterations, with no step in flight.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from radixlm.runtime.distributed.leader import LeaderModelRunner
from radixlm.runtime.distributed.state import parallel_state
from radixlm.runtime.processes import io
from radixlm.runtime.scheduler.policy import NewTokenRatio
from radixlm.runtime.scheduler.queues import ReqQueues
from radixlm.runtime.scheduler.step import ModelStep


def new_stats() -> dict[str, Any]:
    return {
        "prompt_tokens": 0,
        "cached_tokens": 0,
        "generated_tokens": 0,
        "retracted": 0,
        "overlapped_steps": 0,
        # Speculative decoding (spec_step.py): decode steps with an algorithm set, the draft
        # tokens they verified (after the grammar/length checks) and the tokens they committed.
        "spec_verify_steps": 0,
        "spec_draft_tokens": 0,
        "spec_committed_tokens": 0,
        # verify forwards that replayed a CUDA graph (executor/verify_graphs.py)
        "spec_verify_graph_steps": 0,
        # Wall time of the loop iterations that ran a forward, by kind (an extend iteration
        # ends at its tokens' read-back; an overlapped decode iteration launches one step
        # and reads the previous one).
        "extend_iterations": 0,
        "extend_seconds": 0.0,
        "decode_iterations": 0,
        "decode_seconds": 0.0,
    }


class SchedulerInfo:
    def __init__(
        self,
        runner: Any,  # executor/model_runner.py `ModelRunner`
        step: ModelStep,
        queues: ReqQueues,
        grammars: Any,  # constrained/manager.py `GrammarManager`
        ratio: NewTokenRatio,
        stats: dict[str, Any],
        is_idle: Callable[[], bool],
        chunk_size: int | None,
        eos_ids: tuple[int, ...],
        resolved: dict[str, Any] | None = None,
        proposer: Any = None,  # speculative/proposer.py `Proposer` (None: speculation off)
    ) -> None:
        self.runner = runner
        self.proposer = proposer
        self.step = step
        self.queues = queues
        self.grammars = grammars
        self.ratio = ratio
        self.stats = stats
        self.is_idle = is_idle
        self.chunk_size = chunk_size
        self.eos_ids = eos_ids
        self.resolved = resolved or {}  # flags whose default was resolved here (e.g. speculative)
        self.cache = step.cache
        self.allocator = step.allocator

    def info(self) -> dict[str, Any]:
        cfg = self.runner.config
        return {
            "max_total_num_tokens": self.allocator.capacity,
            "max_running_requests": self.runner.max_running,
            "context_length": self.runner.context_len,
            "chunked_prefill_size": self.chunk_size or -1,
            "device": str(self.runner.device),
            "dtype": str(self.runner.dtype).replace("torch.", ""),
            "weight_mode": self.runner.weight_mode,  # e.g. float32, bfloat16, Q4_1 (CPU)
            "attention_backend": type(self.runner.attn).__name__,
            "vocab_size": cfg.vocab_size,
            "eos_token_ids": list(self.eos_ids),
            "architecture": cfg.architecture,
            "num_layers": cfg.num_hidden_layers,
            "hidden_size": cfg.hidden_size,
            "tp_size": parallel_state().tp_size,
            **self.resolved,
        }

    def load_info(self) -> dict[str, Any]:
        return {
            "num_waiting": len(self.queues.waiting) + len(self.grammars.pending),
            "num_running": len(self.queues.running) + (self.queues.chunked is not None),
            "free_slots": self.allocator.available(),
            "evictable_slots": self.cache.evictable_size(),
            "protected_slots": self.cache.protected_size(),
            "capacity": self.allocator.capacity,
            "new_token_ratio": self.ratio.value,
            "forward_ct": self.step.forward_ct,
            "decode_model_seconds": self.step.decode_model_s,
            **self.stats,
            "jump_forward": self.grammars.stats["jumps"],
            "jump_forward_tokens": self.grammars.stats["jump_tokens"],
            # grammar masks: seconds filling and checking them, rows filled (batch_mask.py)
            "grammar_mask_seconds": self.grammars.stats["mask_s"],
            "grammar_mask_rows": self.grammars.stats["mask_rows"],
        }

    def control(self, msg: io.ControlReq) -> io.ControlResp:
        if msg.kind == "get_info":
            return io.ControlResp(msg.token, True, {**self.info(), **self.load_info()})
        if msg.kind == "flush_cache":
            if not self.is_idle():
                return io.ControlResp(msg.token, False, error="cannot flush while requests run")
            self.cache.reset()
            self.allocator.clear()
            return io.ControlResp(msg.token, True)
        if msg.kind == "check_invariants":
            if not self.is_idle():
                return io.ControlResp(msg.token, False, error="requests are running")
            try:
                self.cache.check_idle_invariant()
                if self.runner.req_to_token.available() != self.runner.req_to_token.size:
                    raise AssertionError("req_to_token rows leaked")
                if self.proposer is not None:
                    self.proposer.check_idle()  # a draft model's KV (rank 0's alone at TP > 1)
                if isinstance(self.runner, LeaderModelRunner):
                    self.runner.check_followers()  # the lock-step invariant (lockstep.py)
            except AssertionError as exc:
                return io.ControlResp(msg.token, False, error=str(exc))
            return io.ControlResp(msg.token, True, self.load_info())
        return io.ControlResp(msg.token, False, error=f"unknown control request {msg.kind!r}")

    def count_time(self, kind: str, start: float) -> None:
        self.stats[f"{kind}_iterations"] += 1
        self.stats[f"{kind}_seconds"] += time.perf_counter() - start
