"""`ApproxTree`: the router's guess of one worker's prefix cache, as a radix tree over request
texts (characters, not tokens: the router never tokenizes).

Owned by one `Worker` (router/worker.py) and touched only on the router's event loop. The policy
matches every incoming text against each healthy worker's tree and inserts it into the tree of the
worker it picks (which refreshes that path's last-access time); a periodic task evicts
least-recently-used leaves until the tree holds at most `max_size` characters: the worker's real
cache evicts too, so an unbounded tree would claim prefixes the worker no longer holds.
"Approximate": the tree neither sees the worker's evictions nor knows its tokenization; a wrong
guess costs a cache miss, never a wrong answer.

Each node holds the run of characters on the edge from its parent and the time of the last
insert through it. Size = characters over all edges.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable
from typing import NamedTuple


class _Node:
    __slots__ = ("children", "key", "last_access", "parent")

    def __init__(self, key: str, parent: _Node | None, now: float) -> None:
        self.key = key
        self.parent = parent
        self.children: dict[str, _Node] = {}  # first character of the child's key -> child
        self.last_access = now


class Match(NamedTuple):
    matched: int  # characters of the text found in the tree
    length: int  # characters of the text

    @property
    def ratio(self) -> float:
        return self.matched / self.length if self.length else 0.0


def _common(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class ApproxTree:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.root = _Node("", None, clock())
        self.size = 0  # characters stored

    def match(self, text: str) -> Match:
        """Longest prefix of `text` in the tree. A pure read: the policy matches every worker's
        tree but inserts (and so refreshes for LRU) only into the one it picks."""
        node, pos = self.root, 0
        while pos < len(text):
            child = node.children.get(text[pos])
            if child is None:
                break
            n = _common(child.key, text[pos:])
            pos += n
            if n < len(child.key):
                break
            node = child
        return Match(pos, len(text))

    def insert(self, text: str) -> None:
        now = self.clock()
        node, pos = self.root, 0
        node.last_access = now
        while pos < len(text):
            child = node.children.get(text[pos])
            if child is None:
                node.children[text[pos]] = _Node(text[pos:], node, now)
                self.size += len(text) - pos
                return
            n = _common(child.key, text[pos:])
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = now
            node, pos = child, pos + n

    def _split(self, child: _Node, n: int) -> _Node:
        """Cut `child`'s edge after `n` characters; returns the new upper half."""
        parent = child.parent
        assert parent is not None
        upper = _Node(child.key[:n], parent, child.last_access)
        parent.children[upper.key[0]] = upper
        child.key = child.key[n:]
        child.parent = upper
        upper.children[child.key[0]] = child
        return upper

    def evict(self, max_size: int) -> int:
        """Remove least-recently-used leaves until size <= max_size; returns characters removed.
        NOTE: a leaf's parent becomes a candidate once its last child is gone, so a cold branch
        disappears from the tip up while hot prefixes above it stay."""
        if self.size <= max_size:
            return 0
        removed = 0
        order = itertools.count()  # tie-breaker: nodes do not compare
        heap = [(n.last_access, next(order), n) for n in self._leaves()]
        heapq.heapify(heap)
        while heap and self.size > max_size:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.key[0]]
            self.size -= len(leaf.key)
            removed += len(leaf.key)
            if parent is not self.root and not parent.children:
                heapq.heappush(heap, (parent.last_access, next(order), parent))
        return removed

    def clear(self) -> None:
        self.root = _Node("", None, self.clock())
        self.size = 0

    def _leaves(self) -> list[_Node]:
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            elif node is not self.root:
                out.append(node)
        return out

    def __len__(self) -> int:
        return self.size
