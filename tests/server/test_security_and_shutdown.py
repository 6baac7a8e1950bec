"""Security defaults (API key on every endpoint but /health, body-size limit, loopback bind, no
secret echoed) and the SIGTERM drain (503 for new work, in-flight requests finish, exit 0, no
child process left). The drain test stops this module's server, so it runs last."""

from __future__ import annotations

import signal
import socket
import threading
import time

import httpx
import openai
import pytest

KEY = "s3cret-key"
LIMIT = 4096
GET_PATHS = [
    "/get_model_info",
    "/get_server_info",
    "/health_generate",
    "/metrics",
    "/v1/models",
    "/flush_cache",
]
POST_PATHS = [
    "/generate",
    "/v1/completions",
    "/v1/chat/completions",
    "/abort_request",
    "/flush_cache",
]


@pytest.fixture(scope="module")
def server(start_server):
    return start_server(
        "--max-request-body-bytes", str(LIMIT), "--shutdown-timeout", "60", api_key=KEY
    )


def test_api_key_required_everywhere_but_health(server):
    bare = httpx.Client(base_url=server.base_url, timeout=60)
    assert bare.get("/health").status_code == 200
    for path in GET_PATHS:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
            resp = bare.get(path, headers=headers)
            assert resp.status_code == 401, (path, headers)
            assert resp.json()["error"]["code"] == "invalid_api_key"
            assert resp.headers["www-authenticate"] == "Bearer"
    for path in POST_PATHS:
        assert bare.post(path, json={"text": "hi"}).status_code == 401, path
    assert server.client.get("/get_model_info").status_code == 200
    ok = server.client.post(
        "/generate", json={"text": "Hi", "sampling_params": {"max_new_tokens": 1}}
    )
    assert ok.status_code == 200
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.base_url + "/v1", api_key="nope", max_retries=0).models.list()
    good = openai.OpenAI(base_url=server.base_url + "/v1", api_key=KEY, max_retries=0)
    assert good.completions.create(model="m", prompt="Hi", max_tokens=1).choices


def test_secrets_are_not_echoed(server):
    info = server.info()
    assert info["api_key"] == "<redacted>" and KEY not in server.client.get("/get_server_info").text


def test_body_size_limit(server):
    big = {"text": "x" * (LIMIT + 10)}
    resp = server.client.post("/generate", json=big)
    assert resp.status_code == 413 and "max_request_body_bytes" in resp.json()["error"]["message"]

    def chunks():  # no Content-Length: the limit applies while the body streams in
        for _ in range(8):
            yield b"x" * 1024

    resp = server.client.post("/generate", content=chunks())
    assert resp.status_code == 413
    assert (
        server.client.post(
            "/generate", json={"text": "Hi", "sampling_params": {"max_new_tokens": 1}}
        ).status_code
        == 200
    )


def test_binds_loopback_only(server):
    assert server.info()["host"] == "127.0.0.1"
    try:
        addrs = {ai[4][0] for ai in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)}
    except OSError:
        addrs = set()
    external = [a for a in addrs if not a.startswith("127.")]
    if not external:
        pytest.skip("no non-loopback address on this machine")
    with pytest.raises(OSError), socket.create_connection((external[0], server.port), timeout=2):
        pass


def test_sigterm_drains_and_exits_cleanly(server, helpers):
    info = server.info()
    children = [info["scheduler_pid"], info["detokenizer_pid"]]
    body = {"text": "Count slowly:", "stream": True,
            "sampling_params": {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}}  # fmt: skip
    events: list = []
    first = threading.Event()

    def stream() -> None:
        with server.client.stream("POST", "/generate", json=body) as resp:
            for event in helpers.sse_events(resp.iter_lines()):
                events.append(event)
                first.set()

    thread = threading.Thread(target=stream)
    thread.start()
    assert first.wait(120)
    server.proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    try:  # new work is refused while the stream drains
        refused = server.client.post("/generate", json={"text": "Hi"})
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "draining"
        assert httpx.get(server.base_url + "/health").status_code == 503
    except httpx.ConnectError:
        pass  # the drain already finished and the listener closed
    thread.join(120)
    assert events[-1] == "[DONE]"
    final = events[-2]["meta_info"]
    assert final["finish_reason"]["type"] == "length" and final["completion_tokens"] == 24
    assert server.proc.wait(90) == 0
    assert all(helpers.pid_gone(pid) for pid in children), children
    assert "The server is fired up and ready to roll!" in server.logs()
