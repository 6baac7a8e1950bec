"""`Req`: one request's state inside the scheduler process.

Token bookkeeping: `fill_ids = origin_input_ids + output_ids`. Positions `[0, computed)` of
`fill_ids` have KV in the pool (listed in `req_to_token[req_pool_idx]`); of those, the first
`len(prefix_slots)` belong to the prefix cache (locked through `last_node`) and the rest to this
request. A decoding request always has exactly one token without KV: the last sampled one.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from radixlm.runtime.sampling.compat_params import STOP_REGEX_WINDOW, first_stop_regex_match
from radixlm.runtime.sampling.sampling_params import SamplingParams
from radixlm.runtime.sampling.stop_match import StopChecker, max_stop_bytes


class Req:
    def __init__(
        self,
        rid: str,
        input_ids: list[int],
        sampling_params: SamplingParams,
        *,
        eos_ids: tuple[int, ...],
        seed: int,
        return_logprob: bool = False,
        logprob_start_len: int = -1,
        top_logprobs_num: int = 0,
        stream: bool = False,
        arrival_time: float | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        self.rid = rid
        self.origin_input_ids = input_ids
        self.sampling_params = sampling_params
        self.output_ids: list[int] = []
        self.return_logprob = return_logprob
        self.top_logprobs_num = top_logprobs_num
        self.stream = stream
        self.arrival_time = arrival_time or time.time()
        self.wait_start = time.monotonic()
        sp = sampling_params
        self.eos_ids = () if sp.ignore_eos else eos_ids
        self.stop_token_ids = set(sp.stop_token_ids)
        self.stop_ids_for_min_tokens = tuple(eos_ids) + tuple(sp.stop_token_ids)
        self.max_stop_bytes = max_stop_bytes(sp.stop)
        self.generator = None
        if not sp.is_greedy:
            # NOTE: on the device the logits live on (a CPU generator cannot drive CUDA noise).
            self.generator = torch.Generator(device=device)
            self.generator.manual_seed(sp.seed if sp.seed is not None else seed)
        # Input logprobs cover positions [logprob_start_len, len(input)); -1 disables them.
        self.logprob_start_len = logprob_start_len if return_logprob else -1
        # NOTE: position 0 has no logprob (nothing precedes it): its entry is None.
        first = [None] if self.logprob_start_len == 0 else []
        self.input_logprobs: list[float | None] = list(first)
        self.input_top: list[Any] = list(first) if top_logprobs_num else []
        self.input_logprobs_done = self.logprob_start_len < 0
        self.output_logprobs: list[float] = []
        self.output_top: list[Any] = []
        # Memory (owned by the scheduler; see the module docstring).
        self.req_pool_idx: int | None = None
        self.prefix_slots = torch.empty(0, dtype=torch.int64)
        self.last_node: Any = None
        self.computed = 0
        self.extend_len = 0  # tokens computed in the current extend round
        self.cached_tokens = 0
        self.is_chunked = False  # its prompt is being prefilled over several rounds
        self.times_retracted = 0
        self.counted = False  # in the scheduler's prompt/cached token statistics
        # Output state.
        self.finished_reason: dict[str, Any] | None = None
        self.sent_ids = 0  # output ids already sent to the detokenizer
        self.sent_input_logprobs = 0
        self.first_sent = False
        self.grammar: Any = None  # constrained/base.py `Grammar`, set once it is compiled
        # Speculative decoding (speculative/spec_step.py; None while it never ran a decode step
        # with speculation on): decode steps taken and tokens they committed.
        self.spec_verify_ct: int | None = None
        self.spec_committed: int | None = None

    # ---- views ---------------------------------------------------------------------------------
    @property
    def fill_ids(self) -> list[int]:
        return self.origin_input_ids + self.output_ids

    @property
    def last_token(self) -> int:
        return self.output_ids[-1] if self.output_ids else self.origin_input_ids[-1]

    @property
    def seqlen(self) -> int:
        return len(self.origin_input_ids) + len(self.output_ids)

    def kv_token_ids(self) -> list[int]:
        return self.fill_ids[: self.computed]

    @property
    def finished(self) -> bool:
        return self.finished_reason is not None

    def max_prefix_len(self) -> int:
        """How much of `fill_ids` may come from the cache: at least one token must be computed
        (to get logits), and input logprobs need the hidden states from their start on."""
        limit = self.seqlen - 1
        if not self.input_logprobs_done:
            limit = min(limit, max(self.logprob_start_len - 1, 0))
        return max(limit, 0)

    def remaining_new_tokens(self) -> int:
        return max(self.sampling_params.max_new_tokens - len(self.output_ids), 0)

    # ---- stop conditions -------------------------------------------------------------------------
    def check_finished(self, stops: StopChecker | None, context_len: int) -> None:
        """Called after a token was appended to `output_ids` (`stops`: None without a tokenizer)."""
        if self.finished_reason is not None:
            return
        sp = self.sampling_params
        n = len(self.output_ids)
        last = self.output_ids[-1]
        if self.grammar is not None and self.grammar.is_terminated():
            # NOTE: a complete constrained output ends here even before min_new_tokens: the
            # grammar allows nothing but EOS any more.
            matched = last if last in self.eos_ids or last in self.stop_token_ids else None
            self.finished_reason = {"type": "stop", "matched": matched}
            return
        if n >= sp.min_new_tokens:
            if last in self.eos_ids or last in self.stop_token_ids:
                self.finished_reason = {"type": "stop", "matched": last}
                return
            if sp.stop and stops is not None:
                # NOTE: only a stop that ends in this token's text counts (stop_match.py), decoded
                # as the user sees it: the detokenizer trims by the same rule.
                stop = stops.match(
                    self.output_ids,
                    sp.stop,
                    self.max_stop_bytes,
                    sp.skip_special_tokens,
                    sp.spaces_between_special_tokens,
                )
                if stop is not None:
                    self.finished_reason = {"type": "stop", "matched": stop}
                    return
            if sp.stop_regex and stops is not None:
                tail = stops.tokenizer.decode(
                    self.output_ids[-STOP_REGEX_WINDOW:],
                    skip_special_tokens=sp.skip_special_tokens,
                )
                matched = first_stop_regex_match(sp.stop_regex, tail)
                if matched is not None:  # NOTE: the detokenizer trims at the matched text
                    self.finished_reason = {"type": "stop", "matched": matched}
                    return
        if n >= sp.max_new_tokens:
            self.finished_reason = {"type": "length", "length": sp.max_new_tokens}
        elif self.seqlen >= context_len:
            self.finished_reason = {"type": "length", "length": n}

    def abort(self, message: str) -> None:
        if self.finished_reason is None:
            self.finished_reason = {"type": "abort", "message": message}
