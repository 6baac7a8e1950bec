"""Property-based fuzzing of `POST /generate` and `POST /v1/chat/completions`, with bodies drawn
from the server's own OpenAPI schema (`/openapi.json`, turned into Hypothesis strategies here)
and then mutated (unknown fields, wrong-typed values, NaN, dropped fields, raw non-JSON bytes).

Property: the server never answers 5xx, every error is JSON in OpenAI's shape, every stream ends
with `data: [DONE]` and carries no server error, and afterwards nothing runs and the KV
accounting is exact. Bounded: a fixed number of examples, derandomized (the same examples in
every run), and token counts drawn small so that valid requests finish fast on the tiny model.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

MAX_EXAMPLES = 200
JSON_SCALARS = (
    st.none() | st.booleans() | st.integers(-(2**64), 2**64) | st.text(max_size=12)
    | st.sampled_from([math.nan, math.inf, -math.inf, 0.5, -1.0, 1e300])
)  # fmt: skip
ANY_JSON = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)  # fmt: skip
SMALL_TOKENS = st.integers(-2, 8)  # invalid negatives included; valid ones finish fast
REGEXES = st.sampled_from(["[0-9]{3}", "(yes|no)", "(", "[z-a]", "(a|b)*a(a|b){30}", "a{2,1}", ""])
SCHEMAS = st.sampled_from(
    ['{"type": "object"}', '{"type": "boolean"}', "{nope", '{"type": 7}', "[]"]
)
# Sampling parameters, keyed as SamplingParams names them (the schema says only "object").
SAMPLING_PARAMS = st.fixed_dictionaries(
    {"max_new_tokens": SMALL_TOKENS},
    optional={
        "temperature": st.floats(-1, 3) | st.sampled_from([math.nan, 0.0]),
        "top_p": st.floats(-0.5, 1.5), "top_k": st.integers(-2, 100), "min_p": st.floats(-1, 2),
        "n": st.integers(-1, 200), "seed": st.integers(-5, 2**70) | st.none(),
        "stop": st.lists(st.text(max_size=5), max_size=3) | st.text(max_size=5),
        "stop_token_ids": st.lists(st.integers(-5, 60000), max_size=3),
        "ignore_eos": st.booleans() | st.integers(0, 1), "min_new_tokens": SMALL_TOKENS,
        "frequency_penalty": st.floats(-3, 3), "repetition_penalty": st.floats(-1, 3),
        "regex": REGEXES, "json_schema": SCHEMAS,
        "choices": st.lists(st.text(max_size=6), max_size=3),
        "logit_bias": st.dictionaries(st.text(max_size=6), st.floats(-200, 200), max_size=2),
        "no_stop_trim": st.booleans(), "skip_special_tokens": st.booleans(),
        "bogus": ANY_JSON,
    },
)  # fmt: skip
# Per property name, wherever it appears: keep token counts small, constraints from a list.
OVERRIDES: dict[str, st.SearchStrategy] = {
    "sampling_params": SAMPLING_PARAMS | st.lists(SAMPLING_PARAMS, max_size=2) | ANY_JSON,
    "max_tokens": SMALL_TOKENS, "max_completion_tokens": SMALL_TOKENS | st.none(),
    "n": st.integers(-1, 200) | st.none(), "regex": REGEXES | st.none(),
    "json_schema": SCHEMAS | st.none(), "input_ids": st.lists(st.integers(-3, 60000), max_size=6)
    | st.lists(st.lists(st.integers(0, 49151), max_size=4), max_size=2),
}  # fmt: skip


# The "mostly valid" variant: only these top-level fields, sampling parameters in range.
VALID_SAMPLING = st.fixed_dictionaries(
    {"max_new_tokens": st.integers(0, 8)},
    optional={
        "temperature": st.floats(0, 2), "top_p": st.floats(0.05, 1), "top_k": st.integers(1, 50),
        "n": st.integers(1, 4), "seed": st.integers(0, 2**31), "ignore_eos": st.booleans(),
        "stop": st.lists(st.text(min_size=1, max_size=4), max_size=2),
        "regex": st.sampled_from(["[0-9]{3}", "(yes|no)", "[a-z ]{1,12}"]),
    },
)  # fmt: skip
CORE = {
    "/generate": {"sampling_params", "stream", "return_logprob"},
    "/v1/chat/completions": {"messages", "model", "max_tokens", "temperature", "top_p", "n",
                             "stream", "seed", "regex"},
}  # fmt: skip
CORE_OVERRIDES = {**OVERRIDES, "sampling_params": VALID_SAMPLING, "n": st.integers(1, 3),
                  "max_tokens": st.integers(1, 8), "text": st.text(min_size=1, max_size=30),
                  "temperature": st.floats(0, 2), "top_p": st.floats(0.05, 1),
                  "messages": st.lists(st.fixed_dictionaries({
                      "role": st.sampled_from(["system", "user", "assistant"]),
                      "content": st.text(min_size=1, max_size=30)}), min_size=1, max_size=3),
                  "regex": st.sampled_from(["[0-9]{3}", "(yes|no)"]) | st.none()}  # fmt: skip


def strategy(
    schema: dict[str, Any],
    defs: dict[str, Any],
    overrides: dict[str, st.SearchStrategy] = OVERRIDES,
    only: set[str] | None = None,
) -> st.SearchStrategy:
    """A Hypothesis strategy for the JSON values `schema` (OpenAPI 3.1 / JSON Schema, the subset
    pydantic emits) describes; `overrides` replace the strategy of properties by name, `only`
    keeps just these properties of the top-level object."""
    if "$ref" in schema:
        return strategy(defs[schema["$ref"].rsplit("/", 1)[-1]], defs, overrides, only)
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return st.one_of([strategy(s, defs, overrides) for s in schema[key]])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if "const" in schema:
        return st.just(schema["const"])
    kind = schema.get("type")
    if kind == "null":
        return st.none()
    if kind == "boolean":
        return st.booleans()
    if kind == "integer":
        return st.integers(-3, 300) | st.sampled_from([2**31, 2**63, -(2**40)])
    if kind == "number":
        return st.floats(-10, 10) | st.sampled_from([math.nan, math.inf, 1e308])
    if kind == "string":
        return st.text(max_size=30)
    if kind == "array":
        items = strategy(schema.get("items", {}), defs, overrides)
        return st.lists(items, min_size=schema.get("minItems", 0), max_size=3)
    if kind == "object" or "properties" in schema:
        props = schema.get("properties", {})
        if only is not None:
            props = {k: v for k, v in props.items() if k in only}
        required = set(schema.get("required", []))

        def field(name: str, sub: dict[str, Any]) -> st.SearchStrategy:
            return overrides[name] if name in overrides else strategy(sub, defs, overrides)

        if not props:
            return st.dictionaries(st.text(max_size=8), ANY_JSON, max_size=3)
        return st.fixed_dictionaries(
            {k: field(k, v) for k, v in props.items() if k in required},
            optional={k: field(k, v) for k, v in props.items() if k not in required},
        )
    return ANY_JSON  # `{}`: any value


def bounded(body: Any) -> Any:
    """Give a body without a token count a small one (the defaults, 128 tokens natively and up to
    the context length on chat, would make the run long, not the test stronger)."""
    if not isinstance(body, dict):
        return body
    if "messages" in body:
        if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
            body = {**body, "max_tokens": 4}
        return body
    params = body.get("sampling_params")
    if params is None:
        return {**body, "sampling_params": {"max_new_tokens": 4}}
    for sp in params if isinstance(params, list) else [params]:
        if isinstance(sp, dict):
            sp.setdefault("max_new_tokens", 4)
    return body


def mutated(body: st.SearchStrategy) -> st.SearchStrategy:
    """The schema's bodies, and mutants of them (as raw bytes)."""

    def dumps(value: Any) -> bytes:
        return json.dumps(bounded(value), allow_nan=True).encode()

    def add_unknown(b: dict[str, Any]) -> st.SearchStrategy:
        return st.builds(lambda k, v: {**b, f"x_{k}": v}, st.text(max_size=6), ANY_JSON)

    def retype(b: dict[str, Any]) -> st.SearchStrategy:
        if not b:
            return st.just(b)
        return st.builds(lambda k, v: {**b, k: v}, st.sampled_from(sorted(b)), ANY_JSON)

    def drop(b: dict[str, Any]) -> st.SearchStrategy:
        if not b:
            return st.just(b)
        return st.sampled_from(sorted(b)).map(lambda k: {x: y for x, y in b.items() if x != k})

    mutants = body.flatmap(lambda b: add_unknown(b) | retype(b) | drop(b))
    raw = st.binary(max_size=40) | body.map(lambda b: dumps(b)[: max(1, len(dumps(b)) // 2)])
    return body.map(dumps) | mutants.map(dumps) | raw


@pytest.fixture(scope="module")
def server(tiny_server):
    return tiny_server


@pytest.fixture(scope="module")
def bodies(server) -> dict[str, st.SearchStrategy]:
    spec = server.client.get("/openapi.json").json()
    defs = spec["components"]["schemas"]
    out = {}
    for path in ("/generate", "/v1/chat/completions"):
        ref = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        full = strategy(ref, defs)
        core = strategy(ref, defs, CORE_OVERRIDES, CORE[path])
        if path == "/generate":  # one prompt: text or input_ids (the schema cannot say "one of")
            prompt = st.text(min_size=1, max_size=30).map(lambda t: {"text": t}) | st.lists(
                st.integers(0, 49151), min_size=1, max_size=6
            ).map(lambda i: {"input_ids": i})
            core = st.builds(lambda p, b: {**p, **b}, prompt, core)
        out[path] = mutated(st.one_of(core, core, full))
    return out


@pytest.mark.parametrize("path", ["/generate", "/v1/chat/completions"])
def test_fuzz_from_openapi_schema_never_5xx(server, bodies, path, metric_value):
    seen: dict[int, int] = {}

    @settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(raw=bodies[path])
    def check(raw: bytes) -> None:
        status = send_and_check(server, path, raw)
        seen[status] = seen.get(status, 0) + 1

    before = server.client.get("/metrics").text
    check()
    after = server.client.get("/metrics").text
    assert len(seen) > 1 and 200 in seen and 400 in seen, seen  # both sides were exercised
    for status in ("500", "502", "503", "504"):
        grew = metric_value(after, "radixlm:rejected_requests_total", status=status)
        assert grew == metric_value(before, "radixlm:rejected_requests_total", status=status)
    print(f"\nFUZZ {path}: statuses {dict(sorted(seen.items()))}")


def send_and_check(server: Any, path: str, raw: bytes) -> int:
    headers = {"Content-Type": "application/json"}
    with server.client.stream("POST", path, content=raw, headers=headers) as resp:
        status = resp.status_code
        assert status < 500, (raw[:400], resp.read()[:400])
        if resp.headers.get("content-type", "").startswith("text/event-stream"):
            lines = [line for line in resp.iter_lines() if line]
            assert lines and lines[-1] == "data: [DONE]", (raw[:400], lines[-3:])
            for line in lines[:-1]:
                event = json.loads(line[len("data: ") :])
                if "error" in event:
                    assert event["error"]["type"] != "server_error", (raw[:400], event)
        else:
            body = json.loads(resp.read())
            if status >= 400:
                assert set(body["error"]) == {"message", "type", "param", "code"}, body
    return status
