"""The router's approximate tree and its policies, in-process (no servers, no network)."""

from __future__ import annotations

import random

import pytest

from radixlm.router.approx_tree import ApproxTree
from radixlm.router.config import RouterArgs
from radixlm.router.policy import CacheAware, CacheAwareConfig, RoundRobin, ShortestQueue
from radixlm.router.proxy import routing_text
from radixlm.router.worker import Worker


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def brute_match(texts: list[str], query: str) -> int:
    best = 0
    for t in texts:
        n = 0
        while n < min(len(t), len(query)) and t[n] == query[n]:
            n += 1
        best = max(best, n)
    return best


def test_tree_match_equals_longest_common_prefix_over_inserted_texts():
    rng = random.Random(0)
    tree, texts = ApproxTree(), []
    for _ in range(300):
        text = "".join(rng.choice("abc") for _ in range(rng.randint(0, 12)))
        assert tree.match(text).matched == brute_match(texts, text)
        tree.insert(text)
        texts.append(text)
    # size = characters over all edges = the number of distinct non-empty prefixes
    prefixes = {t[:i] for t in texts for i in range(1, len(t) + 1)}
    assert tree.size == len(prefixes)


def test_tree_eviction_removes_least_recently_used_branches_first():
    tree = ApproxTree(clock=FakeClock())
    tree.insert("system A: question 1")
    tree.insert("system B: question 1")
    tree.insert("system A: question 2")
    tree.insert("system B: question 1")  # B is now the most recently used
    before = tree.size
    removed = tree.evict(before - 1)
    assert removed >= 1 and tree.size <= before - 1
    # the oldest leaf ("...1" under A) went first; B's full text is still there
    assert tree.match("system B: question 1").ratio == 1.0
    assert tree.match("system A: question 1").ratio < 1.0
    tree.evict(0)
    assert tree.size == 0 and tree.match("system B").matched == 0


def test_tree_eviction_keeps_size_bound_and_structure():
    rng = random.Random(1)
    tree, texts = ApproxTree(clock=FakeClock()), []
    for _ in range(200):
        text = "".join(rng.choice("xyz") for _ in range(rng.randint(1, 20)))
        tree.insert(text)
        texts.append(text)
    tree.evict(50)
    assert 0 < tree.size <= 50
    # what is left is still a consistent radix tree: matches never exceed the inserted texts
    for t in texts:
        assert tree.match(t).matched <= len(t)


def workers(n: int) -> list[Worker]:
    return [Worker(f"http://w{i}") for i in range(n)]


def test_cache_aware_keeps_a_prefix_on_one_worker_and_spreads_new_prefixes():
    policy = CacheAware(CacheAwareConfig(cache_threshold=0.5))
    pool = workers(2)
    prefixes = [f"long shared system prompt number {i} " * 8 for i in range(4)]
    chosen: dict[int, set[str]] = {i: set() for i in range(4)}
    for q in range(8):
        for i, p in enumerate(prefixes):
            d = policy.pick(p + f"question {q}?", pool)
            chosen[i].add(d.worker.url)
            assert d.kind == ("cache_miss" if q == 0 else "cache_hit")
    assert all(len(urls) == 1 for urls in chosen.values())  # one worker per prefix
    per_worker = [sum(url == w.url for urls in chosen.values() for url in urls) for w in pool]
    assert per_worker == [2, 2]  # new prefixes go to the smaller tree


def test_cache_aware_goes_to_the_shortest_queue_only_when_imbalanced():
    policy = CacheAware(CacheAwareConfig(0.5, balance_abs_threshold=4, balance_rel_threshold=1.5))
    a, b = workers(2)
    text = "the same prompt, again and again"
    assert policy.pick(text, [a, b]).worker is a  # equal trees, equal loads: the first
    a.load, b.load = 5, 2  # abs difference 3 <= 4: still cache-aware
    assert policy.pick(text, [a, b]) == (a, "cache_hit")
    a.load, b.load = 10, 2  # 8 > 4 and 10 > 1.5 * 2: balance
    assert policy.pick(text, [a, b]) == (b, "balance")
    a.load, b.load = 40, 30  # 10 > 4 but 40 <= 1.5 * 30: cache-aware again
    assert policy.pick(text, [a, b]).kind == "cache_hit"


def test_cache_aware_threshold_decides_between_hit_and_miss():
    policy = CacheAware(CacheAwareConfig(cache_threshold=0.8))
    a, b = workers(2)
    policy.pick("abcdefghij", [a, b])  # -> a
    b.tree.insert("zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz")  # b's tree is bigger
    d = policy.pick("abcdefgXYZ", [a, b])  # 7/10 = 0.7 <= 0.8: a miss, to the smaller tree
    assert d == (a, "cache_miss")
    b.tree.clear()
    d = policy.pick("abcdefghiQ", [a, b])  # 9/10 > 0.8: a hit on a, though b's tree is empty
    assert d == (a, "cache_hit")


def test_round_robin_and_shortest_queue():
    pool = workers(3)
    rr = RoundRobin()
    assert [rr.pick("", pool).worker.url for _ in range(6)] == [w.url for w in pool] * 2
    sq = ShortestQueue()
    pool[0].load, pool[1].load, pool[2].load = 3, 1, 2
    assert sq.pick("", pool).worker is pool[1]
    pool[1].load = 3
    picks = {sq.pick("", pool).worker.url for _ in range(4)}
    assert picks == {pool[2].url}
    pool[2].load = 3  # all equal: ties rotate
    assert {sq.pick("", pool).worker.url for _ in range(6)} == {w.url for w in pool}


@pytest.mark.parametrize(
    "path, body, expected",
    [
        ("/generate", {"text": "hello"}, "hello"),
        ("/generate", {"text": ["first", "second"]}, "first"),
        ("/generate", {"input_ids": [1, 22, 333]}, "1 22 333"),
        ("/generate", {"input_ids": [[5, 6], [7]]}, "5 6"),
        ("/v1/completions", {"prompt": "p"}, "p"),
        ("/v1/completions", {"prompt": [1, 2]}, "1 2"),
        (
            "/v1/chat/completions",
            {
                "messages": [
                    {"role": "system", "content": "s"},
                    {"role": "user", "content": [{"type": "text", "text": "u"}]},
                ]
            },
            "system:s\nuser:u\n",
        ),
        ("/generate", ["not", "an", "object"], ""),
    ],
)
def test_routing_text(path, body, expected):
    assert routing_text(path, body) == expected


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--policy", "fastest"], "--policy"),
        (["--cache-threshold", "1.5"], "--cache-threshold"),
        (["--balance-rel-threshold", "0.5"], "--balance-rel-threshold"),
        (["--worker-urls", "localhost:1"], "http://"),
        (["--health-check-interval", "0"], "--health-check-interval"),
    ],
)
def test_bad_flags_are_named(argv, needle, capsys):
    with pytest.raises(SystemExit) as info:
        RouterArgs.from_cli(argv)
    assert info.value.code == 2
    assert needle in capsys.readouterr().err
