"""The fixed request bounds of docs/reliability.md at their boundaries, on the tiny-model server:
the documented maximum is served, one more is a 400 naming the field; and the bad-input table's
size is the number the docs state."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs" / "reliability.md"
CHAT = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server(tiny_server):
    return tiny_server


def _gen(**sp):
    return {"text": "Hi", "sampling_params": {"max_new_tokens": 1, **sp}}


# (path, body at the limit, body over it, the field named)
BOUNDS = {
    "n": ("/generate", _gen(n=128), _gen(n=129), "n"),
    "stop": (
        "/generate",
        _gen(stop=[f"{i:04d}" + "x" * 2044 for i in range(256)]),
        _gen(stop=[f"s{i}" for i in range(257)]),
        "stop",
    ),
    "stop_length": ("/generate", _gen(stop=["x" * 2048]), _gen(stop=["x" * 2049]), "stop"),
    "stop_token_ids": (
        "/generate",
        _gen(stop_token_ids=list(range(3, 259))),
        _gen(stop_token_ids=list(range(3, 260))),
        "stop_token_ids",
    ),
    "top_logprobs_num": (
        "/generate",
        {**_gen(), "return_logprob": True, "top_logprobs_num": 64},
        {**_gen(), "return_logprob": True, "top_logprobs_num": 65},
        "top_logprobs_num",
    ),
    "chat_top_logprobs": (
        "/v1/chat/completions",
        {"model": "m", "messages": CHAT, "max_tokens": 1, "logprobs": True, "top_logprobs": 20},
        {"model": "m", "messages": CHAT, "max_tokens": 1, "logprobs": True, "top_logprobs": 21},
        "top_logprobs",
    ),
    "choices": (
        "/generate",
        _gen(choices=[f"c{i}" for i in range(4096)]),
        _gen(choices=[f"c{i}" for i in range(4097)]),
        "choices",
    ),
}


@pytest.mark.parametrize("name", list(BOUNDS))
def test_documented_bound_is_served_and_one_more_is_refused(server, name):
    path, at_limit, over, field = BOUNDS[name]
    ok = server.client.post(path, json=at_limit)
    assert ok.status_code == 200, ok.text[:500]
    if name == "n":
        assert len(ok.json()) == 128
    refused = server.client.post(path, json=over)
    assert refused.status_code == 400, refused.text[:500]
    err = refused.json()["error"]
    assert err["param"] == field or field in err["message"], err


def test_the_docs_state_the_bad_input_tables_size():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "bad_input_table", Path(__file__).with_name("test_bad_input.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = DOCS.read_text()
    stated = [int(n) for n in re.findall(r"(\d+) malformed requests|bad input \| (\d+) cases", text)
              for n in n if n]  # fmt: skip
    assert stated and set(stated) == {len(module.CASES)}, (stated, len(module.CASES))
