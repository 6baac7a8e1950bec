"""Which waiting requests join the next extend batch, and how much of each.

`order_waiting` sorts the queue: `lpm` (longest cached prefix first, FCFS among equals; falls back
to FCFS for long queues, where matching every request each step would cost too much), `fcfs`,
`lof` (longest output first), `random`.

`PrefillAdder` admits requests in that order within three budgets: the KV pool (free + evictable
slots, minus a reservation for the future decode tokens of running and admitted requests, scaled by
`new_token_ratio`), `max_prefill_tokens` per batch, and `chunked_prefill_size` (a prompt longer
than what is left is split; its next chunk goes first in the next round).

`NewTokenRatio`: the share of their remaining `max_new_tokens` that running requests are expected
to still need (the reservation above). It starts conservative, decays after every decode step,
jumps to 1.0 on a retraction and resets when nothing runs.
"""

from __future__ import annotations

import random

from radixlm.runtime.mem.prefix_cache import PrefixCache
from radixlm.runtime.mem.radix_cache import RadixCache
from radixlm.runtime.scheduler.req import Req

LPM_MAX_QUEUE = 128  # beyond this many waiting requests, lpm behaves as fcfs
RESERVE_CLIP = 4096  # future decode tokens counted per request at most
IN_BATCH_SHARE_MIN = 32  # defer a request sharing this many uncached tokens with an admitted one
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO = 0.1
NEW_TOKEN_RATIO_DECAY = 0.001


class NewTokenRatio:
    """Owned by the scheduler; decayed by the result path after each decode step."""

    def __init__(self, conservativeness: float) -> None:
        self.initial = INIT_NEW_TOKEN_RATIO * conservativeness
        self.value = self.initial

    def reset(self) -> None:
        self.value = self.initial

    def decay(self) -> None:
        self.value = max(MIN_NEW_TOKEN_RATIO, self.value - NEW_TOKEN_RATIO_DECAY)

    def retracted(self) -> None:
        self.value = 1.0


def order_waiting(waiting: list[Req], policy: str, cache: PrefixCache) -> None:
    if policy == "lpm" and isinstance(cache, RadixCache) and len(waiting) <= LPM_MAX_QUEUE:
        prefix = {
            id(r): len(cache.match_prefix(r.fill_ids[: r.max_prefix_len()]).slots) for r in waiting
        }
        waiting.sort(key=lambda r: -prefix[id(r)])  # stable: FCFS among equals
    elif policy == "lof":
        waiting.sort(key=lambda r: -r.sampling_params.max_new_tokens)
    elif policy == "random":
        random.shuffle(waiting)


def _shared_len(a: list[int], b: list[int], start: int) -> int:
    n = min(len(a), len(b))
    i = start
    while i < n and a[i] == b[i]:
        i += 1
    return i - start


class PrefillAdder:
    def __init__(
        self,
        cache: PrefixCache,
        running: list[Req],
        new_token_ratio: float,
        max_prefill_tokens: int,
        chunk_size: int | None,
        max_running: int,
    ) -> None:
        self.cache = cache
        self.ratio = new_token_ratio
        reserved = (
            sum(min(r.remaining_new_tokens(), RESERVE_CLIP) for r in running) * new_token_ratio
        )
        allocator = cache.allocator
        self.rem_total = allocator.available() + cache.evictable_size() - int(reserved)
        self.rem_input = max_prefill_tokens
        self.rem_chunk = chunk_size if chunk_size is not None else 1 << 62
        self.rem_running = max_running - len(running)
        self.admitted: list[Req] = []
        self.new_chunked: Req | None = None

    def add_chunked(self, req: Req) -> None:
        """Continue a request whose prompt is being prefilled in chunks."""
        remaining = req.seqlen - req.computed
        n = min(remaining, self.rem_chunk)
        req.extend_len = n
        req.is_chunked = n < remaining
        self.rem_total -= n
        self.rem_input -= n
        self.rem_chunk -= n
        self.admitted.append(req)
        if req.is_chunked:
            self.new_chunked = req

    def add(self, req: Req, share_check: bool) -> bool:
        """Try to admit `req`; False means stop scanning the queue (a budget is exhausted) —
        deferred requests return True without being admitted."""
        if self.rem_running <= 0 or self.cache.req_to_token.available() == 0:
            return False
        if self.rem_chunk <= 0 or self.new_chunked is not None:
            return False
        cache = self.cache
        slots, node = cache.match_prefix(req.fill_ids[: req.max_prefix_len()])
        prefix = len(slots)
        extend = req.seqlen - prefix
        if share_check:
            fill = req.fill_ids
            for other in self.admitted:
                if _shared_len(fill, other.fill_ids, prefix) >= IN_BATCH_SHARE_MIN:
                    return True  # defer: next round it hits the prefix `other` is computing now
        future = int(min(req.remaining_new_tokens(), RESERVE_CLIP) * self.ratio)
        if extend > self.rem_input and self.admitted:
            return False
        # NOTE: locking the matched prefix takes its slots out of the evictable budget, so the
        # check happens with the lock held (and is undone when the request does not fit).
        evictable = cache.evictable_size()
        cache.lock(node)
        locked = evictable - cache.evictable_size()
        if extend + future + locked > self.rem_total:
            cache.unlock(node)
            return False
        self.rem_total -= locked
        n = min(extend, self.rem_chunk)
        row = cache.req_to_token.alloc()
        assert row is not None
        req.req_pool_idx = row
        req.prefix_slots = slots
        req.last_node = node
        req.computed = prefix
        cache.req_to_token.write(row, 0, slots)
        if req.times_retracted == 0 and not req.output_ids:
            req.cached_tokens = prefix
        req.extend_len = n
        req.is_chunked = n < extend
        self.rem_total -= extend + future
        self.rem_input -= n
        self.rem_chunk -= n
        self.rem_running -= 1
        self.admitted.append(req)
        if req.is_chunked:
            self.new_chunked = req
        return True
