"""RadixAttention's prefix tree: token-id sequences -> KV slots, shared across requests.

Each edge holds a run of token ids (`key`) and the KV slots of those tokens (`value`, int64). A
node is *evictable* when no running request locks it; an evictable node without children is an
eviction candidate. Those leaves are tracked incrementally in `_evictable_leaves`, so `evict` never
walks the tree: it heapifies the candidates by last access and frees leaves until enough slots
are free, re-adding parents that become evictable leaves on the way.

Ownership and locking: see `prefix_cache.py` (one scheduler thread; no internal locks).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence

import torch

from radixlm.runtime.mem.kv_pool import ReqToTokenPool, SlotAllocator
from radixlm.runtime.mem.prefix_cache import MatchResult, PrefixCache

_clock = itertools.count()


class TreeNode:
    __slots__ = ("children", "key", "last_access", "lock_ref", "parent", "value")

    def __init__(self, parent: TreeNode | None, key: list[int], value: torch.Tensor) -> None:
        self.parent = parent
        self.key = key
        self.value = value
        self.children: dict[int, TreeNode] = {}
        self.lock_ref = 0
        self.last_access = next(_clock)

    def __lt__(self, other: TreeNode) -> bool:  # heap order: least recently used first
        return self.last_access < other.last_access


def _match_len(key: list[int], tokens: Sequence[int], start: int) -> int:
    n = min(len(key), len(tokens) - start)
    if key[:n] == list(tokens[start : start + n]):
        return n
    i = 0
    while i < n and key[i] == tokens[start + i]:
        i += 1
    return i


class RadixCache(PrefixCache):
    def __init__(self, req_to_token: ReqToTokenPool, allocator: SlotAllocator) -> None:
        super().__init__(req_to_token, allocator)
        self.device = allocator.device
        self.reset()

    def reset(self) -> None:
        self.root = TreeNode(None, [], torch.empty(0, dtype=torch.int64, device=self.device))
        self.root.lock_ref = 1  # the root is never evicted
        self._evictable = 0
        self._protected = 0
        self._evictable_leaves: set[TreeNode] = set()

    # ---- queries -------------------------------------------------------------------------------
    def match_prefix(self, token_ids: Sequence[int]) -> MatchResult:
        node, pos, values = self.root, 0, []
        node.last_access = next(_clock)
        while pos < len(token_ids):
            child = node.children.get(token_ids[pos])
            if child is None:
                break
            n = _match_len(child.key, token_ids, pos)
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = next(_clock)
            values.append(child.value)
            node, pos = child, pos + n
        slots = torch.cat(values) if values else self.root.value
        return MatchResult(slots, node)

    def evictable_size(self) -> int:
        return self._evictable

    def protected_size(self) -> int:
        return self._protected

    def total_size(self) -> int:
        return self._evictable + self._protected

    # ---- updates -------------------------------------------------------------------------------
    def insert(self, token_ids: Sequence[int], slots: torch.Tensor) -> int:
        node, pos = self.root, 0
        tokens = list(token_ids)
        while pos < len(tokens):
            child = node.children.get(tokens[pos])
            if child is None:
                new = TreeNode(node, tokens[pos:], slots[pos:].clone())
                self._attach(node, new)
                return pos
            n = _match_len(child.key, tokens, pos)
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = next(_clock)
            node, pos = child, pos + n
        return pos

    def lock(self, node: TreeNode | None) -> None:
        while node is not None and node is not self.root:
            if node.lock_ref == 0:
                self._evictable -= len(node.key)
                self._protected += len(node.key)
                self._evictable_leaves.discard(node)
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: TreeNode | None) -> None:
        while node is not None and node is not self.root:
            if node.lock_ref <= 0:
                raise AssertionError("unlock without a matching lock")
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._evictable += len(node.key)
                self._protected -= len(node.key)
                self._refresh_leaf(node)
            node = node.parent

    def evict(self, num_tokens: int) -> int:
        heap = list(self._evictable_leaves)
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            leaf = heapq.heappop(heap)
            if leaf not in self._evictable_leaves:
                continue
            self.allocator.free(leaf.value)
            freed += len(leaf.key)
            parent = self._detach(leaf)
            if parent in self._evictable_leaves:
                heapq.heappush(heap, parent)
        return freed

    # ---- internals -----------------------------------------------------------------------------
    def _attach(self, parent: TreeNode, child: TreeNode) -> None:
        parent.children[child.key[0]] = child
        self._evictable += len(child.key)
        self._evictable_leaves.discard(parent)
        self._refresh_leaf(child)

    def _detach(self, leaf: TreeNode) -> TreeNode:
        parent = leaf.parent
        assert parent is not None
        del parent.children[leaf.key[0]]
        self._evictable -= len(leaf.key)
        self._evictable_leaves.discard(leaf)
        self._refresh_leaf(parent)
        return parent

    def _refresh_leaf(self, node: TreeNode) -> None:
        if node is not self.root and node.lock_ref == 0 and not node.children:
            self._evictable_leaves.add(node)
        else:
            self._evictable_leaves.discard(node)

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """Split `child`'s edge after `n` tokens; returns the new upper node."""
        parent = child.parent
        assert parent is not None and 0 < n < len(child.key)
        upper = TreeNode(parent, child.key[:n], child.value[:n])
        upper.lock_ref = child.lock_ref
        upper.last_access = child.last_access
        parent.children[upper.key[0]] = upper
        child.parent = upper
        child.key = child.key[n:]
        child.value = child.value[n:]
        upper.children[child.key[0]] = child
        # NOTE: sizes are unchanged (the tokens just moved between two nodes of the same lock
        # state); `upper` has a child, so it is not a leaf.
        return upper

    # ---- debugging / tests ---------------------------------------------------------------------
    def check_tree(self) -> None:
        """Recompute every size and the leaf set by a full walk (tests only)."""
        evictable = protected = 0
        leaves = set()
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            assert node.key and len(node.key) == node.value.numel()
            assert node.parent is not None and node.parent.children[node.key[0]] is node
            if node.lock_ref > 0:
                protected += len(node.key)
            else:
                evictable += len(node.key)
                if not node.children:
                    leaves.add(node)
                assert all(c.lock_ref == 0 for c in node.children.values())
            stack.extend(node.children.values())
        assert (evictable, protected) == (self._evictable, self._protected), (
            evictable,
            protected,
            self._evictable,
            self._protected,
        )
        assert leaves == self._evictable_leaves


def make_prefix_cache(
    disable_radix_cache: bool, req_to_token: ReqToTokenPool, allocator: SlotAllocator
) -> PrefixCache:
    """The scheduler's prefix cache: the `PREFIX_CACHES` entry "none" with `disable_radix_cache`,
    else "radix"."""
    from radixlm.runtime.mem.registry import PREFIX_CACHES

    name = "none" if disable_radix_cache else "radix"
    return PREFIX_CACHES.load(name)(req_to_token, allocator)
