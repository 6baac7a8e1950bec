"""A scheduler killed with SIGKILL, on a server of its own: /health fails within seconds,
in-flight requests end with an error instead of hanging, new requests get 503, and SIGTERM still
exits 0 with no child process left."""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import pytest

from server_process import sse_events
from tests_helpers import pid_alive

LONG = {"max_new_tokens": 4000, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def server(start_server):
    return start_server()


def test_dead_scheduler_is_reported_and_nothing_hangs(server):
    info = server.info()
    results: dict[str, object] = {}
    streaming = threading.Event()

    def stream() -> None:
        body = {"text": "Tell a story.", "stream": True, "sampling_params": LONG}
        with server.client.stream("POST", "/generate", json=body) as resp:
            results["stream"] = list(sse_events(_mark(resp.iter_lines(), streaming)))

    def blocking() -> None:
        results["plain"] = server.client.post(
            "/generate", json={"text": "Another.", "sampling_params": LONG}
        )

    threads = [threading.Thread(target=stream), threading.Thread(target=blocking)]
    for t in threads:
        t.start()
    assert streaming.wait(60)
    os.kill(info["scheduler_pid"], signal.SIGKILL)
    killed = time.monotonic()
    while httpx.get(server.base_url + "/health").status_code != 503:
        assert time.monotonic() - killed < 5, (
            "/health still 200 five seconds after the scheduler died"
        )
        time.sleep(0.1)
    for t in threads:
        t.join(30)
        assert not t.is_alive(), "an in-flight request hangs after the scheduler died"
    events = results["stream"]
    assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "engine_dead"
    plain = results["plain"]
    assert plain.status_code == 503 and plain.json()["error"]["code"] == "engine_dead"
    new = server.client.post("/generate", json={"text": "Hi"})
    assert new.status_code == 503 and "scheduler" in new.json()["error"]["message"]
    assert (
        'radixlm:engine_healthy{model_name="SmolLM2-135M-Instruct"} 0.0'
        in server.client.get("/metrics").text
    )
    assert server.stop() == 0
    assert not pid_alive(info["detokenizer_pid"]) and not pid_alive(info["scheduler_pid"])


def _mark(lines, event: threading.Event):
    for line in lines:
        if line:
            event.set()
        yield line
