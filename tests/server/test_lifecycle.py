"""Admission control, load shedding and shutdown, on a tiny-model server of its own:

- one burst over the limits: beyond `--max-queued-requests` a request gets 429 with
  `Retry-After` (native and, through the real `openai` client, in OpenAI's error shape); requests
  that wait in the scheduler's queue longer than `--queue-timeout` get 429 `queue_timeout`; a
  request running longer than `--request-timeout` gets 504 and its KV is freed; all of it
  counted in /metrics, next to the configured limits;
- the length guard: prompt + max_new_tokens beyond the context length is a 400 naming the limit
  and the field (`max_new_tokens` natively, `max_tokens` on /v1);
- SIGTERM during load drains: in-flight streams finish, those still running when
  `--shutdown-timeout` ends are aborted (answered with finish_reason abort), new work gets an
  explicit 503, the process exits 0, and no child process is left. It stops this module's
  server, so it runs last.

The long context (32768) makes "long-running" independent of the machine's speed: a request
for 30000 tokens runs for many seconds anywhere, while a short one ends at once.
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

import httpx
import openai
import pytest

from radixlm.runtime.errors import InvalidRequestError
from radixlm.runtime.server.launch_server import build_parser
from radixlm.runtime.server_args import ServerArgs
from tests_helpers import pid_alive, wait_until

MAX_QUEUED = 8
MAX_RUNNING = 4
QUEUE_TIMEOUT_S = 3.0
REQUEST_TIMEOUT_S = 8.0
SHUTDOWN_TIMEOUT_S = 3.0
CONTEXT = 32768
SHORT_LEFT = 4  # tokens a short stream still has to make when SIGTERM comes
LONG = {"max_new_tokens": 30000, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def server(start_server, tiny_model_args):
    return start_server(
        *tiny_model_args, "--context-length", str(CONTEXT), "--max-total-tokens", "65536",
        "--max-queued-requests", str(MAX_QUEUED), "--max-running-requests", str(MAX_RUNNING),
        "--queue-timeout", str(QUEUE_TIMEOUT_S), "--request-timeout", str(REQUEST_TIMEOUT_S),
        "--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S),
    )  # fmt: skip


def test_reliability_flags_are_cli_flags_of_serve():
    ns = build_parser().parse_args(
        ["--max-queued-requests", "3", "--max-total-tokens", "4096", "--request-timeout", "7.5",
         "--queue-timeout", "2", "--shutdown-timeout", "9"]
    )  # fmt: skip
    args = ServerArgs.from_cli_args(ns)
    assert (args.max_queued_requests, args.max_total_tokens) == (3, 4096)
    assert (args.request_timeout, args.queue_timeout, args.shutdown_timeout) == (7.5, 2.0, 9.0)
    usage = " ".join(build_parser().format_help().split())
    assert "--max-queued-requests MAX_QUEUED_REQUESTS max requests held at once" in usage
    assert "--queue-timeout QUEUE_TIMEOUT seconds a request may wait" in usage
    for flag in ("--request-timeout", "--queue-timeout", "--max-queued-requests"):
        with pytest.raises(InvalidRequestError, match=flag[2:].replace("-", "_")):
            ServerArgs.from_cli_args(build_parser().parse_args([flag, "0"]))


def test_burst_over_the_limits_is_shed_explicitly(server, run_requests, metric_value):
    before = server.client.get("/metrics").text
    burst: list = []
    longs = [
        ("/generate", {"text": f"Story {i}:", "sampling_params": LONG}) for i in range(MAX_QUEUED)
    ]
    thread = threading.Thread(target=lambda: burst.extend(run_requests(server, longs, MAX_QUEUED)))
    thread.start()
    wait_until(lambda: server.info()["tm_requests"] == MAX_QUEUED, "the burst to be admitted")
    # Full: one more is refused at once, natively and on /v1 (OpenAI's shape, via its client).
    refused = server.client.post("/generate", json={"text": "one more"})
    assert refused.status_code == 429, refused.text
    assert refused.headers["retry-after"] == "1"
    err = refused.json()["error"]
    assert err["code"] == "queue_full" and err["type"] == "rate_limit_error"
    assert f"max_queued_requests={MAX_QUEUED}" in err["message"]
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0)
    with pytest.raises(openai.RateLimitError) as exc_info:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                       max_tokens=4)  # fmt: skip
    assert exc_info.value.response.headers["retry-after"] == "1"
    assert exc_info.value.body["code"] == "queue_full"  # type: ignore[index]
    thread.join(REQUEST_TIMEOUT_S + 60)
    assert not thread.is_alive()
    # MAX_RUNNING ran until the request timeout (504); the rest never started and were shed
    # after the queue timeout (429 queue_timeout), well before it.
    by_status = sorted((o.status, o.error_code) for o in burst)
    assert by_status == sorted([(504, "request_timeout")] * MAX_RUNNING
                               + [(429, "queue_timeout")] * (MAX_QUEUED - MAX_RUNNING)), by_status  # fmt: skip
    # NOTE: which timer ended each request is read from its answer and the counters below,
    # never from the client's clock (a loaded machine stretches every latency).
    for o in burst:
        if o.status == 429:
            assert o.headers["retry-after"] == "1" and "queue_timeout" in o.json["error"]["message"]
    print(
        "\nBURST FIGURES "
        + ", ".join(
            f"{o.status} {o.error_code} after {o.latency_s:.2f} s"
            for o in sorted(burst, key=lambda o: o.latency_s)
        )
    )
    server.wait_idle_and_check_kv()  # the timed-out requests' KV is back
    ok = server.client.post(
        "/generate", json={"text": "Hi", "sampling_params": {"max_new_tokens": 2}}
    )
    assert ok.status_code == 200, ok.text

    after = server.client.get("/metrics").text

    def grew(name: str, **labels: str) -> float:
        return metric_value(after, name, **labels) - metric_value(before, name, **labels)

    rejected = "radixlm:rejected_requests_total"
    assert grew(rejected, status="429", reason="queue_full") == 2
    assert grew(rejected, status="429", reason="queue_timeout") == MAX_QUEUED - MAX_RUNNING
    assert grew(rejected, status="504", reason="request_timeout") == MAX_RUNNING
    assert grew("radixlm:requests_total", outcome="timeout") == MAX_RUNNING
    assert grew("radixlm:requests_total", outcome="queue_timeout") == MAX_QUEUED - MAX_RUNNING
    limits = {
        "max_queued_requests": MAX_QUEUED, "queue_timeout_s": QUEUE_TIMEOUT_S,
        "request_timeout_s": REQUEST_TIMEOUT_S, "context_length": CONTEXT,
        "max_total_tokens": 65536,
    }  # fmt: skip
    for name, value in limits.items():
        assert metric_value(after, "radixlm:admission_limit", limit=name) == value, name
    assert metric_value(after, "radixlm:admitted_requests") == 0


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": CONTEXT}},
         "max_new_tokens"),
        ("/generate", {"input_ids": [5] * (CONTEXT + 1), "sampling_params": {"max_new_tokens": 1}},
         "input_ids"),
        ("/v1/completions", {"model": "m", "prompt": "Hi", "max_tokens": CONTEXT}, "max_tokens"),
        ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "Hi"}],
                                  "max_tokens": CONTEXT}, "max_tokens"),
    ],
)  # fmt: skip
def test_length_guard_names_the_limit(server, path, body, param):
    resp = server.client.post(path, json=body)
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["code"] == "context_length_exceeded" and err["param"] == param, err
    assert f"context length limit of {CONTEXT} tokens (context_length)" in err["message"], err


def test_sigterm_during_load_drains_and_exits_cleanly(server, run_requests):
    """In flight at SIGTERM: short streams (they finish) and long ones (aborted when the
    shutdown timeout ends: finish_reason abort). New work meanwhile gets an explicit 503."""
    info = server.info()
    children = [info["scheduler_pid"], info["detokenizer_pid"]]
    short = {"max_new_tokens": 48, "temperature": 0, "ignore_eos": True}
    mix = [short, LONG] * (MAX_RUNNING // 2)
    streams = [("/generate", {"text": f"Count {i}:", "stream": True, "sampling_params": sp})
               for i, sp in enumerate(mix)]  # fmt: skip
    generated: dict[int, tuple[bool, int]] = {}  # id(outcome) -> (short, tokens so far)
    signalled = threading.Event()

    def on_event(o: Any) -> None:
        meta = o.events[-1].get("meta_info", {}) if isinstance(o.events[-1], dict) else {}
        tokens = meta.get("completion_tokens", generated.get(id(o), (False, 0))[1])
        generated[id(o)] = (o.body["sampling_params"] is short, tokens)
        # NOTE: SIGTERM goes, from the client's own loop, at the event where every stream is
        # running and the last short one has SHORT_LEFT tokens to go: that one is in flight, and
        # the drain has a few tokens per stream to finish within the shutdown timeout however
        # loaded the machine is (a state decides, not a clock).
        if (
            not signalled.is_set()
            and len(generated) == MAX_RUNNING
            and all(n >= short["max_new_tokens"] - SHORT_LEFT for s, n in generated.values() if s)
        ):
            server.proc.send_signal(signal.SIGTERM)
            signalled.set()

    results: list = []
    thread = threading.Thread(
        target=lambda: results.extend(run_requests(server, streams, MAX_RUNNING, on_event=on_event))
    )
    thread.start()
    wait_until(signalled.is_set, "every stream running, each short one near its end: SIGTERM")
    signalled_at = time.monotonic()
    wait_until(lambda: httpx.get(server.base_url + "/health").status_code == 503, "/health 503")
    flood = run_requests(
        server, [("/generate", {"text": "more", "sampling_params": short})] * 24, 8
    )
    thread.join(SHUTDOWN_TIMEOUT_S + 30)
    assert server.proc.wait(SHUTDOWN_TIMEOUT_S + 30) == 0
    waited = time.monotonic() - signalled_at  # printed, not asserted: the answers below prove it
    print(
        f"\nSIGTERM FIGURES exit 0 after {waited:.2f} s (shutdown_timeout {SHUTDOWN_TIMEOUT_S} s); "
        f"flood statuses {sorted({o.status for o in flood})}"
    )
    for o in results:
        assert o.status == 200 and o.events[-1] == "[DONE]", (o.status, o.error, o.events[-2:])
        meta = o.events[-2]["meta_info"]
        if o.body["sampling_params"] is short:  # finished during the drain (or before it)
            assert meta["finish_reason"]["type"] == "length" and meta["completion_tokens"] == 48
        else:  # still running when the shutdown timeout ended: aborted, answered
            assert meta["finish_reason"]["type"] == "abort", meta
    for o in flood:  # refused explicitly, or the listener had already closed
        assert o.status == 503 or (o.status == 0 and "Connect" in (o.error or "")), (
            o.status, o.error, o.json)  # fmt: skip
        if o.status:
            assert o.json["error"]["code"] == "draining", o.json
    assert not any(pid_alive(pid) for pid in children), children
    logs = server.logs()
    assert "The server is fired up and ready to roll!" in logs and "shutting down" in logs
