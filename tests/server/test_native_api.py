"""SGLang's native API on the real server: every endpoint, parity of `/generate` with
`Engine.generate`, SSE framing, abort and disconnect freeing the KV, metrics."""

from __future__ import annotations

import itertools
import socket
import threading

import pytest

from server_process import sse_events
from tests_helpers import PARITY_PROMPTS, pid_alive, wait_until

MAX_NEW = 12
GREEDY = {"max_new_tokens": MAX_NEW, "temperature": 0, "ignore_eos": True}


@pytest.fixture(autouse=True)
def _kv_accounting(server):
    yield
    server.wait_idle_and_check_kv()


def test_model_and_server_info(server):
    model = server.client.get("/get_model_info").json()
    assert model["model_path"].endswith(".gguf") and model["is_generation"] is True
    assert model["tokenizer_path"]
    info = server.info()
    assert info["host"] == "127.0.0.1" and info["port"] == server.port
    assert info["capacity"] == info["max_total_num_tokens"] == 16384
    assert info["context_length"] > 0 and info["version"]
    for key in ("scheduler_pid", "detokenizer_pid", "server_pid"):
        assert pid_alive(info[key]), key
    assert info["internal_states"][0]["capacity"] == info["capacity"]


def test_health_endpoints(server):
    assert server.client.get("/health").status_code == 200
    assert server.client.get("/health_generate").status_code == 200


def test_generate_parity_with_engine(server, engine):
    """The server's `/generate` gives the engine's tokens (the same default CPU mode; its outputs
    do not depend on batching or caching: the CPU kernels are batch-invariant). Parity with
    transformers is the fp32 path's (tests/e2e/test_engine_parity.py)."""
    prompts = [PARITY_PROMPTS[0], PARITY_PROMPTS[4]]  # plain text; chat-templated
    resp = server.client.post("/generate", json={"text": prompts, "sampling_params": GREEDY})
    assert resp.status_code == 200, resp.text
    outs = resp.json()
    assert isinstance(outs, list) and len(outs) == len(prompts)
    engine_outs = engine.generate(prompts, GREEDY)
    for out, eng in zip(outs, engine_outs, strict=True):
        assert out["output_ids"] == eng["output_ids"]
        assert out["text"] == eng["text"]
        meta = out["meta_info"]
        assert meta["finish_reason"] == {"type": "length", "length": MAX_NEW}
        assert meta["completion_tokens"] == MAX_NEW and meta["prompt_tokens"] > 0
        assert {"id", "cached_tokens", "e2e_latency"} <= set(meta)
    single = server.client.post(
        "/generate", json={"text": prompts[0], "sampling_params": GREEDY}
    ).json()
    assert isinstance(single, dict) and single["output_ids"] == outs[0]["output_ids"]
    assert single["meta_info"]["cached_tokens"] > 0  # the batch left the prompt in the cache


def test_generate_input_ids_n_and_rid(server, engine):
    ids = engine.tokenizer.encode(PARITY_PROMPTS[0])
    out = server.client.post(
        "/generate", json={"input_ids": ids, "sampling_params": GREEDY, "rid": "my-rid"}
    ).json()
    assert out["meta_info"]["id"] == "my-rid" and out["meta_info"]["prompt_tokens"] == len(ids)
    sampled = {"max_new_tokens": 4, "temperature": 0.9, "seed": 7, "n": 3}
    outs = server.client.post(
        "/generate", json={"text": "Once upon a time", "sampling_params": sampled}
    ).json()
    assert isinstance(outs, list) and len(outs) == 3  # n > 1: a flat list, as SGLang
    again = server.client.post(
        "/generate", json={"text": "Once upon a time", "sampling_params": sampled}
    ).json()
    assert [o["text"] for o in outs] == [o["text"] for o in again]  # seeded: reproducible
    batch = server.client.post(
        "/generate",
        json={
            "input_ids": [ids, ids[:3]],
            "sampling_params": {**GREEDY, "max_new_tokens": 2, "n": 2},
        },
    ).json()
    assert len(batch) == 4 and batch[0]["output_ids"] == batch[1]["output_ids"]
    assert (
        batch[0]["meta_info"]["prompt_tokens"] == len(ids)
        and batch[2]["meta_info"]["prompt_tokens"] == 3
    )


def test_stream_sse_framing(server):
    body = {"text": PARITY_PROMPTS[1], "sampling_params": GREEDY, "stream": True}
    with server.client.stream("POST", "/generate", json=body) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        raw = resp.read().decode()
    assert raw.endswith("data: [DONE]\n\n")
    assert all(block.startswith("data: ") for block in raw.split("\n\n") if block)
    events = list(sse_events(raw.split("\n")))
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    texts = [c["text"] for c in chunks]
    assert all(b.startswith(a) for a, b in itertools.pairwise(texts))  # cumulative
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"
    whole = server.client.post("/generate", json={**body, "stream": False}).json()
    assert chunks[-1]["text"] == whole["text"] and chunks[-1]["output_ids"] == whole["output_ids"]
    # A batch stream: chunks carry their flat index.
    body = {"text": ["A", "B"], "sampling_params": {**GREEDY, "max_new_tokens": 3}, "stream": True}
    with server.client.stream("POST", "/generate", json=body) as resp:
        events = list(sse_events(resp.iter_lines()))
    assert {c["index"] for c in events[:-1]} == {0, 1} and events[-1] == "[DONE]"


def test_logprobs_and_runtime_endpoint_select(server, engine):
    prompt = PARITY_PROMPTS[3]
    body = {"text": prompt, "sampling_params": {"max_new_tokens": 4, "temperature": 0},
            "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 3,
            "return_text_in_logprobs": True}  # fmt: skip
    meta = server.client.post("/generate", json=body).json()["meta_info"]
    ref = engine.generate(prompt, {"max_new_tokens": 4, "temperature": 0}, return_logprob=True,
                          logprob_start_len=0, top_logprobs_num=3, return_text_in_logprobs=True)["meta_info"]  # fmt: skip
    for key in ("input_token_logprobs", "output_token_logprobs"):
        assert [t for _, t, _ in meta[key]] == [t for _, t, _ in ref[key]]
        for (a, _, ta), (b, _, tb) in zip(meta[key], ref[key], strict=True):
            assert (a is None and b is None) or abs(a - b) < 1e-3
            assert ta == tb and isinstance(ta, str)
    assert all(len(row) == 3 for row in meta["output_top_logprobs"])
    # What SGLang's RuntimeEndpoint.select sends: cache the prefix, then score the choices.
    cached = server.client.post(
        "/generate", json={"text": prompt, "sampling_params": {"max_new_tokens": 0}}
    ).json()
    start = max(cached["meta_info"]["prompt_tokens"] - 2, 0)
    scores = server.client.post("/generate", json={
        "text": [prompt + c for c in (" Honey", " Milk")],
        "sampling_params": {"max_new_tokens": 0, "temperature": 0},
        "return_logprob": True, "return_text_in_logprobs": True, "logprob_start_len": start,
    }).json()  # fmt: skip
    assert len(scores) == 2
    for s in scores:
        assert isinstance(s["meta_info"]["input_token_logprobs"][0][-1], str)
        assert s["meta_info"]["output_token_logprobs"] == []


def test_flush_cache_and_abort_request(server):
    assert server.client.post("/flush_cache", json={"empty_cache": True}).status_code == 200
    assert server.client.get("/flush_cache").status_code == 200
    body = {"text": "Count to one thousand:", "rid": "abort-me", "stream": True,
            "sampling_params": {"max_new_tokens": 2000, "temperature": 0, "ignore_eos": True}}  # fmt: skip
    seen: list = []
    with server.client.stream("POST", "/generate", json=body) as resp:
        for event in sse_events(resp.iter_lines()):
            seen.append(event)
            if len(seen) == 2:
                assert (
                    server.client.post("/abort_request", json={"rid": "abort-me"}).status_code
                    == 200
                )
    assert seen[-1] == "[DONE]"
    assert seen[-2]["meta_info"]["finish_reason"]["type"] == "abort"
    assert seen[-2]["meta_info"]["completion_tokens"] < 2000
    bad = server.client.post("/abort_request", json={})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "rid"


def test_disconnect_mid_stream_frees_kv(server):
    before = server.info()["generated_tokens"]
    body = {"text": "Tell me a very long story.", "stream": True,
            "sampling_params": {"max_new_tokens": 3000, "temperature": 0, "ignore_eos": True}}  # fmt: skip
    with server.client.stream("POST", "/generate", json=body) as resp:
        for i, _ in enumerate(resp.iter_lines()):
            if i >= 4:
                break  # leaving the block closes the connection mid-stream
    info = server.wait_idle_and_check_kv(timeout=20)
    assert info["generated_tokens"] - before < 1000  # aborted, not run to the end


def test_disconnect_non_streaming_aborts(server):
    before = server.info()["generated_tokens"]
    payload = b'{"text": "Write an essay.", "sampling_params": {"max_new_tokens": 3000, "ignore_eos": true}}'
    auth = "".join(f"{k}: {v}\r\n" for k, v in server.headers.items())
    head = f"POST /generate HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(head.encode() + payload)
        wait_until(lambda: server.info()["num_running"] > 0, "the request to start")
    info = server.wait_idle_and_check_kv(timeout=20)
    assert info["generated_tokens"] - before < 1000


BAD_REQUESTS = [
    # (path, raw body, expected status, expected param, message fragment)
    ("/generate", b'{"text": "hi"', 400, None, "invalid JSON"),
    ("/generate", b"", 400, None, "empty"),
    ("/generate", b"[1, 2]", 400, None, "must be a JSON object"),
    ("/generate", b'{"text": "hi", "foo": 1}', 400, "foo", "unknown field"),
    ("/generate", b'{"text": 5}', 400, "text", "string"),
    ("/generate", b'{"sampling_params": {}}', 400, "text", "required"),
    ("/generate", b'{"text": "a", "input_ids": [1]}', 400, "input_ids", "not both"),
    ("/generate", b'{"text": ""}', 400, "text", "empty"),
    ("/generate", b'{"text": "hi", "stream": "yes"}', 400, "stream", "boolean"),
    (
        "/generate",
        b'{"text": "hi", "sampling_params": {"temperature": -1}}',
        400,
        "temperature",
        "temperature",
    ),
    ("/generate", b'{"text": "hi", "sampling_params": {"top_p": 0}}', 400, "top_p", "top_p"),
    (
        "/generate",
        b'{"text": "hi", "sampling_params": {"max_new_tokens": -5}}',
        400,
        "max_new_tokens",
        ">= 0",
    ),
    (
        "/generate",
        b'{"text": "hi", "sampling_params": {"max_new_tokens": 100000}}',
        400,
        "max_new_tokens",
        "limit",
    ),
    (
        "/generate",
        b'{"text": "hi", "sampling_params": {"bogus": 1}}',
        400,
        "bogus",
        "unknown sampling",
    ),
    ("/generate", b'{"text": "hi", "sampling_params": {"n": 0}}', 400, "n", "n must"),
    ("/generate", b'{"text": "hi", "sampling_params": {"stop": [""]}}', 400, "stop", "stop"),
    ("/generate", b'{"input_ids": [999999]}', 400, "input_ids", "within"),
    (
        "/generate",
        b'{"input_ids": [1, 2], "logprob_start_len": 5, "return_logprob": true}',
        400,
        "logprob_start_len",
        "logprob_start_len",
    ),
    (
        "/generate",
        b'{"text": ["a", "b"], "sampling_params": [{}]}',
        400,
        "sampling_params",
        "expected 2",
    ),
    ("/generate", b'{"text": "hi", "image_data": "x.png"}', 400, "image_data", "not supported"),
    ("/generate", b'{"text": "' + b"hello " * 9000 + b'"}', 400, "text", "limit"),
    ("/abort_request", b'{"rid": 5}', 400, "rid", "string"),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": -1}', 400, "max_tokens", "max_tokens"),
]


@pytest.mark.parametrize("path, body, status, param, fragment", BAD_REQUESTS)
def test_bad_requests_get_4xx_naming_the_problem(server, path, body, status, param, fragment):
    resp = server.client.post(path, content=body, headers={"Content-Type": "application/json"})
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["param"] == param, err
    assert fragment.lower() in err["message"].lower(), err


def test_server_keeps_serving_during_bad_requests(server):
    results: list[int] = []

    def bad() -> None:
        for _ in range(20):
            results.append(server.client.post("/generate", content=b"{nope").status_code)

    thread = threading.Thread(target=bad)
    thread.start()
    good = server.client.post(
        "/generate", json={"text": "Hi", "sampling_params": {"max_new_tokens": 2}}
    )
    thread.join()
    assert good.status_code == 200 and set(results) == {400}


def test_unknown_route_and_method(server):
    resp = server.client.get("/nope")
    assert resp.status_code == 404 and "no such endpoint" in resp.json()["error"]["message"]
    assert server.client.get("/generate").status_code == 405


def test_metrics(server):
    server.client.post(
        "/generate", json={"text": "Hi", "stream": True, "sampling_params": {"max_new_tokens": 3}}
    )
    text = server.client.get("/metrics").text
    for name in ("time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds",
                 "num_running_reqs", "num_queue_reqs", "token_usage", "cache_hit_rate",
                 "prompt_tokens_total", "generation_tokens_total"):  # fmt: skip
        assert f"radixlm:{name}" in text, name
    values = {
        line.split("{")[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("radixlm:") and "{" in line
    }
    assert values["radixlm:generation_tokens_total"] > 0
    assert values["radixlm:time_to_first_token_seconds_count"] >= 1
    assert values["radixlm:engine_healthy"] == 1.0


def test_openapi_schema_documents_bodies(server):
    schema = server.client.get("/openapi.json").json()
    assert "GenerateRequest" in schema["components"]["schemas"]
    assert "ChatCompletionRequest" in schema["components"]["schemas"]
    body = schema["paths"]["/generate"]["post"]["requestBody"]
    assert body["content"]["application/json"]["schema"]["$ref"].endswith("/GenerateRequest")
