"""What the scheduler reports about itself: static info, live load and counters, the control
requests (`get_info`, `flush_cache`, `check_invariants`) and the timing of its iterations.

A mixin of `Scheduler`; it runs on the scheduler's thread (control requests are handled between
iterations, with no decode step in flight) and reads the scheduler's state without copying it.
"""

from __future__ import annotations

import time
from typing import Any

from radixlm.runtime.processes import io


class SchedulerInfo:
    def info(self) -> dict[str, Any]:
        cfg = self.config
        return {
            "max_total_num_tokens": self.allocator.capacity,
            "max_running_requests": self.max_running,
            "context_length": self.context_len,
            "chunked_prefill_size": self.chunk_size or -1,
            "device": str(self.device),
            "dtype": str(self.runner.dtype).replace("torch.", ""),
            "weight_mode": self.runner.weight_mode,  # e.g. float32, bfloat16, Q4_1 (CPU)
            "attention_backend": type(self.runner.attn).__name__,
            "vocab_size": cfg.vocab_size,
            "eos_token_ids": list(self.eos_ids),
            "architecture": cfg.architecture,
            "num_layers": cfg.num_hidden_layers,
            "hidden_size": cfg.hidden_size,
        }

    def load_info(self) -> dict[str, Any]:
        return {
            "num_waiting": len(self.waiting) + len(self.grammars.pending),
            "num_running": len(self.running) + (self.chunked_req is not None),
            "free_slots": self.allocator.available(),
            "evictable_slots": self.cache.evictable_size(),
            "protected_slots": self.cache.protected_size(),
            "capacity": self.allocator.capacity,
            "new_token_ratio": self.new_token_ratio,
            "forward_ct": self.forward_ct,
            **self.stats,
            "jump_forward": self.grammars.stats["jumps"],
            "jump_forward_tokens": self.grammars.stats["jump_tokens"],
        }

    def control(self, msg: io.ControlReq) -> io.ControlResp:
        if msg.kind == "get_info":
            return io.ControlResp(msg.token, True, {**self.info(), **self.load_info()})
        if msg.kind == "flush_cache":
            if not self.idle:
                return io.ControlResp(msg.token, False, error="cannot flush while requests run")
            self.cache.reset()
            self.allocator.clear()
            return io.ControlResp(msg.token, True)
        if msg.kind == "check_invariants":
            if not self.idle:
                return io.ControlResp(msg.token, False, error="requests are running")
            try:
                self.cache.check_idle_invariant()
                if self.runner.req_to_token.available() != self.runner.req_to_token.size:
                    raise AssertionError("req_to_token rows leaked")
            except AssertionError as exc:
                return io.ControlResp(msg.token, False, error=str(exc))
            return io.ControlResp(msg.token, True, self.load_info())
        return io.ControlResp(msg.token, False, error=f"unknown control request {msg.kind!r}")

    def count_time(self, kind: str, start: float) -> None:
        self.stats[f"{kind}_iterations"] += 1
        self.stats[f"{kind}_seconds"] += time.perf_counter() - start
