"""The server as a user starts it: the `radixlm serve` console script of the environment (not
`launch_server` imported by the tests), on the tiny model. It checks what docs/server.md promises
about that process: `--served-model-name`, `PUT /generate`, a request log line per request that
never holds prompt text, `/flush_cache` refused while busy, `/abort_request` by the rid of an
`n > 1` request ending its `rid-k` sub-requests, SIGINT draining and a second signal
aborting at once (exit code 0, no child left), a third signal exiting without waiting for a
request that cannot end, and children that exit on their own when the server is killed."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading

import httpx
import pytest

from server_process import sse_events
from tests_helpers import pid_alive, wait_until

SERVED = "tiny-served"
MARKER = "zebra-quartz-7781"  # prompt text that must never reach the log
# Only a second signal can end the drain before this: the test would hang on it otherwise.
LONG_DRAIN_S = 3600
LONG = {"max_new_tokens": 30000, "temperature": 0, "ignore_eos": True}


def console_script() -> list[str]:
    script = os.path.join(os.path.dirname(sys.executable), "radixlm")
    assert os.access(script, os.X_OK), f"the console script is not installed: {script}"
    return [script, "serve"]


@pytest.fixture(scope="module")
def server(start_server, tiny_model_args):
    return start_server(
        *tiny_model_args, "--served-model-name", SERVED, "--log-requests",
        "--shutdown-timeout", str(LONG_DRAIN_S), "--context-length", "32768",
        "--max-total-tokens", "65536",
        command=console_script(),
    )  # fmt: skip


def test_served_model_name(server):
    models = server.client.get("/v1/models").json()
    assert [m["id"] for m in models["data"]] == [SERVED]
    assert server.client.get(f"/v1/models/{SERVED}").status_code == 200
    out = server.client.post(
        "/v1/completions", json={"model": SERVED, "prompt": "Hi", "max_tokens": 2}
    )
    assert out.status_code == 200 and out.json()["model"] == SERVED


def test_put_generate_and_the_request_log_holds_no_prompt_text(server):
    body = {"text": f"Say {MARKER} twice.", "rid": "logged-1",
            "sampling_params": {"max_new_tokens": 3, "ignore_eos": True}}  # fmt: skip
    put = server.client.put("/generate", json=body)
    assert put.status_code == 200, put.text
    assert put.json()["meta_info"]["completion_tokens"] == 3
    chat = server.client.post(
        "/v1/chat/completions",
        json={"model": SERVED, "messages": [{"role": "user", "content": MARKER}], "max_tokens": 2},
    )
    assert chat.status_code == 200, chat.text
    wait_until(lambda: '"rid": "logged-1"' in server.logs(), "the request's log line")
    logs = server.logs()
    line = next(x for x in logs.splitlines() if '"rid": "logged-1"' in x)
    record = json.loads(line[line.index("{") :])
    assert record["outcome"] == "finished" and record["completion_tokens"] == 3
    assert MARKER not in logs


def test_flush_cache_is_refused_while_busy(server):
    started = threading.Event()
    results: list = []

    def run() -> None:
        body = {"text": "Busy.", "stream": True, "sampling_params": LONG, "rid": "busy-1"}
        with server.client.stream("POST", "/generate", json=body) as resp:
            for event in sse_events(resp.iter_lines()):
                started.set()
                results.append(event)

    thread = threading.Thread(target=run)
    thread.start()
    assert started.wait(120)
    busy = server.client.post("/flush_cache")
    assert busy.status_code == 400 and busy.json()["error"]["code"] == "busy", busy.text
    assert server.client.post("/abort_request", json={"rid": "busy-1"}).status_code == 200
    thread.join(120)
    assert results[-1] == "[DONE]" and results[-2]["meta_info"]["finish_reason"]["type"] == "abort"
    server.wait_idle_and_check_kv()
    assert server.client.post("/flush_cache").status_code == 200


def test_abort_by_rid_reaches_the_n_sub_requests(server):
    body = {"text": "Twins.", "rid": "twins", "stream": True,
            "sampling_params": {**LONG, "n": 2}}  # fmt: skip
    finals: dict[int, dict] = {}
    aborted = False
    with server.client.stream("POST", "/generate", json=body) as resp:
        for event in sse_events(resp.iter_lines()):
            if event == "[DONE]":
                break
            if not aborted:  # the sub-requests twins-0 and twins-1 run: abort by the parent rid
                wait_until(lambda: server.info()["num_running"] == 2, "both sub-requests running")
                assert (
                    server.client.post("/abort_request", json={"rid": "twins"}).status_code == 200
                )
                aborted = True
            if event["meta_info"]["finish_reason"] is not None:
                finals[event["index"]] = event["meta_info"]
    assert sorted(finals) == [0, 1]
    for meta in finals.values():
        assert meta["finish_reason"]["type"] == "abort" and meta["completion_tokens"] < 30000
    server.wait_idle_and_check_kv()


def test_children_exit_when_the_server_is_killed(start_server, tiny_model_args):
    other = start_server(*tiny_model_args, command=console_script())
    info = other.info()
    children = [info["scheduler_pid"], info["detokenizer_pid"]]
    other.proc.kill()
    other.proc.wait(60)
    wait_until(lambda: not any(pid_alive(p) for p in children), "the orphaned children to exit")


def test_a_third_signal_exits_without_waiting(start_server, tiny_model_args):
    """The gate: the scheduler is stopped (SIGSTOP) while a stream is in flight, so neither the
    drain (first SIGINT, LONG_DRAIN_S) nor the abort (second SIGINT, which waits for the aborted
    request's final chunk up to the same timeout) can end it. The third SIGINT exits: code 0,
    the stream is cut without a final chunk, and no child is left (the stopped one is killed)."""
    other = start_server(
        *tiny_model_args, "--shutdown-timeout", str(LONG_DRAIN_S), "--context-length", "32768",
        "--max-total-tokens", "65536", command=console_script(),
    )  # fmt: skip
    info = other.info()
    children = [info["scheduler_pid"], info["detokenizer_pid"]]
    started = threading.Event()
    results: list = []
    errors: list[Exception] = []

    def run() -> None:
        body = {"text": "Long.", "stream": True, "sampling_params": LONG}
        try:
            with httpx.stream("POST", other.base_url + "/generate", json=body, timeout=None) as r:
                for event in sse_events(r.iter_lines()):
                    started.set()
                    results.append(event)
        except httpx.HTTPError as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        assert started.wait(120)
        os.kill(info["scheduler_pid"], signal.SIGSTOP)
        other.proc.send_signal(signal.SIGINT)
        wait_until(lambda: "waiting up to" in other.logs(), "the drain to start")
        other.proc.send_signal(signal.SIGINT)
        wait_until(lambda: "aborting 1 request(s)" in other.logs(), "the abort to be sent")
        assert thread.is_alive() and other.proc.poll() is None  # held: the scheduler is stopped
        other.proc.send_signal(signal.SIGINT)
        assert other.proc.wait(120) == 0
    finally:
        if pid_alive(info["scheduler_pid"]):
            os.kill(info["scheduler_pid"], signal.SIGCONT)
    thread.join(120)
    assert not thread.is_alive()
    assert "[DONE]" not in results and errors, (results[-2:], errors)
    assert all(e["meta_info"]["finish_reason"] is None for e in results if isinstance(e, dict))
    wait_until(lambda: not any(pid_alive(p) for p in children), "the children to exit")


def test_sigint_drains_and_a_second_signal_aborts_at_once(server):
    """Runs last: it stops this module's server. The drain would last LONG_DRAIN_S; only the
    second SIGINT can end the long stream early."""
    info = server.info()
    children = [info["scheduler_pid"], info["detokenizer_pid"]]
    started = threading.Event()
    results: list = []

    def run() -> None:
        body = {"text": "Long.", "stream": True, "sampling_params": LONG}
        with httpx.stream("POST", server.base_url + "/generate", json=body, timeout=None) as resp:
            for event in sse_events(resp.iter_lines()):
                started.set()
                results.append(event)

    thread = threading.Thread(target=run)
    thread.start()
    assert started.wait(120)
    server.proc.send_signal(signal.SIGINT)
    wait_until(
        lambda: httpx.get(server.base_url + "/health").status_code == 503, "/health 503 draining"
    )
    assert thread.is_alive()  # draining: the stream still runs
    server.proc.send_signal(signal.SIGINT)
    thread.join(120)
    assert not thread.is_alive(), "the second signal did not abort the stream"
    assert results[-1] == "[DONE]"
    meta = results[-2]["meta_info"]
    assert meta["finish_reason"]["type"] == "abort" and meta["completion_tokens"] < 30000
    assert server.proc.wait(120) == 0
    assert not any(pid_alive(p) for p in children)
