"""Security defaults on the shared server (started with --api-key): the key is required on every
endpoint but /health, the body-size limit holds (413), the server binds loopback only, and the
key is never echoed."""

from __future__ import annotations

import ipaddress
import socket

import httpx
import openai
import psutil
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


def _non_loopback_ipv4() -> list[str]:
    """Every IPv4 address of this machine's interfaces except loopback (psutil enumerates the
    interfaces; `getaddrinfo(gethostname())` often answers 127.0.x.x only)."""
    return [
        a.address
        for addrs in psutil.net_if_addrs().values()
        for a in addrs
        if a.family == socket.AF_INET and not ipaddress.ip_address(a.address).is_loopback
    ]


def test_binds_loopback_only(server):
    info = server.info()
    assert info["host"] == "127.0.0.1"
    # what the server process listens on, as the kernel reports it: loopback only
    listening = [
        c.laddr
        for c in psutil.Process(info["server_pid"]).net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN
    ]
    assert (info["host"], server.port) in [(a.ip, a.port) for a in listening], listening
    assert all(ipaddress.ip_address(a.ip).is_loopback for a in listening), listening
    # and from each of the machine's other addresses, the port is closed
    for addr in _non_loopback_ipv4():
        with pytest.raises(OSError), socket.create_connection((addr, server.port), timeout=5):
            pass
