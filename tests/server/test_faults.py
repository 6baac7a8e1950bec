"""Faults, on the tiny model: a KV pool small enough to force retraction under load (nothing
lost, greedy outputs identical to the large-pool server's), the pool-size length guard, 100
clients hanging up mid-stream (their KV freed), an abort storm, and finally the scheduler killed
with SIGKILL (/health fails at the watchdog's next check, in-flight requests end with an error instead of hanging,
new requests get 503, SIGTERM still exits 0 with no child process left).

This module's server has the small pool; the disconnect and abort storms run on the session's
large-pool `tiny_server` (every request of a storm runs at once there)."""

from __future__ import annotations

import os
import random
import signal
import threading
import time

import httpx
import pytest

from server_process import sse_events
from tests_helpers import pid_alive, wait_until

SMALL_POOL = 1024
GREEDY = {"max_new_tokens": 64, "temperature": 0, "ignore_eos": True}
# Long enough to be in flight whenever the test acts, short enough for the context (and, for
# KILL, the small pool).
LONG = {"max_new_tokens": 1400, "ignore_eos": True}
KILL = {"max_new_tokens": 900, "ignore_eos": True}
STORM = 100


@pytest.fixture(scope="module")
def server(start_server, tiny_model_args):
    return start_server(*tiny_model_args, "--max-total-tokens", str(SMALL_POOL))


def test_retraction_under_a_small_pool_loses_nothing(server, tiny_server, run_requests):
    rng = random.Random(7)
    words = ["alpha", "beta", "gamma", "delta", "river", "stone", "cloud", "seven"]
    prompts = [" ".join(rng.choices(words, k=rng.randint(4, 30))) for _ in range(32)]
    requests = [("/generate", {"text": p, "sampling_params": GREEDY}) for p in prompts]
    retracted = server.info()["retracted"]
    small = run_requests(server, requests, len(requests))
    retractions = server.info()["retracted"] - retracted
    assert retractions > 0, "the pool was not small enough to retract"
    large = run_requests(tiny_server, requests, len(requests))
    for s, lg in zip(small, large, strict=True):
        assert s.status == lg.status == 200, (s.status, s.json, lg.status)
        assert s.json["meta_info"]["finish_reason"] == {"type": "length", "length": 64}
        assert s.json["output_ids"] == lg.json["output_ids"], "retraction changed an output"
    print(
        f"\nRETRACTION FIGURES {len(requests)} requests x 64 tokens on {SMALL_POOL} slots: "
        f"{retractions} retractions, outputs identical to the 65536-slot server"
    )


def test_length_guard_names_the_pool_limit(server):
    body = {"text": "Hi", "sampling_params": {"max_new_tokens": SMALL_POOL + 100}}
    resp = server.client.post("/generate", json=body)
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["code"] == "context_length_exceeded" and err["param"] == "max_new_tokens"
    assert f"KV pool limit of {SMALL_POOL} tokens (max_total_tokens)" in err["message"]


def test_clients_disconnecting_mid_stream_free_their_kv(tiny_server, run_requests, metric_value):
    before = tiny_server.client.get("/metrics").text
    body = {"text": "Tell me everything.", "stream": True, "sampling_params": LONG}
    outcomes = run_requests(tiny_server, [("/generate", body)] * STORM, STORM, hang_up_after=2)
    assert all(o.status == 200 and o.disconnected for o in outcomes), [
        (o.status, o.error) for o in outcomes if not o.disconnected
    ][:3]
    # Every hung-up request is aborted: nothing runs, no slot stays locked (the fixture's
    # invariants check the tokenizer manager and the sockets too).
    tiny_server.wait_idle_and_check_kv()
    after = tiny_server.client.get("/metrics").text
    cancelled = metric_value(after, "radixlm:requests_total", outcome="cancelled")
    assert cancelled - metric_value(before, "radixlm:requests_total", outcome="cancelled") == STORM


def test_abort_storm(tiny_server, run_requests):
    """Abort by rid while requests run (streaming and not), plus repeated abort_all: every
    request ends (an abort is an ordinary answer with finish_reason abort), then the server
    serves normally."""
    requests = [
        ("/generate", {"text": f"Request {i}", "rid": f"storm-{i}", "stream": i % 2 == 0,
                       "sampling_params": LONG})
        for i in range(STORM)
    ]  # fmt: skip
    outcomes: list = []
    thread = threading.Thread(
        target=lambda: outcomes.extend(run_requests(tiny_server, requests, STORM))
    )
    thread.start()
    # every rid is known before the storm
    wait_until(lambda: tiny_server.info()["tm_requests"] >= STORM, "every request admitted")
    rng = random.Random(3)
    order = rng.sample(range(STORM), STORM)
    with httpx.Client(base_url=tiny_server.base_url, timeout=30) as client:
        for k, i in enumerate(order):
            body = {"abort_all": True} if k % 25 == 24 else {"rid": f"storm-{i}"}
            assert client.post("/abort_request", json=body).status_code == 200
        thread.join(60)
        assert not thread.is_alive(), "a request hangs after the abort storm"
        for o in outcomes:
            assert o.status == 200, (o.status, o.error, o.json)
            if o.stream:
                assert o.events[-1] == "[DONE]"
                meta = o.events[-2]["meta_info"]
            else:
                meta = o.json["meta_info"]
            assert meta["finish_reason"]["type"] == "abort", meta
            assert meta["completion_tokens"] < LONG["max_new_tokens"]
        tiny_server.wait_idle_and_check_kv()
        ok = client.post("/generate", json={"text": "Hi", "sampling_params": {"max_new_tokens": 3}})
        assert ok.status_code == 200 and ok.json()["meta_info"]["completion_tokens"] == 3


def _in_flight(server, params: dict) -> tuple[list[threading.Thread], dict[str, object]]:
    """A stream (its first event already received on return) and a blocking request, both with
    `params`, in threads; each thread leaves its outcome in the returned dict."""
    results: dict[str, object] = {}
    streaming = threading.Event()

    def stream() -> None:
        body = {"text": "Tell a story.", "stream": True, "sampling_params": params}
        with server.client.stream("POST", "/generate", json=body) as resp:
            results["stream"] = list(sse_events(_mark(resp.iter_lines(), streaming)))

    def blocking() -> None:
        results["plain"] = server.client.post(
            "/generate", json={"text": "Another.", "sampling_params": params}
        )

    threads = [threading.Thread(target=stream), threading.Thread(target=blocking)]
    for t in threads:
        t.start()
    assert streaming.wait(60)
    return threads, results


def test_dead_scheduler_is_reported_and_nothing_hangs(server, metric_value):
    info = server.info()
    threads, results = _in_flight(server, KILL)
    os.kill(info["scheduler_pid"], signal.SIGKILL)
    killed = time.monotonic()
    # the watchdog's next check (every 0.5 s, docs/server.md) sees it; the bound is a failsafe
    wait_until(lambda: httpx.get(server.base_url + "/health").status_code == 503, "/health 503")
    detected = time.monotonic() - killed
    for t in threads:
        t.join(30)
        assert not t.is_alive(), "an in-flight request hangs after the scheduler died"
    print(
        f"\nSIGKILL FIGURES /health 503 after {detected:.2f} s; in-flight ended "
        f"{time.monotonic() - killed:.2f} s after the kill"
    )
    events = results["stream"]
    assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "engine_dead"
    plain = results["plain"]
    assert plain.status_code == 503 and plain.json()["error"]["code"] == "engine_dead"
    new = server.client.post("/generate", json={"text": "Hi"})
    assert new.status_code == 503 and "scheduler" in new.json()["error"]["message"]
    assert metric_value(server.client.get("/metrics").text, "radixlm:engine_healthy") == 0.0
    assert server.client.get("/health_generate").status_code == 503
    assert server.stop() == 0
    assert not pid_alive(info["detokenizer_pid"]) and not pid_alive(info["scheduler_pid"])


def test_dead_detokenizer_is_reported_like_a_dead_scheduler(start_server, tiny_model_args):
    """docs/server.md: as for the scheduler, requests in flight end with a 503 (an error event in
    a stream), new ones get 503, and the server still stops cleanly."""
    # NOTE: requests far longer than the test's steps: they are still running at the kill.
    server = start_server(
        *tiny_model_args, "--context-length", "32768", "--max-total-tokens", "65536"
    )
    info = server.info()
    threads, results = _in_flight(server, {"max_new_tokens": 30000, "ignore_eos": True})
    wait_until(lambda: server.info()["num_running"] == 2, "both requests running")
    os.kill(info["detokenizer_pid"], signal.SIGKILL)
    wait_until(lambda: httpx.get(server.base_url + "/health").status_code == 503, "/health 503")
    for t in threads:
        t.join(60)
        assert not t.is_alive(), "an in-flight request hangs after the detokenizer died"
    events = results["stream"]
    assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "engine_dead", events[-2:]
    plain = results["plain"]
    assert plain.status_code == 503 and plain.json()["error"]["code"] == "engine_dead", plain.text
    new = server.client.post("/generate", json={"text": "Hi"})
    assert new.status_code == 503 and new.json()["error"]["code"] == "engine_dead", new.text
    assert "detokenizer" in new.json()["error"]["message"]
    assert server.client.get("/health_generate").status_code == 503
    assert server.stop() == 0
    assert not pid_alive(info["scheduler_pid"])


def _mark(lines, event: threading.Event):
    for line in lines:
        if line:
            event.set()
        yield line
