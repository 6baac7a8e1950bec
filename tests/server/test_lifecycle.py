"""Lifecycle on a server of its own: the per-request timeout (504, KV freed, the server keeps
serving), then the SIGTERM drain (503 for new work, the in-flight stream finishes, exit code 0, no
child process left). The drain stops this module's server, so it runs last."""

from __future__ import annotations

import signal
import threading
import time

import httpx
import pytest

from server_process import sse_events
from tests_helpers import pid_alive

TIMEOUT_S = 10
LONG = {"max_new_tokens": 4000, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def server(start_server):
    return start_server("--request-timeout", str(TIMEOUT_S), "--shutdown-timeout", "60")


def test_request_timeout(server):
    start = time.monotonic()
    resp = server.client.post("/generate", json={"text": "Write a novel.", "sampling_params": LONG})
    elapsed = time.monotonic() - start
    assert resp.status_code == 504, resp.text
    assert resp.json()["error"]["code"] == "request_timeout"
    assert TIMEOUT_S - 0.5 <= elapsed < TIMEOUT_S + 30
    server.wait_idle_and_check_kv()
    ok = server.client.post(
        "/generate", json={"text": "Hi", "sampling_params": {"max_new_tokens": 1}}
    )
    assert ok.status_code == 200
    assert 'outcome="timeout"' in server.client.get("/metrics").text


def test_sigterm_drains_and_exits_cleanly(server):
    info = server.info()
    children = [info["scheduler_pid"], info["detokenizer_pid"]]
    body = {"text": "Count slowly:", "stream": True,
            "sampling_params": {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}}  # fmt: skip
    events: list = []
    first = threading.Event()

    def stream() -> None:
        with server.client.stream("POST", "/generate", json=body) as resp:
            for event in sse_events(resp.iter_lines()):
                events.append(event)
                first.set()

    thread = threading.Thread(target=stream)
    thread.start()
    assert first.wait(60)
    server.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    try:  # new work is refused while the stream drains
        refused = server.client.post("/generate", json={"text": "Hi"})
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "draining"
        assert httpx.get(server.base_url + "/health").status_code == 503
    except httpx.ConnectError:
        pass  # the drain already finished and the listener closed
    thread.join(60)
    assert events[-1] == "[DONE]"
    final = events[-2]["meta_info"]
    assert final["finish_reason"]["type"] == "length" and final["completion_tokens"] == 12
    assert server.proc.wait(90) == 0
    assert not any(pid_alive(pid) for pid in children), children
    logs = server.logs()
    assert "The server is fired up and ready to roll!" in logs and "shutting down" in logs
