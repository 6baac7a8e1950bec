"""Bad input, table-driven, on the tiny-model server: 100+ malformed requests across every
endpoint (broken JSON, wrong types, negative / huge / non-finite values, empty prompts, unknown
fields, huge bodies, invalid UTF-8, invalid regexes and schemas, regexes whose automaton explodes,
stop lists of thousands of strings, n far too large, logprob_start_len beyond the prompt, unknown
routes and methods). Each gets a 4xx JSON error in OpenAI's shape naming the problem, while good
requests keep being answered next to them; no 5xx is ever counted in /metrics."""

from __future__ import annotations

import json
import threading
from typing import Any

import httpx
import pytest

from radixlm.runtime.constrained.regex_guard import MAX_DFA_STATES, check_regex_size, dfa_size
from radixlm.runtime.errors import GrammarError

HUGE = b'{"text": "' + b"x" * (9 * 1024 * 1024) + b'"}'  # over the default 8 MiB body limit
LONG_TEXT = "hello " * 5000  # ~5000 tokens: over the tiny model's 2048-token context
CHAT = [{"role": "user", "content": "hi"}]


def j(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def gen(**sp: Any) -> bytes:
    return j({"text": "hi", "sampling_params": sp})


def chat(**fields: Any) -> bytes:
    return j({"model": "m", "messages": CHAT, "max_tokens": 4, **fields})


def comp(**fields: Any) -> bytes:
    return j({"model": "m", "prompt": "hi", "max_tokens": 4, **fields})


G, C, CH = "/generate", "/v1/completions", "/v1/chat/completions"
# (method, path, raw body, status, param (None: not checked), fragment of the message)
CASES: list[tuple[str, str, bytes, int, str | None, str]] = [
    # ---- broken JSON, wrong shapes ----
    ("POST", G, b'{"text": "hi"', 400, None, "invalid JSON"),
    ("POST", C, b'{"prompt": ', 400, None, "invalid JSON"),
    ("POST", CH, b"not json", 400, None, "invalid JSON"),
    ("POST", "/abort_request", b"{", 400, None, "invalid JSON"),
    ("POST", G, b"", 400, None, "empty"),
    ("POST", CH, b"", 400, None, "empty"),
    ("POST", CH, b"[]", 400, None, "JSON object"),
    ("POST", G, b'"just a string"', 400, None, "JSON object"),
    ("POST", G, b"null", 400, None, "JSON object"),
    ("POST", G, b'{"text": "hi",}', 400, None, "invalid JSON"),
    # ---- wrong types (no coercion) ----
    ("POST", G, j({"text": 5}), 400, "text", "string"),
    ("POST", G, j({"input_ids": "abc"}), 400, "input_ids", ""),
    ("POST", G, j({"input_ids": [1.5]}), 400, "input_ids.0", "integer"),
    ("POST", G, j({"text": "hi", "sampling_params": "hot"}), 400, "sampling_params", ""),
    ("POST", G, gen(temperature="0.5"), 400, "temperature", "temperature"),
    ("POST", G, gen(max_new_tokens=1.5), 400, "max_new_tokens", "integer"),
    ("POST", G, gen(ignore_eos="yes"), 400, "ignore_eos", "boolean"),
    ("POST", G, j({"text": "hi", "stream": 1}), 400, "stream", "bool"),
    ("POST", G, j({"text": "hi", "return_logprob": "true"}), 400, "return_logprob", "bool"),
    ("POST", G, j({"text": "hi", "rid": 5}), 400, "rid", ""),
    ("POST", C, j({"model": "m", "prompt": 5}), 400, "prompt", ""),
    ("POST", C, comp(max_tokens="10"), 400, "max_tokens", "integer"),
    ("POST", CH, j({"model": "m", "messages": "hi"}), 400, "messages", ""),
    ("POST", CH, j({"model": "m", "messages": [{"role": "wizard", "content": "x"}]}), 400,
     "messages.0.role", ""),
    ("POST", CH, j({"model": "m", "messages": []}), 400, "messages", ""),
    ("POST", CH, j({"model": "m", "messages": [{"content": "x"}]}), 400, "messages.0.role",
     "required"),
    ("POST", CH, chat(temperature="hot"), 400, "temperature", ""),
    ("POST", CH, chat(stop=5), 400, "stop", ""),
    ("POST", "/abort_request", j({"rid": 5}), 400, "rid", "string"),
    # ---- negative, huge, out of range ----
    ("POST", G, gen(max_new_tokens=-1), 400, "max_new_tokens", ">= 0"),
    ("POST", G, gen(max_new_tokens=10**12), 400, "max_new_tokens", "limit"),
    ("POST", G, gen(max_new_tokens=10**30), 400, "max_new_tokens", ""),
    ("POST", G, gen(temperature=-1), 400, "temperature", "temperature"),
    ("POST", G, gen(top_p=1.5), 400, "top_p", "top_p"),
    ("POST", G, gen(top_k=0), 400, "top_k", "top_k"),
    ("POST", G, gen(min_p=-0.1), 400, "min_p", "min_p"),
    ("POST", G, gen(frequency_penalty=1e9), 400, "frequency_penalty", "frequency_penalty"),
    ("POST", G, gen(repetition_penalty=0), 400, "repetition_penalty", "repetition_penalty"),
    ("POST", G, gen(min_new_tokens=10, max_new_tokens=2), 400, "min_new_tokens", "min_new_tokens"),
    ("POST", G, gen(logit_bias={"abc": 1}), 400, "logit_bias", "logit_bias"),
    ("POST", G, gen(logit_bias={"999999999": 1}), 400, "logit_bias", "logit_bias"),
    ("POST", G, gen(stop_token_ids=[-3]), 400, "stop_token_ids", "stop_token_ids"),
    ("POST", G, j({"input_ids": [-1]}), 400, "input_ids", "within"),
    ("POST", G, j({"input_ids": [10**9]}), 400, "input_ids", "within"),
    ("POST", G, j({"text": "hi", "top_logprobs_num": 1000, "return_logprob": True}), 400,
     "top_logprobs_num", "top_logprobs_num"),
    ("POST", CH, chat(max_tokens=-5), 400, "max_tokens", "max_tokens"),
    ("POST", CH, chat(logprobs=True, top_logprobs=1000), 400, "top_logprobs", "top_logprobs"),
    ("POST", C, comp(logprobs=1000), 400, "logprobs", "logprobs"),
    ("POST", C, comp(temperature=-2), 400, "temperature", "temperature"),
    # ---- NaN and infinities (Python's JSON extension) ----
    ("POST", G, b'{"text": "hi", "sampling_params": {"temperature": NaN}}', 400, "temperature",
     "finite"),
    ("POST", G, b'{"text": "hi", "sampling_params": {"top_p": Infinity}}', 400, "top_p", ""),
    ("POST", CH, b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], '
     b'"temperature": NaN}', 400, "temperature", ""),
    ("POST", C, b'{"model": "m", "prompt": "hi", "top_p": -Infinity}', 400, "top_p", ""),
    # ---- empty prompts ----
    ("POST", G, j({"text": ""}), 400, "text", "empty"),
    ("POST", G, j({"input_ids": []}), 400, "input_ids", "empty"),
    ("POST", G, j({"text": []}), 400, None, "empty"),
    ("POST", C, j({"model": "m", "prompt": ""}), 400, "prompt", "empty"),
    ("POST", C, j({"model": "m", "prompt": []}), 400, "prompt", "empty"),
    # ---- unknown or unsupported fields ----
    ("POST", G, j({"text": "hi", "foo": 1}), 400, "foo", "unknown field"),
    ("POST", G, gen(bogus=1), 400, "bogus", "unknown sampling"),
    ("POST", G, gen(max_tokens=4), 400, "max_tokens", "max_new_tokens"),
    ("POST", CH, chat(frobnicate=True), 400, "frobnicate", "unknown field"),
    ("POST", CH, chat(tools=[{"type": "function"}]), 400, "tools", "tools"),
    ("POST", C, comp(suffix="x"), 400, "suffix", "suffix"),
    ("POST", G, j({"text": "hi", "image_data": "x.png"}), 400, "image_data", "not supported"),
    ("POST", "/abort_request", j({"foo": 1}), 400, "foo", "unknown field"),
    ("POST", "/flush_cache", j({"bogus": True}), 400, "bogus", "unknown field"),
    # ---- huge bodies, over-long prompts ----
    ("POST", G, HUGE, 413, None, "max_request_body_bytes"),
    ("POST", G, j({"text": LONG_TEXT}), 400, "text", "context length"),
    ("POST", CH, j({"model": "m", "messages": [{"role": "user", "content": LONG_TEXT}]}), 400,
     "messages", "context length"),
    # ---- invalid UTF-8, lone surrogates ----
    ("POST", G, b'{"text": "\xff\xfe bad"}', 400, None, "invalid unicode"),
    ("POST", CH, b'{"model": "m", "messages": [{"role": "user", "content": "\xc3\x28"}]}', 400,
     None, "invalid unicode"),
    ("POST", G, b'{"text": "lone \\ud800 surrogate"}', 400, None, "invalid JSON"),
    # ---- invalid regexes and schemas, conflicting constraints ----
    ("POST", G, gen(regex="("), 400, "regex", "regex"),
    ("POST", G, gen(regex="[z-a]"), 400, "regex", "regex"),
    ("POST", G, gen(regex="(?=look)ahead"), 400, "regex", "look-around"),
    ("POST", G, gen(regex="(a)\\1"), 400, "regex", "back-references"),
    ("POST", G, gen(json_schema="{not json"), 400, "json_schema", "json_schema"),
    ("POST", G, gen(json_schema=json.dumps({"type": "nonsense"})), 400, "json_schema", ""),
    ("POST", G, gen(regex="a", json_schema="{}"), 400, None, "one of"),
    ("POST", G, gen(choices=[]), 400, "choices", "choices"),
    ("POST", C, comp(regex="(unclosed"), 400, "regex", "regex"),
    ("POST", CH, chat(response_format={"type": "json_schema", "json_schema": {"name": "x",
     "schema": {"type": 5}}}), 400, None, "schema"),
    ("POST", CH, chat(response_format={"type": "yaml"}), 400, "response_format.type", ""),
    ("POST", G, gen(regex="x" * 200_000), 400, "regex", "longer than"),
    # ---- stop lists, n, logprob_start_len ----
    ("POST", G, gen(stop=[f"s{i}" for i in range(5000)]), 400, "stop", "at most"),
    ("POST", G, gen(stop=["x" * 10_000]), 400, "stop", "at most"),
    ("POST", CH, chat(stop=[f"s{i}" for i in range(5000)]), 400, "stop", "at most"),
    ("POST", G, gen(n=129), 400, "n", "n must"),
    ("POST", G, gen(n=10**6), 400, "n", "n must"),
    ("POST", CH, chat(n=10_000), 400, "n", "n"),
    ("POST", C, comp(n=0), 400, "n", "n"),
    ("POST", G, j({"text": "hi", "return_logprob": True, "logprob_start_len": 1000}), 400,
     "logprob_start_len", "logprob_start_len"),
    ("POST", G, j({"text": "hi", "return_logprob": True, "logprob_start_len": -5}), 400,
     "logprob_start_len", "logprob_start_len"),
    # ---- batches ----
    ("POST", G, j({"text": ["a", "b"], "sampling_params": [{}]}), 400, "sampling_params",
     "expected 2"),
    ("POST", G, j({"text": ["a", "b"], "rid": ["same", "same"]}), 400, "rid", "duplicate"),
    # ---- routes and methods ----
    ("GET", "/nope", b"", 404, None, "no such endpoint"),
    ("DELETE", G, b"", 405, None, ""),
    ("GET", "/v1/models/nope", b"", 404, "model", "does not exist"),
    ("POST", "/abort_request", j({}), 400, "rid", "rid"),
    ("PUT", CH, chat(), 405, None, ""),
]  # fmt: skip


@pytest.fixture(scope="module")
def server(tiny_server):
    return tiny_server


# The outlines backend builds the whole token automaton up front: patterns whose automaton
# explodes are refused by size (regex_guard). llguidance (the default) builds its lexer lazily
# and takes them.
OUTLINES_CASES = [
    ("POST", G, gen(regex="(a|b)*a(a|b){40}"), 400, "regex", "more than 2000 states"),
    ("POST", G, gen(regex="[a-z]{1000000}"), 400, "regex", "character positions"),
    ("POST", CH, chat(regex="((a|b)*a(a|b){20}){2}"), 400, "regex", "too complex"),
    ("POST", G, gen(json_schema=json.dumps({"type": "object", "properties": {"c": {"type": "string",
     "pattern": "(a|b)*a(a|b){40}"}}})), 400, "json_schema", "more than 2000 states"),
    ("POST", G, gen(regex="(?=look)ahead"), 400, "regex", "look-around"),
]  # fmt: skip


@pytest.fixture(scope="module")
def outlines_server(start_server, tiny_model_args):
    return start_server(*tiny_model_args, "--grammar-backend", "outlines")


@pytest.mark.parametrize(("method", "path", "body", "status", "param", "fragment"),
                         OUTLINES_CASES, ids=[f"{i}-{c[1]}" for i, c in enumerate(OUTLINES_CASES)])  # fmt: skip
def test_outlines_refuses_exploding_automata(outlines_server, method, path, body, status, param,
                                             fragment):  # fmt: skip
    test_bad_request_gets_a_4xx_naming_the_problem(outlines_server, method, path, body, status,
                                                   param, fragment)  # fmt: skip


def test_the_table_is_large_and_covers_every_endpoint():
    assert len(CASES) >= 50
    assert {G, C, CH, "/abort_request", "/flush_cache"} <= {path for _, path, *_ in CASES}


@pytest.mark.parametrize(("method", "path", "body", "status", "param", "fragment"), CASES,
                         ids=[f"{i}-{c[1]}" for i, c in enumerate(CASES)])  # fmt: skip
def test_bad_request_gets_a_4xx_naming_the_problem(server, method, path, body, status, param,
                                                   fragment):  # fmt: skip
    resp = server.client.request(method, path, content=body,
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    assert resp.status_code == status, resp.text[:500]
    assert resp.headers["content-type"].startswith("application/json")
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    if param is not None:
        assert err["param"] == param, err
    assert fragment.lower() in err["message"].lower(), err


def test_server_keeps_answering_during_bad_input(server, metric_value):
    """Every malformed request of the table, fired from four threads, while good requests run
    next to them: the good ones all succeed, and no 5xx is ever counted."""
    before = server.client.get("/metrics").text
    good: list[int] = []
    wrong: list[tuple] = []
    stop = threading.Event()

    def good_requests() -> None:
        while not stop.is_set():
            body = {"text": "Hello", "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
            good.append(server.client.post(G, json=body).status_code)

    def bad_requests(cases: list) -> None:
        with httpx.Client(base_url=server.base_url, timeout=120) as client:
            for method, path, body, status, _, _ in cases:
                resp = client.request(method, path, content=body)
                if resp.status_code != status:
                    wrong.append((path, body[:200], resp.status_code, resp.text[:300]))

    runner = threading.Thread(target=good_requests)
    runner.start()
    workers = [threading.Thread(target=bad_requests, args=(CASES[i::4],)) for i in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(300)
    stop.set()
    runner.join(60)
    assert not wrong, wrong
    assert good and set(good) == {200}, good
    after = server.client.get("/metrics").text
    for status in ("500", "502", "503", "504"):
        count = "radixlm:rejected_requests_total"
        assert metric_value(after, count, status=status) == metric_value(
            before, count, status=status
        )
    assert (
        metric_value(after, count, status="400") - metric_value(before, count, status="400") >= 80
    )


@pytest.mark.parametrize(
    "pattern",
    [r"[0-9]{3}-[0-9]{4}", r"(yes|no)", r".{0,500}", r"\w+@\w+\.com", r"(\d{1,3}\.){3}\d{1,3}",
     r"[^\"\\]{0,200}", r"\{\"name\": \"[A-Za-z ]{1,20}\", \"age\": [0-9]{1,3}\}",
     r"(x+x+)+y", r"((a|b)*a(a|b){5}){3}", "(" + "|".join(f"word{i}" for i in range(300)) + ")"],
)  # fmt: skip
def test_regex_guard_admits_ordinary_patterns(pattern):
    """No false alarm: everyday patterns (and ones that only backtracking engines fear) pass."""
    check_regex_size(pattern)
    assert dfa_size(pattern) < MAX_DFA_STATES


@pytest.mark.parametrize(
    ("pattern", "why"),
    [("(a|b)*a(a|b){20}", "states"), ("[a-z]{20000}", "positions"), ("[ab]{0,6000}", "states")],
)
def test_regex_guard_rejects_explosive_patterns(pattern, why):
    with pytest.raises(GrammarError, match=why) as info:
        check_regex_size(pattern)
    assert info.value.field == "regex"
