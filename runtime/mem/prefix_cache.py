"""The `PrefixCache` seam: where finished (and chunked) requests leave their KV for later requests.

Ownership and locking: one instance lives in the scheduler process and is used from its one thread.
The cache owns the slots stored in it; `lock(node)` pins a path (root..node) for a running request
so eviction cannot free slots that request reads. Every `lock` is paired with exactly one `unlock`.

Accounting invariant (checked when idle): allocator.available() + evictable_size() +
protected_size() == allocator.capacity. Running requests additionally own the slots of tokens they
computed but have not inserted yet, so the invariant only holds with no request running.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

import torch

from radixlm.runtime.mem.kv_pool import ReqToTokenPool, SlotAllocator


class MatchResult(NamedTuple):
    slots: torch.Tensor  # int64 KV slots of the matched prefix, one per token
    node: Any  # opaque handle to lock/unlock; the deepest matched node


class CachedReq(Protocol):
    """What the cache needs from a scheduler request."""

    req_pool_idx: int
    prefix_slots: torch.Tensor  # slots already owned by the cache (locked through last_node)
    last_node: Any

    def kv_token_ids(self) -> list[int]:
        """Token ids whose KV has been computed, in order (prompt + outputs fed so far)."""
        ...


class PrefixCache(ABC):
    def __init__(self, req_to_token: ReqToTokenPool, allocator: SlotAllocator) -> None:
        self.req_to_token = req_to_token
        self.allocator = allocator

    @abstractmethod
    def match_prefix(self, token_ids: Sequence[int]) -> MatchResult: ...

    @abstractmethod
    def insert(self, token_ids: Sequence[int], slots: torch.Tensor) -> int:
        """Insert a sequence; returns how many leading tokens were already cached (the caller
        owns and must free its own slots for those positions)."""

    @abstractmethod
    def lock(self, node: Any) -> None: ...

    @abstractmethod
    def unlock(self, node: Any) -> None: ...

    @abstractmethod
    def evict(self, num_tokens: int) -> int:
        """Free at least `num_tokens` slots of unlocked entries (LRU first) if possible; returns
        the number freed."""

    @abstractmethod
    def evictable_size(self) -> int: ...

    @abstractmethod
    def protected_size(self) -> int: ...

    @abstractmethod
    def reset(self) -> None: ...

    # ---- request lifecycle -------------------------------------------------------------------
    def cache_finished_req(self, req: CachedReq) -> None:
        """Hand a finished (or retracted) request's KV to the cache and release its row."""
        token_ids = req.kv_token_ids()
        row = self.req_to_token.table[req.req_pool_idx]
        slots = row[: len(token_ids)].to(torch.int64)
        already = self.insert(token_ids, slots)
        own_from = len(req.prefix_slots)
        if already > own_from:
            self.allocator.free(slots[own_from:already])
        self.unlock(req.last_node)
        self.req_to_token.free(req.req_pool_idx)

    def cache_unfinished_req(self, req: CachedReq) -> None:
        """After a (chunked) extend: move the computed KV into the cache and lock it instead, so
        the next chunk and other requests can share it."""
        token_ids = req.kv_token_ids()
        row_idx = req.req_pool_idx
        slots = self.req_to_token.table[row_idx, : len(token_ids)].to(torch.int64)
        already = self.insert(token_ids, slots)
        own_from = len(req.prefix_slots)
        if already > own_from:
            self.allocator.free(slots[own_from:already])
        new_slots, new_node = self.match_prefix(token_ids)
        # NOTE: the tree may hold other slots for positions this request computed twice; the row
        # must point at the tree's copy, since its own duplicates were just freed.
        self.req_to_token.write(row_idx, 0, new_slots)
        self.lock(new_node)
        self.unlock(req.last_node)
        req.prefix_slots = new_slots
        req.last_node = new_node

    def check_idle_invariant(self) -> None:
        total = self.allocator.available() + self.evictable_size() + self.protected_size()
        if total != self.allocator.capacity or self.protected_size() != 0:
            raise AssertionError(
                f"KV accounting broken: free={self.allocator.available()} "
                f"evictable={self.evictable_size()} protected={self.protected_size()} "
                f"capacity={self.allocator.capacity}"
            )


class NoPrefixCache(PrefixCache):
    """`disable_radix_cache`: nothing is shared; a request's slots are freed when it finishes."""

    def match_prefix(self, token_ids: Sequence[int]) -> MatchResult:
        return MatchResult(torch.empty(0, dtype=torch.int64, device=self.allocator.device), None)

    def insert(self, token_ids: Sequence[int], slots: torch.Tensor) -> int:
        return len(token_ids)  # "already cached": the caller frees all of its slots

    def lock(self, node: Any) -> None:
        pass

    def unlock(self, node: Any) -> None:
        pass

    def evict(self, num_tokens: int) -> int:
        return 0

    def evictable_size(self) -> int:
        return 0

    def protected_size(self) -> int:
        return 0

    def reset(self) -> None:
        pass

    def cache_unfinished_req(self, req: CachedReq) -> None:
        # The request keeps owning its slots; `prefix_slots` marks them as computed.
        n = len(req.kv_token_ids())
        req.prefix_slots = self.req_to_token.table[req.req_pool_idx, :n].to(torch.int64)

    def cache_finished_req(self, req: CachedReq) -> None:
        n = len(req.kv_token_ids())
        self.allocator.free(self.req_to_token.table[req.req_pool_idx, :n].to(torch.int64))
        self.req_to_token.free(req.req_pool_idx)
