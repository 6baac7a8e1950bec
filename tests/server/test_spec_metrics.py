"""Speculative decoding in `/metrics` (runtime/server/metrics.py): the acceptance histogram
`radixlm:spec_accept_length` and the counters of verify steps and accepted tokens, observed once
per finished request from its `meta_info` (`spec_verify_ct`, `spec_accept_length`).

The real server (tiny model, `--speculative-algorithm NGRAM`) exposes them with their types and
labels, and their counts agree with the `meta_info` its answers carried (both requests carry
the speculative keys). The bucket arithmetic is checked on the listener's own input, a
finished request's `ReqState`, built directly."""

from __future__ import annotations

import json
import re

import pytest

from radixlm.runtime.frontend.tokenizer_manager import ReqState
from radixlm.runtime.processes import io
from radixlm.runtime.server.metrics import ServerMetrics

NAME = "radixlm:spec_accept_length"
PROMPT = "one two three four five one two three four five one two three four five one two"


@pytest.fixture(scope="module")
def server(start_server, tiny_model_args):
    return start_server(*tiny_model_args, "--speculative-algorithm", "NGRAM")


def _types(text: str) -> dict[str, str]:
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE))


def test_server_exposes_the_acceptance_histogram(server, metric_value):
    metas = []
    for stream in (False, True):
        body = {"text": PROMPT, "stream": stream, "sampling_params": {"max_new_tokens": 12}}
        resp = server.client.post("/generate", json=body)
        assert resp.status_code == 200
        if stream:
            events = [line[6:] for line in resp.text.splitlines() if line.startswith("data: {")]
            metas.append(json.loads(events[-1])["meta_info"])
        else:
            metas.append(resp.json()["meta_info"])
    text = server.client.get("/metrics").text
    types = _types(text)
    assert types[NAME] == "histogram"
    assert types["radixlm:spec_verify_steps_total"] == "counter"
    assert types["radixlm:spec_accepted_tokens_total"] == "counter"
    buckets = re.findall(rf'^{re.escape(NAME)}_bucket{{le="([^"]+)",model_name="[^"]+"}}', text,
                         re.MULTILINE)  # fmt: skip
    assert buckets == [f"{n}.0" for n in range(1, 17)] + ["+Inf"]
    # Each finished request with verify steps is one observation: both requests decoded with
    # speculation on (the repeated words give NGRAM drafts to verify).
    spec = [m for m in metas if m.get("spec_verify_ct")]
    assert len(spec) == 2 and all(m["spec_accept_length"] >= 1.0 for m in spec)
    assert metric_value(text, NAME + "_count") == len(spec)
    steps = sum(m["spec_verify_ct"] for m in spec)
    assert metric_value(text, "radixlm:spec_verify_steps_total") == steps
    assert metric_value(text, NAME + "_sum") == pytest.approx(
        sum(m["spec_accept_length"] for m in spec)
    )


def _finished(meta: dict | None) -> ReqState:
    out = io.ReqOut("r", [], True, {"type": "length"}, 3, 4, 0)
    state = ReqState("r", [1, 2, 3], False, output_ids=[5, 6, 7, 8], finished=True, out=out)
    state.outcome = "finished"
    state.meta_info = meta
    return state


def test_buckets_and_counters_from_meta_info(metric_value):
    metrics = ServerMetrics("m")
    metrics.on_request_end(_finished({"spec_verify_ct": 4, "spec_accept_length": 2.5}))
    metrics.on_request_end(_finished({"spec_verify_ct": 2, "spec_accept_length": 1.0}))
    metrics.on_request_end(_finished({"spec_verify_ct": 0, "spec_accept_length": 0.0}))  # no step
    metrics.on_request_end(_finished({"prompt_tokens": 3}))  # speculation off: no keys
    metrics.on_request_end(_finished(None))  # ended before any result
    cut = _finished({"spec_verify_ct": 3, "spec_accept_length": 2.0})
    cut.finished, cut.outcome = False, "cancelled"  # a stream whose client went away
    metrics.on_request_end(cut)
    text = metrics.render().decode()

    def bucket(le: str) -> float:
        return metric_value(text, NAME + "_bucket", le=le)

    assert (bucket("1.0"), bucket("2.0"), bucket("3.0"), bucket("16.0"), bucket("+Inf")) == (
        1, 1, 2, 2, 2,
    )  # fmt: skip
    assert metric_value(text, NAME + "_count") == 2
    assert metric_value(text, NAME + "_sum") == 3.5
    assert metric_value(text, "radixlm:spec_verify_steps_total") == 6
    assert metric_value(text, "radixlm:spec_accepted_tokens_total") == 12  # 4 * 2.5 + 2 * 1
    assert metric_value(text, "radixlm:requests_total", outcome="finished") == 5
