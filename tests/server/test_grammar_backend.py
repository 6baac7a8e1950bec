"""The default grammar backend (llguidance) over real HTTP on the shared `main_server`: `ebnf` in
/generate, OpenAI `response_format` `{"type": "grammar"}` and a recursive `json_schema` through
the real `openai` client, `gen(ebnf=...)` in the language (RuntimeEndpoint), and bad grammars as
400s naming the problem while the server keeps serving. Outputs are sampled at temperature 0.8
over 8 seeds and checked with the `lark` oracle / json.loads + jsonschema. A server started with
`--grammar-backend outlines` refuses ebnf by name; an unknown backend fails before any child
process starts."""

from __future__ import annotations

import json
import re

import pytest
from constrained.corpus import TREE

from radixlm.bench.grammar_corpus import GRAMMARS
from server_process import ServerProcess

SEEDS = range(8)
ARITH = next(c for c in GRAMMARS if c.name == "arithmetic_gbnf")
LISP = next(c for c in GRAMMARS if c.name == "lisp")


@pytest.fixture(scope="module")
def llg_server(main_server):
    """llguidance is the default grammar backend: the session's shared server."""
    return main_server


def chat(question: str) -> str:
    return f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


def test_generate_with_ebnf(llg_server):
    body = {
        "text": [chat(ARITH.question)] * len(SEEDS),
        "sampling_params": [
            {"ebnf": ARITH.text, "temperature": 0.8, "seed": s, "max_new_tokens": 48} for s in SEEDS
        ],
    }
    outs = llg_server.client.post("/generate", json=body).json()
    done = [o["text"] for o in outs if o["meta_info"]["finish_reason"]["type"] == "stop"]
    assert done
    for text in done:
        assert ARITH.parses(text), text


def test_openai_response_format_grammar_and_recursive_schema(llg_server):
    import jsonschema
    import openai

    client = openai.OpenAI(
        base_url=llg_server.base_url + "/v1", api_key=llg_server.api_key or "x", max_retries=0
    )
    model = client.models.list().data[0].id
    parsed = []
    for seed in SEEDS:
        out = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": LISP.question}],
            response_format={"type": "grammar", "grammar": LISP.text},  # type: ignore[arg-type]
            temperature=0.8,
            seed=seed,
            max_tokens=48,
        )
        if out.choices[0].finish_reason == "stop":
            assert LISP.parses(out.choices[0].message.content), out.choices[0].message.content
            parsed.append(out.choices[0].message.content)
    # the check above ran on most answers (8 of 8 stopped when written; the rest hit max_tokens)
    assert len(parsed) >= 6, parsed
    finished = 0
    for seed in SEEDS:
        out = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Describe a small family tree as JSON."}],
            response_format={"type": "json_schema", "json_schema": {"name": "t", "schema": TREE}},
            temperature=0.8,
            seed=seed,
            max_tokens=160,
        )
        if out.choices[0].finish_reason == "stop":
            jsonschema.validate(json.loads(out.choices[0].message.content), TREE)
            finished += 1
    assert finished >= 1


def test_language_gen_ebnf(llg_server):
    import radixlm.interpreter.api as rl
    from radixlm.interpreter.runtime_endpoint import RuntimeEndpoint

    @rl.function
    def expr(s):
        s += rl.user(ARITH.question)
        s += rl.assistant(rl.gen("e", max_tokens=48, ebnf=ARITH.text))

    backend = RuntimeEndpoint(llg_server.base_url, api_key=llg_server.api_key)
    try:
        states = expr.run_batch([{} for _ in SEEDS], backend=backend, temperature=0.8)
        done = 0
        for state in states:
            assert state.error() is None
            if state.get_meta_info("e")["finish_reason"]["type"] == "stop":
                assert ARITH.parses(state["e"]), state["e"]
                done += 1
        assert done >= 1
    finally:
        backend.shutdown()


def test_bad_grammar_is_a_400_and_the_server_keeps_serving(llg_server):
    for params, needle in [
        ({"ebnf": "root ::= missing"}, "invalid ebnf grammar"),
        ({"json_schema": json.dumps({"type": "array", "uniqueItems": True})}, "/uniqueItems"),
    ]:
        res = llg_server.client.post("/generate", json={"text": "hi", "sampling_params": params})
        assert res.status_code == 400 and needle in res.json()["error"]["message"], res.text
    res = llg_server.client.post(
        "/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": "hi"}],
            "response_format": {"type": "grammar"},
        },
    )
    assert res.status_code == 400 and "grammar" in res.text
    ok = llg_server.client.post(
        "/generate", json={"text": "hi", "sampling_params": {"regex": "[a-z]{3}"}}
    ).json()
    assert len(ok["text"]) == 3


def test_outlines_server_rejects_ebnf_by_name():
    server = ServerProcess("--grammar-backend", "outlines")
    try:
        server.wait_ready()
        res = server.client.post(
            "/generate", json={"text": "hi", "sampling_params": {"ebnf": ARITH.text}}
        )
        assert res.status_code == 400
        assert "not supported by the outlines grammar backend" in res.json()["error"]["message"]
        # NOTE: the same regex the llguidance server decodes above, on the outlines backend
        res = server.client.post(
            "/generate",
            json={
                "text": ["hi"] * len(SEEDS),
                "sampling_params": [
                    {"regex": "[a-z]{3}", "temperature": 0.8, "seed": s} for s in SEEDS
                ],
            },
        )
        assert all(re.fullmatch("[a-z]{3}", o["text"]) for o in res.json()), res.text
    finally:
        server.close()


def test_unknown_backend_fails_before_start():
    from radixlm.runtime.errors import InvalidRequestError
    from radixlm.runtime.server_args import ServerArgs

    with pytest.raises(InvalidRequestError, match="grammar_backend must be one of"):
        ServerArgs(grammar_backend="guidance-ai")
