"""`radixlm router` in front of two real `radixlm serve` workers (default model, CPU, loopback):
cache hit rate against a single server, round-robin beside it, the native and OpenAI APIs with
streaming, a worker killed mid-load, and a restarted worker rejoining.

Two workers serve the whole module (one torch thread each); each test starts its own router
process (it holds no model: it starts in about a second). Hit rates come from the workers' own
`meta_info.cached_tokens`. Deadlines below only guard against a hang; nothing is timed.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from server_process import ServerProcess, free_port, sse_events

HANG_GUARD_S = 240.0
WORKER_ARGS = ("--num-threads", "1")
PREFIXES = 4
QUESTIONS = 3
WORDS = [a + b for a in "bdfgklmnprst" for b in ("ar", "el", "ix", "on", "um")]  # 60 words


def document(i: int) -> str:
    """A long prefix of its own (no two share more than their first word)."""
    words = [WORDS[(i * 7 + k * (i + 3)) % len(WORDS)] for k in range(90)]
    return f"Document {i}: " + " ".join(words) + ".\n"


def workload() -> list[str]:
    """Prefix-major order: the questions about one document arrive one after another."""
    return [
        f"{document(p)}Question {q}: what is word {q + 1}?\nAnswer:"
        for p in range(PREFIXES)
        for q in range(QUESTIONS)
    ]


class RouterProcess:
    """`radixlm router` (via `python -m radixlm.cli`) on a free loopback port."""

    def __init__(self, worker_urls: list[str], *extra: str) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "radixlm.cli", "router", "--port", str(self.port),
               "--health-check-interval", "0.5", "--worker-urls", *worker_urls, *extra]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.client = httpx.Client(base_url=self.base_url, timeout=HANG_GUARD_S)
        self.wait_workers(lambda ws: all(w["healthy"] for w in ws))

    def workers(self) -> list[dict[str, Any]]:
        return self.client.get("/workers").json()["workers"]

    def wait_workers(self, condition: Any) -> list[dict[str, Any]]:
        deadline = time.monotonic() + HANG_GUARD_S
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"router exited with {self.proc.returncode}"
            try:
                ws = self.workers()
                if condition(ws):
                    return ws
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"router's workers never met the condition: {self.workers()}")

    def metrics(self) -> str:
        return self.client.get("/metrics").text

    def close(self) -> None:
        self.client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            assert self.proc.wait(30) == 0


@pytest.fixture(scope="module")
def workers() -> Iterator[list[ServerProcess]]:
    started = [ServerProcess(*WORKER_ARGS) for _ in range(2)]
    try:
        for w in started:
            w.wait_ready()
        yield started
    finally:
        for w in started:
            w.close()


def flush(workers: list[ServerProcess]) -> None:
    for w in workers:
        assert w.client.post("/flush_cache").status_code == 200


def run(base_url: str, prompts: list[str]) -> tuple[float, list[str]]:
    """Send the prompts one by one; (cached / prompt tokens, the worker of each request)."""
    cached = total = 0
    served = []
    with httpx.Client(base_url=base_url, timeout=HANG_GUARD_S) as client:
        for prompt in prompts:
            body = {"text": prompt, "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
            resp = client.post("/generate", json=body)
            assert resp.status_code == 200, resp.text
            meta = resp.json()["meta_info"]
            cached, total = cached + meta["cached_tokens"], total + meta["prompt_tokens"]
            served.append(resp.headers.get("x-radixlm-worker", base_url))
    return cached / total, served


def test_cache_aware_hit_rate_matches_one_server_and_beats_round_robin(workers):
    prompts = workload()
    flush(workers)
    single, _ = run(workers[0].base_url, prompts)
    rates, spread = {}, {}
    for policy in ("cache_aware", "round_robin"):
        flush(workers)
        router = RouterProcess([w.base_url for w in workers], "--policy", policy)
        try:
            rates[policy], served = run(router.base_url, prompts)
            spread[policy] = {url: served.count(url) for url in set(served)}
            metrics = router.metrics()
        finally:
            router.close()
        if policy == "cache_aware":
            hits, misses = PREFIXES * (QUESTIONS - 1), PREFIXES  # one miss per document
            assert f'decision="cache_hit",policy="cache_aware"}} {hits}.0' in metrics
            assert f'decision="cache_miss",policy="cache_aware"}} {misses}.0' in metrics
    print(f"hit rate: single server {single:.3f}, cache_aware {rates['cache_aware']:.3f}, "
          f"round_robin {rates['round_robin']:.3f}; requests per worker {spread}")  # fmt: skip
    assert abs(rates["cache_aware"] - single) <= 0.05
    assert rates["cache_aware"] > rates["round_robin"]
    assert len(spread["cache_aware"]) == 2  # both workers used, each document on one of them
    assert sorted(spread["cache_aware"].values()) == [PREFIXES * QUESTIONS // 2] * 2


@pytest.fixture(scope="module")
def router(workers) -> Iterator[RouterProcess]:
    r = RouterProcess([w.base_url for w in workers], "--policy", "round_robin")
    yield r
    r.close()


def test_native_and_openai_apis_stream_through_the_router(router, workers):
    prompt = "Write one sentence about the sea."
    body = {"text": prompt, "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
    plain = router.client.post("/generate", json=body)
    assert plain.status_code == 200 and plain.headers["x-radixlm-worker"]
    with router.client.stream("POST", "/generate", json={**body, "stream": True}) as resp:
        assert resp.status_code == 200
        events = list(sse_events(resp.iter_lines()))
    assert events[-1] == "[DONE]"
    assert events[-2]["text"] == plain.json()["text"]  # cumulative text, same greedy output

    client = openai.OpenAI(base_url=router.base_url + "/v1", api_key="unused")
    assert [m.id for m in client.models.list().data]
    done = client.completions.create(model="m", prompt=prompt, max_tokens=8, temperature=0)
    assert done.choices[0].text == plain.json()["text"]
    stream = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": prompt}], max_tokens=8, temperature=0,
        stream=True,
    )  # fmt: skip
    chunks = list(stream)
    assert chunks[-1].choices[0].finish_reason in ("length", "stop")
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    bad = router.client.post("/v1/completions", json={"prompt": "x", "temperature": -1})
    assert bad.status_code == 400 and "temperature" in bad.json()["error"]["message"]
    metrics = router.metrics()
    for w in workers:
        assert f'radixlm_router:worker_healthy{{worker="{w.base_url}"}} 1.0' in metrics
        assert f'requests_total{{route="/generate",worker="{w.base_url}"}}' in metrics


def test_bench_router_prints_the_policies_side_by_side(workers, capsys):
    """`radixlm bench router` at a tiny size against this module's workers (a smoke run)."""
    from radixlm.bench.router import main as bench_main

    argv = ["--worker-urls", *(w.base_url for w in workers), "--num-prefixes", "2", "--questions",
            "2", "--prefix-len", "24", "--question-len", "4", "--output-len", "2"]  # fmt: skip
    assert bench_main(argv) == 0
    out = capsys.readouterr().out
    for row in ("single", "cache_aware", "round_robin", "cache_aware / round_robin hit rate"):
        assert row in out, out


def running(workers: list[ServerProcess]) -> int:
    return sum(w.info()["num_running"] + w.info()["num_waiting"] for w in workers)


def test_client_gone_before_the_answer_aborts_the_request_on_its_worker(router, workers):
    body = json.dumps({"text": "Count forever:", "sampling_params": {"max_new_tokens": 4000,
                       "ignore_eos": True}}).encode()  # fmt: skip
    with socket.create_connection(("127.0.0.1", router.port)) as sock:
        sock.sendall(b"POST /generate HTTP/1.1\r\nHost: router\r\nContent-Type: "
                     b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))  # fmt: skip
        deadline = time.monotonic() + HANG_GUARD_S
        while running(workers) == 0:  # the request runs on a worker
            assert time.monotonic() < deadline
            time.sleep(0.05)
    for w in workers:  # gone everywhere: nothing runs, no KV slot held
        w.wait_idle_and_check_kv(timeout=HANG_GUARD_S)
        assert w.info()["tm_requests"] == 0


def stream_one(router: RouterProcess, prompt: str, started: threading.Event,
               out: dict[str, Any]) -> None:  # fmt: skip
    """One long streaming request; records its worker and how it ended."""
    body = {"text": prompt, "stream": True,
            "sampling_params": {"max_new_tokens": 64, "ignore_eos": True, "temperature": 0}}  # fmt: skip
    with httpx.Client(base_url=router.base_url, timeout=HANG_GUARD_S) as client:
        try:
            with client.stream("POST", "/generate", json=body) as resp:
                out["worker"] = resp.headers.get("x-radixlm-worker")
                out["status"] = resp.status_code
                last: Any = None
                for line in resp.iter_lines():
                    if not line:
                        continue
                    payload = line[len("data: ") :]
                    if payload == "[DONE]":
                        break
                    last = json.loads(payload)
                    started.set()
                out["last"] = last
        except httpx.HTTPError as exc:  # a transport error is not a clear answer: recorded
            out["transport_error"] = repr(exc)
        finally:
            started.set()


def start_streams(router: RouterProcess, n: int) -> tuple[list[threading.Thread], list[dict]]:
    """n long streaming requests in flight (each has streamed its first tokens)."""
    outs: list[dict[str, Any]] = [{} for _ in range(n)]
    firsts = [threading.Event() for _ in outs]
    threads = [
        threading.Thread(target=stream_one, args=(router, f"Story {i}: once upon a time", e, o))
        for i, (e, o) in enumerate(zip(firsts, outs))
    ]
    for t in threads:
        t.start()
    for e in firsts:
        assert e.wait(HANG_GUARD_S)
    return threads, outs


def join_all(threads: list[threading.Thread]) -> None:
    for t in threads:
        t.join(HANG_GUARD_S)
        assert not t.is_alive(), "a request through the router hangs"


def test_a_worker_that_stops_answering_leaves_the_pool_and_its_requests_end(workers):
    """SIGSTOP: the worker's connections stay open but nothing comes; its health checks fail,
    it leaves the pool, and its requests in flight end with an error instead of waiting."""
    victim, other = workers
    router = RouterProcess([w.base_url for w in workers], "--policy", "round_robin",
                           "--health-check-timeout", "1")  # fmt: skip
    try:
        threads, outs = start_streams(router, 2)
        assert {o["worker"] for o in outs} == {victim.base_url, other.base_url}
        os.kill(victim.proc.pid, signal.SIGSTOP)
        try:
            join_all(threads)
            router.wait_workers(lambda ws: [w["healthy"] for w in ws] == [False, True])
        finally:
            os.kill(victim.proc.pid, signal.SIGCONT)
        for o in outs:
            assert o["status"] == 200 and "transport_error" not in o, o
            if o["worker"] == victim.base_url:
                assert "left the pool" in o["last"]["error"]["message"], o
            else:
                assert o["last"]["meta_info"]["finish_reason"]["type"] == "length", o
        router.wait_workers(lambda ws: all(w["healthy"] for w in ws))  # back once it answers
        for w in workers:  # the abandoned request was aborted on the worker: no KV held
            w.wait_idle_and_check_kv(timeout=HANG_GUARD_S)
    finally:
        router.close()


def test_killed_worker_loses_no_request_silently_and_a_restarted_one_rejoins(router, workers):
    victim, survivor = workers[1], workers[0]
    router.wait_workers(lambda ws: all(w["healthy"] for w in ws))
    threads, outs = start_streams(router, 4)
    on_victim = [o for o in outs if o.get("worker") == victim.base_url]
    assert on_victim
    victim.proc.kill()
    join_all(threads)
    for o in outs:
        assert "transport_error" not in o, o
        assert o["status"] == 200
        if o["worker"] == victim.base_url:  # ended with a clear error naming the worker
            assert "error" in o["last"], o
            assert victim.base_url in o["last"]["error"]["message"]
        else:
            assert o["last"]["meta_info"]["finish_reason"]["type"] == "length", o
    ws = router.wait_workers(lambda ws: not {w["url"]: w for w in ws}[victim.base_url]["healthy"])
    assert sum(w["healthy"] for w in ws) == 1
    # new requests all go to the survivor, though the policy is round-robin
    for _ in range(3):
        body = {"text": "hello", "sampling_params": {"max_new_tokens": 2}}
        resp = router.client.post("/generate", json=body)
        assert resp.status_code == 200 and resp.headers["x-radixlm-worker"] == survivor.base_url
    assert 'reason="worker_failed"' in router.metrics()
    survivor.wait_idle_and_check_kv()

    victim.close()
    reborn = ServerProcess(*WORKER_ARGS, port=victim.port)
    workers[1] = reborn  # NOTE: the module fixture stops it
    reborn.wait_ready()
    router.wait_workers(lambda ws: all(w["healthy"] for w in ws))
    served = set()
    for _ in range(2):
        resp = router.client.post("/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 2}})  # fmt: skip
        assert resp.status_code == 200
        served.add(resp.headers["x-radixlm-worker"])
    assert served == {survivor.base_url, reborn.base_url}
