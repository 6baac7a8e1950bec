"""Routing policies: `pick(text, workers) -> Decision` over the healthy workers (never empty).

`CacheAware` follows the design sgl-router published:
1. Load first: when the busiest and idlest workers differ by more than `balance_abs_threshold`
   requests AND the busiest holds more than `balance_rel_threshold` × the idlest's, the request
   goes to the shortest queue ("balance").
2. Otherwise the text is matched against each worker's approximate tree; if the best match covers
   more than `cache_threshold` of the text, the request goes to that worker ("cache_hit").
3. Otherwise to the worker whose tree is smallest: the most room for a new prefix ("cache_miss").
Whatever the branch, the text is then inserted into the chosen worker's tree.

The others: `RoundRobin`, `Random`, `ShortestQueue` (ties broken round-robin). Policies run on the
router's event loop; their state is theirs alone.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from radixlm.router.worker import Worker

POLICIES = ("cache_aware", "round_robin", "random", "shortest_queue")


class Decision(NamedTuple):
    worker: Worker
    kind: str  # cache_hit | cache_miss | balance | round_robin | random | shortest_queue


class Policy(ABC):
    name: str

    @abstractmethod
    def pick(self, text: str, workers: Sequence[Worker]) -> Decision: ...


class RoundRobin(Policy):
    name = "round_robin"

    def __init__(self) -> None:
        self.counter = 0

    def pick(self, text: str, workers: Sequence[Worker]) -> Decision:
        worker = workers[self.counter % len(workers)]
        self.counter += 1
        return Decision(worker, self.name)


class Random(Policy):
    name = "random"

    def __init__(self, seed: int | None = None) -> None:
        self.rng = random.Random(seed)

    def pick(self, text: str, workers: Sequence[Worker]) -> Decision:
        return Decision(self.rng.choice(list(workers)), self.name)


class ShortestQueue(Policy):
    name = "shortest_queue"

    def __init__(self) -> None:
        self.counter = 0

    def pick(self, text: str, workers: Sequence[Worker]) -> Decision:
        self.counter += 1
        n = len(workers)
        # NOTE: rotating the start makes equal loads alternate instead of piling on workers[0]
        order = [workers[(self.counter + i) % n] for i in range(n)]
        return Decision(min(order, key=lambda w: w.load), self.name)


@dataclass(frozen=True)
class CacheAwareConfig:
    cache_threshold: float = 0.5
    balance_abs_threshold: int = 32
    balance_rel_threshold: float = 1.0001


class CacheAware(Policy):
    name = "cache_aware"

    def __init__(self, config: CacheAwareConfig) -> None:
        self.config = config

    def imbalanced(self, workers: Sequence[Worker]) -> bool:
        loads = [w.load for w in workers]
        hi, lo = max(loads), min(loads)
        c = self.config
        return hi - lo > c.balance_abs_threshold and hi > lo * c.balance_rel_threshold

    def pick(self, text: str, workers: Sequence[Worker]) -> Decision:
        if self.imbalanced(workers):
            worker, kind = min(workers, key=lambda w: w.load), "balance"
        else:
            matches = [(w.tree.match(text), w) for w in workers]
            # best match; among equals the less loaded worker
            best, worker = max(matches, key=lambda m: (m[0].matched, -m[1].load))
            if best.length and best.ratio > self.config.cache_threshold:
                kind = "cache_hit"
            else:
                worker = min(workers, key=lambda w: (w.tree.size, w.load))
                kind = "cache_miss"
        worker.tree.insert(text)
        return Decision(worker, kind)


def make_policy(name: str, config: CacheAwareConfig, seed: int | None = None) -> Policy:
    if name == "cache_aware":
        return CacheAware(config)
    if name == "round_robin":
        return RoundRobin()
    if name == "random":
        return Random(seed)
    if name == "shortest_queue":
        return ShortestQueue()
    raise ValueError(f"policy must be one of {POLICIES}, got {name!r}")
