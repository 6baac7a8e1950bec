"""`ScheduleBatch`: the requests of one forward, and the conversion to tensors.

Data flow of one iteration:
    Scheduler picks requests (policy.py) -> `prepare_extend` / `prepare_decode` (called by the
      step path, step.py) allocate KV slots, write req_to_token rows and build a ForwardBatch,
      plus the bookkeeping of which logits rows sample a token and which give input logprobs
    -> ModelRunner.forward() -> logits -> sampler -> `StepOutput` -> the result path
      (results.py) appends tokens, records logprobs, checks stop conditions.
The batch never frees memory itself: the result path hands finished requests' KV to the prefix
cache (queues.py `release`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from radixlm.kernels._triton import HAS_TRITON
from radixlm.kernels.decode_inputs import decode_inputs, decode_inputs_ref
from radixlm.runtime.executor.forward_batch import ForwardBatch, ForwardMode
from radixlm.runtime.executor.host_transfer import HostTransfer
from radixlm.runtime.mem.kv_pool import SlotAllocator
from radixlm.runtime.mem.prefix_cache import PrefixCache
from radixlm.runtime.scheduler.req import Req

_LOGPROB_CHUNK = 512  # logits rows materialised at once for input logprobs


class OutOfSlotsError(RuntimeError):
    """The KV pool cannot hold this batch even after eviction (the caller retracts)."""


@dataclass
class ScheduleBatch:
    reqs: list[Req]
    mode: ForwardMode
    # EXTEND bookkeeping: per request, the logits rows of its input-logprob positions and the
    # row that samples its next token (-1 when a chunk is not the prompt's last).
    # (req index, first logits row, row count, position of the first row)
    lp_rows: list[tuple[int, int, int, int]] = field(default_factory=list)
    sample_rows: list[int] = field(default_factory=list)

    @property
    def sampling_reqs(self) -> list[Req]:
        return [r for r, row in zip(self.reqs, self.sample_rows) if row >= 0]


def alloc_slots(n: int, allocator: SlotAllocator, cache: PrefixCache) -> torch.Tensor:
    slots = allocator.alloc(n)
    if slots is None:
        cache.evict(n - allocator.available())
        slots = allocator.alloc(n)
    if slots is None:
        raise OutOfSlotsError(f"need {n} KV slots, {allocator.available()} free")
    return slots


def prepare_extend(
    batch: ScheduleBatch, allocator: SlotAllocator, cache: PrefixCache, device: torch.device
) -> ForwardBatch:
    """Requests already hold a row, their prefix and `extend_len`; allocates the new tokens."""
    reqs = batch.reqs
    table = cache.req_to_token
    ids: list[int] = []
    prefix_lens: list[int] = []
    extend_lens: list[int] = []
    logits_rows: list[int] = []
    total = sum(r.extend_len for r in reqs)
    slots = alloc_slots(total, allocator, cache)
    offset = 0
    batch.lp_rows, batch.sample_rows = [], []
    for i, r in enumerate(reqs):
        start, n = r.computed, r.extend_len
        table.write(r.req_pool_idx, start, slots[offset : offset + n])
        ids.extend(r.fill_ids[start : start + n])
        prefix_lens.append(start)
        extend_lens.append(n)
        if not r.input_logprobs_done:
            # Row at position p gives the logprob of input token p + 1.
            first = max(start, r.logprob_start_len - 1, 0)
            last = min(start + n, len(r.origin_input_ids) - 1)
            if last > first:
                batch.lp_rows.append((i, len(logits_rows), last - first, first))
                logits_rows.extend(range(offset + first - start, offset + last - start))
        if start + n == r.seqlen:  # the whole prompt is in: sample the next token
            batch.sample_rows.append(len(logits_rows))
            logits_rows.append(offset + n - 1)
        else:
            batch.sample_rows.append(-1)
        offset += n
    rows = torch.tensor([r.req_pool_idx for r in reqs], dtype=torch.int64, device=device)
    input_ids = torch.tensor(ids, dtype=torch.int64, device=device)
    return ForwardBatch.extend(input_ids, slots, rows, prefix_lens, extend_lens, logits_rows)


def prepare_decode(
    batch: ScheduleBatch,
    allocator: SlotAllocator,
    cache: PrefixCache,
    transfer: HostTransfer,
    inputs: torch.Tensor,
    input_ids: torch.Tensor | None = None,
) -> ForwardBatch:
    """One new token per request at position `computed`; its id is the request's last token,
    or row i of `input_ids` (device tensor: tokens not read back yet, see overlap.py).

    The step's tensors are assembled on the device into `inputs` (`[5, >= B]` int64, rows as
    `kernels.decode_inputs.DECODE_INPUT_ROWS`; the runner's `decode_input_buffer`) by one kernel,
    which also writes the new slots into `req_to_token`."""
    reqs = batch.reqs
    slots = alloc_slots(len(reqs), allocator, cache)
    positions = [r.computed for r in reqs]
    cols = [[r.req_pool_idx for r in reqs], positions]
    if input_ids is None:
        cols.append([r.last_token for r in reqs])
    # NOTE: one host-to-device copy for the per-request columns (decode is latency-bound).
    assemble = decode_inputs if HAS_TRITON and slots.is_cuda else decode_inputs_ref
    assemble(transfer.to_device(cols), input_ids, slots, cache.req_to_token.table, inputs)
    for r in reqs:
        r.extend_len = 1
    batch.sample_rows = list(range(len(reqs)))
    ids, pos, loc, rows, seq_lens = inputs[:, : len(reqs)]
    return ForwardBatch(
        mode=ForwardMode.DECODE,
        batch_size=len(reqs),
        input_ids=ids,
        positions=pos,
        out_cache_loc=loc,
        req_pool_indices=rows,
        seq_lens=seq_lens,
        seq_lens_cpu=[p + 1 for p in positions],
        logits_indices=None,
    )


def input_logprobs(
    batch: ScheduleBatch, logits_of: Callable[[int, int], torch.Tensor]
) -> list[tuple[list[float], list | None]]:
    """Per `lp_rows` entry: the logprobs of the next input tokens and, if asked, the top-k.
    `logits_of(a, b)`: the logits of the forward's hidden rows [a, b). Logits are materialised
    `_LOGPROB_CHUNK` rows at a time (a long prompt's full logits would not fit in memory)."""
    out = []
    for i, first_row, count, first_pos in batch.lp_rows:
        r = batch.reqs[i]
        targets = r.origin_input_ids[first_pos + 1 : first_pos + 1 + count]
        values: list[float] = []
        tops: list = []
        for c in range(0, count, _LOGPROB_CHUNK):
            end = min(c + _LOGPROB_CHUNK, count)
            logp = torch.log_softmax(logits_of(first_row + c, first_row + end), dim=-1)
            tgt = torch.tensor(targets[c:end], dtype=torch.int64, device=logp.device)
            values.extend(logp.gather(1, tgt.view(-1, 1)).view(-1).tolist())
            if r.top_logprobs_num:
                v, ix = logp.topk(r.top_logprobs_num, dim=-1)
                tops.extend([list(zip(a, b)) for a, b in zip(v.tolist(), ix.tolist())])
        out.append((values, tops if r.top_logprobs_num else None))
    return out
