"""The one step path: `ScheduleBatch` -> `ForwardBatch` -> forward -> logits rows -> sampling batch
-> grammar mask -> sample -> `StepOutput`.

Both loops run every forward through `ModelStep.run`: the plain loop applies its `StepOutput` at
once (results.py); the overlapped loop (overlap.py) keeps it in flight, its tokens still on the
device, and launches the next step from `StepOutput.next_ids` before applying it.

Ownership: `ModelStep` owns no request state. It allocates the batch's new KV slots and writes
their `req_to_token` rows (schedule_batch.py), advances each request's `computed` by the tokens
it ran, and otherwise only reads requests. It touches model tensors only through the
`ModelRunner` (forward, logits, decode input buffers).
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple, Protocol

import torch

from radixlm.runtime.executor.forward_batch import ForwardBatch, ForwardMode
from radixlm.runtime.executor.host_transfer import HostTransfer
from radixlm.runtime.mem.kv_pool import SlotAllocator
from radixlm.runtime.mem.prefix_cache import PrefixCache
from radixlm.runtime.sampling.sampler import sample
from radixlm.runtime.sampling.sampling_batch import SamplingBatch
from radixlm.runtime.scheduler.req import Req
from radixlm.runtime.scheduler.schedule_batch import (
    ScheduleBatch,
    input_logprobs,
    prepare_decode,
    prepare_extend,
)

InputLogprobs = list[tuple[list[float], list | None]]  # per `ScheduleBatch.lp_rows` entry


class StepTokens(NamedTuple):
    """A step's sampled tokens on the host, row k for `StepOutput.sampled[k]`."""

    tokens: list[int]
    logprobs: list[float] | None
    top: list[list[tuple[float, int]]] | None


class StepOutput(NamedTuple):
    """What one forward produced. Tensors stay where they were computed until `resolve()`."""

    batch: ScheduleBatch
    sampled: list[Req]  # requests that sampled a token, in row order (extend: last chunks only)
    next_ids: torch.Tensor | None  # [len(sampled)] int64 on the device (None: nothing sampled)
    logprobs: torch.Tensor | None  # [len(sampled)] logprob of each token (with return_logprob)
    top_logprobs: tuple[torch.Tensor, torch.Tensor] | None  # ([B, k] values, [B, k] ids)
    input_logprobs: InputLogprobs  # already on the host (an extend with input logprobs)
    masked: bool  # a grammar mask was applied (some sampled request is constrained)
    # Overlap: a copy of `next_ids` queued to the host on its own stream, valid once `copied`
    # has fired (None: read `next_ids` directly).
    host_ids: torch.Tensor | None = None
    copied: torch.cuda.Event | None = None
    # The forward's output rows (`ModelRunner.forward`: every row of a decode step, the logits
    # rows of an extend), kept with `keep_hidden` (speculative proposers that need them).
    hidden: torch.Tensor | None = None

    def resolve(self) -> StepTokens:
        """The tokens (and logprobs) on the host: the step's one host synchronisation."""
        if self.next_ids is None:
            return StepTokens([], None, None)
        if self.copied is not None:
            self.copied.synchronize()
        ids = self.host_ids if self.host_ids is not None else self.next_ids
        logprobs = self.logprobs.tolist() if self.logprobs is not None else None
        top = None
        if self.top_logprobs is not None:
            values, indices = (t.tolist() for t in self.top_logprobs)
            top = [list(zip(v, i)) for v, i in zip(values, indices)]
        return StepTokens(ids.tolist(), logprobs, top)


class StepRunner(Protocol):
    """What the step path uses of the `ModelRunner` (executor/model_runner.py)."""

    device: torch.device

    def forward(self, batch: ForwardBatch) -> torch.Tensor: ...

    def compute_logits(
        self, hidden: torch.Tensor, rows: slice | torch.Tensor | None = None
    ) -> torch.Tensor: ...

    def decode_input_buffer(self, bs: int) -> torch.Tensor: ...


class ModelStep:
    def __init__(
        self,
        runner: StepRunner,
        grammars: Any,  # constrained/manager.py `GrammarManager`
        allocator: SlotAllocator,
        cache: PrefixCache,
        transfer: HostTransfer,
        vocab_size: int,
    ) -> None:
        self.runner = runner
        self.grammars = grammars
        self.allocator = allocator
        self.cache = cache
        self.transfer = transfer
        self.vocab_size = vocab_size
        self.device: torch.device = runner.device
        self.forward_ct = 0
        # NOTE: host seconds inside the model's forward and logits calls of decode steps: the
        # model's own time where the forward is synchronous (CPU); launch time on a GPU. The rest
        # of a decode iteration is the scheduler's (batching, sampling, grammars, results).
        self.decode_model_s = 0.0

    def forward_batch(
        self, batch: ScheduleBatch, input_ids: torch.Tensor | None = None
    ) -> ForwardBatch:
        """Allocate the batch's KV slots and build its tensors; raises OutOfSlotsError (nothing
        allocated) when the pool cannot hold them."""
        if batch.mode == ForwardMode.EXTEND:
            return prepare_extend(batch, self.allocator, self.cache, self.device)
        inputs = self.runner.decode_input_buffer(len(batch.reqs))
        return prepare_decode(batch, self.allocator, self.cache, self.transfer, inputs, input_ids)

    def run(
        self,
        batch: ScheduleBatch,
        input_ids: torch.Tensor | None = None,
        greedy: bool = False,
        to_host: bool = False,
        keep_hidden: bool = False,
    ) -> StepOutput:
        """One forward and its sampling. `input_ids`: a decode step's input ids on the device
        (the in-flight step's tokens); `greedy`: the caller knows every request decodes greedily
        with no logit processor, grammar or logprobs (no sampling state is built); `to_host`:
        queue the tokens' copy to the host now, so that reading them later waits for this step
        only (overlap.py); `keep_hidden`: return the forward's output rows too."""
        fb = self.forward_batch(batch, input_ids)
        start = time.perf_counter()
        hidden = self.runner.forward(fb)
        model_s = time.perf_counter() - start
        self.forward_ct += 1
        for req in batch.reqs:
            req.computed += req.extend_len
        decode = batch.mode == ForwardMode.DECODE
        lp = (
            []
            if decode or not batch.lp_rows
            else input_logprobs(batch, lambda a, b: self.runner.compute_logits(hidden, slice(a, b)))
        )
        sampled = batch.reqs if decode else batch.sampling_reqs
        kept = hidden if keep_hidden else None
        if not sampled:
            return StepOutput(batch, sampled, None, None, None, lp, False, hidden=kept)
        rows = None  # NOTE: decode samples every row, in order: no gather
        if not decode:
            picked = [r for r in batch.sample_rows if r >= 0]
            if picked != list(range(hidden.shape[0])):
                rows = torch.tensor(picked, device=hidden.device)
        start = time.perf_counter()
        logits = self.runner.compute_logits(hidden, rows)
        if decode:
            self.decode_model_s += model_s + time.perf_counter() - start
        if greedy:
            out = sample(logits, SamplingBatch.greedy_only(len(sampled)))
            masked = False
        else:
            sb = SamplingBatch.from_reqs(sampled, self.vocab_size, self.device)
            mask = self.grammars.build_mask(sampled)
            sb.set_vocab_mask(mask)
            masked = mask is not None
            want_lp = any(r.return_logprob for r in sampled)
            top_n = max((r.top_logprobs_num for r in sampled), default=0)
            out = sample(logits, sb, want_lp, top_n)
        host_ids = copied = None
        if to_host:
            # NOTE: the copy to the host is queued right behind this step (on its own stream):
            # reading the tokens must not wait for a step launched after it (.tolist() would).
            host_ids, copied = self.transfer.to_host(out.next_token_ids)
        return StepOutput(
            batch, sampled, out.next_token_ids, out.logprobs, out.top_logprobs, lp, masked,
            host_ids, copied, kept,
        )  # fmt: skip
