"""Radix cache: unit behaviour and hypothesis state-machine tests of the accounting invariant.

Invariant after every step: free + evictable + protected + held-by-requests == capacity, the
incremental sizes and evictable-leaf set equal a full recount, and every match returns the slots
that were stored for those exact token positions.
"""

from __future__ import annotations

import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from radixlm.runtime.mem.kv_pool import ReqToTokenPool, SlotAllocator
from radixlm.runtime.mem.radix_cache import RadixCache

CAPACITY = 64


def make_cache(capacity: int = CAPACITY) -> RadixCache:
    allocator = SlotAllocator(capacity, torch.device("cpu"))
    return RadixCache(ReqToTokenPool(4, 128, "cpu"), allocator)


def insert_new(cache: RadixCache, tokens: list[int]) -> torch.Tensor | None:
    """As the scheduler does: reuse the cached prefix (locked while the rest is allocated, so
    eviction cannot free it), allocate the rest, insert."""
    slots, node = cache.match_prefix(tokens)
    cache.lock(node)
    try:
        new = cache.allocator.alloc(len(tokens) - len(slots))
        if new is None:
            cache.evict(len(tokens) - len(slots) - cache.allocator.available())
            new = cache.allocator.alloc(len(tokens) - len(slots))
            if new is None:
                return None
        full = torch.cat([slots, new])
        assert cache.insert(tokens, full) == len(slots)
    finally:
        cache.unlock(node)
    return full


def test_match_split_and_share() -> None:
    cache = make_cache()
    a = insert_new(cache, [1, 2, 3, 4, 5])
    b = insert_new(cache, [1, 2, 3, 9])  # splits the first edge after 3 tokens
    assert a is not None and b is not None
    assert torch.equal(b[:3], a[:3])
    slots, node = cache.match_prefix([1, 2, 3, 4, 7])
    assert torch.equal(slots, a[:4])
    cache.lock(node)
    assert cache.protected_size() == 4 and cache.evictable_size() == 2  # [5] and [9]
    cache.check_tree()
    assert cache.evict(100) == 2  # locked path survives
    assert torch.equal(cache.match_prefix([1, 2, 3, 4]).slots, a[:4])
    cache.unlock(node)
    assert cache.evict(100) == 4
    assert cache.allocator.available() == CAPACITY
    cache.check_idle_invariant()


def test_evicts_least_recently_used_leaf_first() -> None:
    cache = make_cache()
    insert_new(cache, [1, 1, 1])
    insert_new(cache, [2, 2, 2])
    cache.match_prefix([1, 1, 1])  # touch: [2, 2, 2] is now least recently used
    cache.evict(1)
    assert len(cache.match_prefix([2, 2, 2]).slots) == 0
    assert len(cache.match_prefix([1, 1, 1]).slots) == 3


class RadixMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.cache = make_cache()
        self.expected: dict[tuple[int, ...], int] = {}  # token prefix -> slot of its last token
        self.locks: list[object] = []
        self.held: list[torch.Tensor] = []  # slots owned by pretend running requests

    seqs = st.lists(st.integers(0, 3), min_size=1, max_size=12)

    @rule(tokens=seqs)
    def insert(self, tokens: list[int]) -> None:
        full = insert_new(self.cache, tokens)
        if full is not None:
            for i in range(len(tokens)):
                self.expected[tuple(tokens[: i + 1])] = int(full[i])

    @rule(tokens=seqs)
    def match(self, tokens: list[int]) -> None:
        slots, _ = self.cache.match_prefix(tokens)
        for i, slot in enumerate(slots.tolist()):
            assert self.expected[tuple(tokens[: i + 1])] == slot

    @rule(tokens=seqs)
    def lock_path(self, tokens: list[int]) -> None:
        _, node = self.cache.match_prefix(tokens)
        self.cache.lock(node)
        self.locks.append(node)

    @precondition(lambda self: self.locks)
    @rule(data=st.data())
    def unlock_path(self, data: st.DataObject) -> None:
        node = self.locks.pop(data.draw(st.integers(0, len(self.locks) - 1)))
        self.cache.unlock(node)

    @rule(n=st.integers(1, CAPACITY))
    def evict(self, n: int) -> None:
        before = self.cache.evictable_size()
        freed = self.cache.evict(n)
        assert freed == before - self.cache.evictable_size()
        assert freed >= min(n, before)

    @rule(n=st.integers(1, 8))
    def request_takes_slots(self, n: int) -> None:
        slots = self.cache.allocator.alloc(n)
        if slots is not None:
            self.held.append(slots)

    @precondition(lambda self: self.held)
    @rule()
    def request_frees_slots(self) -> None:
        self.cache.allocator.free(self.held.pop())

    @invariant()
    def accounting(self) -> None:
        c = self.cache
        c.check_tree()
        held = sum(t.numel() for t in self.held)
        assert c.allocator.available() + c.evictable_size() + c.protected_size() + held == CAPACITY

    def teardown(self) -> None:
        for node in self.locks:
            self.cache.unlock(node)
        for slots in self.held:
            self.cache.allocator.free(slots)
        self.cache.evict(CAPACITY)
        assert self.cache.allocator.available() == CAPACITY
        self.cache.check_idle_invariant()


TestRadixMachine = RadixMachine.TestCase
TestRadixMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
