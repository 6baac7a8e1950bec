"""Security defaults on the shared server (started with --api-key): the key is required on every
endpoint but /health, the body-size limit holds (413), the server binds loopback only, and the
key is never echoed."""

from __future__ import annotations

import socket

import httpx
import openai
import pytest

from server_process import MAIN_BODY_LIMIT

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
def key(server):
    return server.api_key


def test_api_key_required_everywhere_but_health(server, key):
    bare = httpx.Client(base_url=server.base_url, timeout=60)
    assert bare.get("/health").status_code == 200
    for path in GET_PATHS:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": key}):
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
    good = openai.OpenAI(base_url=server.base_url + "/v1", api_key=key, max_retries=0)
    assert good.completions.create(model="m", prompt="Hi", max_tokens=1).choices


def test_secrets_are_not_echoed(server, key):
    info = server.info()
    assert info["api_key"] == "<redacted>" and key not in server.client.get("/get_server_info").text


def test_body_size_limit(server):
    limit = MAIN_BODY_LIMIT
    big = {"text": "x" * (limit + 10)}
    resp = server.client.post("/generate", json=big)
    assert resp.status_code == 413 and "max_request_body_bytes" in resp.json()["error"]["message"]

    def chunks():  # no Content-Length: the limit applies while the body streams in
        for _ in range(limit // 1024 + 2):
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
