"""The load test: the real server (tiny random-weight model, SmolLM2's tokenizer) over loopback
takes 1,000 requests with up to 256 in flight: native / completions / chat, streaming or not,
constrained (regex, JSON schema, choices) or free, mixed prompt and output lengths, a third
sharing long prefixes, some `n > 1` and batched. Every request must end with a complete answer
(or an explicit JSON error), none with a 5xx or a broken connection; afterwards the KV accounting
returns to its idle baseline (through /get_server_info) and the processes' memory stays bounded.

The figures (wall time, latency percentiles, statuses, KV and RSS before/after) are printed:
`.venv/bin/python -m pytest tests/server/test_load.py -s` reproduces docs/reliability.md's table.
"""

from __future__ import annotations

import json
import random
import re
import time
from collections import Counter
from typing import Any

import pytest

N_REQUESTS = 1000
CONCURRENCY = 256
SEED = 1234
MAX_NEW = 16
# A constrained request gets room for its whole answer (the regex, the schema's JSON and the
# choices are each a few tokens long), so most of them must end with "stop" and be validated.
CONSTRAINED_MAX_NEW = 48
# A leak of even a few KiB per request would show over 500 requests: the second half of the run
# must not grow the processes' resident memory by more than this (allocator noise included).
RSS_GROWTH_LIMIT_MB = 64.0

REGEX = r"[0-9]{3}-[0-9]{4}"
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
          "additionalProperties": False}  # fmt: skip
CHOICES = ["red", "green", "blue"]
WORDS = ["the", "of", "and", "river", "stone", "light", "quick", "brown", "fox", "jumps", "over",
         "lazy", "dog", "tea", "cloud", "seven", "garden", "window", "north", "paper", "music",
         "engine", "silver", "market"]  # fmt: skip
SHARED_PREFIXES = [
    "You are a careful assistant. Answer briefly and precisely. " * 12,
    "Q: What color is the sky?\nA: Blue\nQ: What is frozen water?\nA: Ice\n" * 6,
    "Once upon a time, in a village at the edge of a large forest, there lived a woodcutter. " * 8,
]


def _prompt(rng: random.Random) -> str:
    tail = " ".join(rng.choices(WORDS, k=rng.choice([1, 3, 8, 20, 60, 150])))
    if rng.random() < 0.35:
        return rng.choice(SHARED_PREFIXES) + tail
    return tail


def _constraint(rng: random.Random) -> dict[str, Any]:
    kind = rng.choice(["regex", "json_schema", "choices"])
    if kind == "regex":
        return {"regex": REGEX}
    if kind == "json_schema":
        return {"json_schema": json.dumps(SCHEMA)}
    return {"choices": CHOICES}


def build_requests(n: int, seed: int) -> list[tuple[str, dict[str, Any]]]:
    """A deterministic mix of `n` requests (path, body)."""
    rng = random.Random(seed)
    out: list[tuple[str, dict[str, Any]]] = []
    for i in range(n):
        stream = rng.random() < 0.5
        constrained = rng.random() < 0.25
        max_new = rng.randint(1, MAX_NEW)
        if constrained:
            max_new = CONSTRAINED_MAX_NEW
        greedy = rng.random() < 0.7
        sampling: dict[str, Any] = {"temperature": 0.0} if greedy else {"temperature": 0.8,
                                                                          "seed": i}  # fmt: skip
        where = rng.random()
        if where < 0.5:
            sp: dict[str, Any] = {**sampling, "max_new_tokens": max_new}
            if constrained:
                sp.update(_constraint(rng))
            elif rng.random() < 0.15:
                sp["stop"] = [" the", "\n"]
            body: dict[str, Any] = {"text": _prompt(rng), "sampling_params": sp, "stream": stream}
            shape = rng.random()
            if shape < 0.05 and not constrained:
                sp["n"] = 2
            elif shape < 0.10:
                body["text"] = [_prompt(rng), _prompt(rng)]
            out.append(("/generate", body))
        elif where < 0.7:
            body = {"model": "m", "prompt": _prompt(rng), "max_tokens": max_new, **sampling,
                    "stream": stream}  # fmt: skip
            if constrained:
                body["regex"] = REGEX
            out.append(("/v1/completions", body))
        else:
            messages = [{"role": "user", "content": _prompt(rng)}]
            if rng.random() < 0.3:
                messages.insert(0, {"role": "system", "content": SHARED_PREFIXES[0]})
            body = {"model": "m", "messages": messages, "max_tokens": max_new, **sampling,
                    "stream": stream}  # fmt: skip
            if constrained:
                body["response_format"] = {"type": "json_schema",
                                           "json_schema": {"name": "r", "schema": SCHEMA}}  # fmt: skip
            if stream and rng.random() < 0.5:
                body["stream_options"] = {"include_usage": True}
            out.append(("/v1/chat/completions", body))
    return out


def check_complete(outcome: Any) -> list[str]:
    """Assert that a 200 answer is complete and well-formed (and meets its constraint); returns
    its finish reasons (one per choice)."""
    path, body = outcome.path, outcome.body
    where = f"{path} {json.dumps(body)[:300]}"
    if outcome.stream:
        events = outcome.events
        assert events and events[-1] == "[DONE]", f"stream not terminated: {where}"
        assert not any("error" in e for e in events[:-1] if isinstance(e, dict)), where
        finals = _stream_finals(path, events[:-1])
    else:
        finals = _finals(path, outcome.json)
    assert finals, f"no final answer: {where}"
    limit = body.get("max_tokens") or body.get("sampling_params", {}).get("max_new_tokens")
    for text, reason, tokens in finals:
        assert reason in ("length", "stop"), f"finish {reason!r}: {where}"
        assert tokens is None or tokens <= limit, where
        if reason == "stop":
            _check_constraint(body, text, where)
    return [reason for _, reason, _ in finals]


def _finals(path: str, answer: Any) -> list[tuple[str, str, int | None]]:
    if path == "/generate":
        items = answer if isinstance(answer, list) else [answer]
        return [
            (
                o["text"],
                o["meta_info"]["finish_reason"]["type"],
                o["meta_info"]["completion_tokens"],
            )
            for o in items
        ]
    assert answer["usage"]["completion_tokens"] >= 0
    key = "text" if path == "/v1/completions" else "message"
    return [
        (c[key] if key == "text" else c[key]["content"], c["finish_reason"], None)
        for c in answer["choices"]
    ]


def _stream_finals(path: str, events: list[dict[str, Any]]) -> list[tuple[str, str, int | None]]:
    finals: list[tuple[str, str, int | None]] = []
    if path == "/generate":
        last: dict[int, dict[str, Any]] = {}
        for e in events:
            index = e.get("index", 0)
            prev = last.get(index)
            assert prev is None or e["text"].startswith(prev["text"]), "text not cumulative"
            last[index] = e
        for e in last.values():
            meta = e["meta_info"]
            finals.append((e["text"], meta["finish_reason"]["type"], meta["completion_tokens"]))
        return finals
    texts: dict[int, str] = {}
    reasons: dict[int, str] = {}
    for e in events:
        for c in e["choices"]:
            delta = c.get("text") if path == "/v1/completions" else c["delta"].get("content")
            texts[c["index"]] = texts.get(c["index"], "") + (delta or "")
            if c.get("finish_reason"):
                reasons[c["index"]] = c["finish_reason"]
    assert set(reasons) == set(texts), "a choice without finish_reason"
    return [(texts[i], reasons[i], None) for i in sorted(texts)]


def _check_constraint(body: dict[str, Any], text: str, where: str) -> None:
    sp = body.get("sampling_params", body)
    if sp.get("regex"):
        assert re.fullmatch(REGEX, text), f"{text!r} does not match {REGEX}: {where}"
    elif sp.get("json_schema") or body.get("response_format"):
        assert set(json.loads(text)) == {"ok"}, f"{text!r} is not the schema's JSON: {where}"
    elif sp.get("choices"):
        assert text in CHOICES, where


@pytest.fixture(scope="module")
def server(tiny_server):
    return tiny_server


@pytest.mark.slow
def test_load_1000_requests(server, run_requests, process_rss_mb):
    requests = build_requests(N_REQUESTS, SEED)
    before = server.wait_idle_and_check_kv()
    rss_before = process_rss_mb(server)
    start = time.perf_counter()
    half = N_REQUESTS // 2
    outcomes = run_requests(server, requests[:half], CONCURRENCY)
    rss_half = process_rss_mb(server)
    outcomes += run_requests(server, requests[half:], CONCURRENCY)
    wall = time.perf_counter() - start
    rss_after = process_rss_mb(server)

    statuses = Counter(o.status for o in outcomes)
    broken = [o for o in outcomes if o.status == 0 or o.status >= 500]
    assert not broken, [(o.path, o.status, o.error, o.json) for o in broken[:5]]
    constrained_reasons: list[str] = []
    for o in outcomes:
        if o.status == 200:
            reasons = check_complete(o)
            if _is_constrained(o.body):
                constrained_reasons += reasons
        else:  # an explicit error: JSON in OpenAI's shape
            assert o.json and o.json["error"]["message"], (o.status, o.json)
    # Every limit of this server is above the load: every request must get its full answer.
    assert statuses == {200: N_REQUESTS}, statuses
    # the constraint checks above ran on most constrained answers, not on none of them
    stopped = constrained_reasons.count("stop")
    assert constrained_reasons and stopped >= 0.9 * len(constrained_reasons), Counter(
        constrained_reasons
    )

    after = server.wait_idle_and_check_kv()
    assert after["tm_requests"] == 0 and after["in_flight_requests"] == 0
    assert server.client.post("/flush_cache").status_code == 200
    flushed = server.info()
    assert flushed["free_slots"] == flushed["capacity"], flushed  # the idle baseline, exactly
    assert rss_after - rss_half < RSS_GROWTH_LIMIT_MB, (rss_before, rss_half, rss_after)

    latencies = sorted(o.latency_s for o in outcomes)
    figures = {
        "requests": N_REQUESTS,
        "max_in_flight": CONCURRENCY,
        "streaming": sum(o.stream for o in outcomes),
        "constrained": sum(_is_constrained(o.body) for o in outcomes),
        "wall_s": round(wall, 1),
        "req_per_s": round(N_REQUESTS / wall, 1),
        "p50_latency_s": round(latencies[len(latencies) // 2], 2),
        "p99_latency_s": round(latencies[int(len(latencies) * 0.99) - 1], 2),
        "max_latency_s": round(latencies[-1], 2),
        "statuses": dict(statuses),
        "kv_before": _kv(before),
        "kv_after": _kv(after),
        "kv_after_flush": _kv(flushed),
        "rss_mb_before_half_after": [round(rss_before), round(rss_half), round(rss_after)],
    }
    print("\nLOAD TEST FIGURES " + json.dumps(figures))


def _is_constrained(body: dict[str, Any]) -> bool:
    sp = body.get("sampling_params", body)
    return bool(sp.get("regex") or sp.get("json_schema") or sp.get("choices")
                or body.get("response_format"))  # fmt: skip


def _kv(info: dict[str, Any]) -> dict[str, int]:
    keys = ("free_slots", "evictable_slots", "protected_slots", "capacity")
    return {k: info[k] for k in keys}
