"""Fast unit tests of the server's pure parts (no engine): batch expansion, error formatting,
OpenAI formatting and streaming conversion, JSON encoding, the CLI parser."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from radixlm.runtime.errors import InvalidRequestError, QueueFullError, RequestTimeoutError
from radixlm.runtime.frontend.request_batch import expand_request, group_results
from radixlm.runtime.server import openai_format as fmt
from radixlm.runtime.server.errors import to_api_error
from radixlm.runtime.server.http_utils import dumps
from radixlm.runtime.server.launch_server import build_parser
from radixlm.runtime.server.openai_protocol import ChatCompletionRequest, CompletionRequest
from radixlm.runtime.server.openai_serving import completion_batch, sampling_params
from radixlm.runtime.server.protocol import GenerateRequest
from radixlm.runtime.server_args import ServerArgs


def test_expand_request_shapes():
    single = expand_request("hi", {"max_new_tokens": 3})
    assert single.is_single and len(single.flat) == 1 and not single.batched
    n3 = expand_request("hi", {"n": 3, "seed": 10}, rid="r")
    assert [s.rid for s in n3.flat] == ["r-0", "r-1", "r-2"]
    assert [s.sampling_params["seed"] for s in n3.flat] == [10, 11, 12]
    assert not n3.is_single and "n" not in n3.flat[0].sampling_params
    batch = expand_request(
        input_ids=[[1, 2], [3]], sampling_params=[{"n": 2}, {}], return_logprob=[True, False]
    )
    assert [s.input_ids for s in batch.flat] == [[1, 2], [1, 2], [3]]
    assert [s.return_logprob for s in batch.flat] == [True, True, False]
    assert group_results(batch, ["a", "b", "c"]) == [["a", "b"], "c"]
    for kwargs, field in [
        ({"prompt": "a", "input_ids": [1]}, "input_ids"),
        ({}, "prompt"),
        ({"prompt": [], "sampling_params": {}}, "prompt"),
        ({"prompt": "a", "sampling_params": {"n": 500}}, "n"),
        ({"prompt": ["a", "b"], "sampling_params": [{}]}, "sampling_params"),
        ({"prompt": "a", "sampling_params": [{}]}, "sampling_params"),
    ]:
        with pytest.raises(InvalidRequestError) as err:
            expand_request(**kwargs)
        assert err.value.field == field, kwargs


def _validation_error(model, raw: bytes) -> ValidationError:
    with pytest.raises(ValidationError) as err:
        model.model_validate_json(raw)
    return err.value


def test_validation_errors_name_the_field():
    cases = [
        (GenerateRequest, b'{"text": 3}', "text", "text: Input should be a valid string"),
        (GenerateRequest, b'{"text": "a", "zzz": 1}', "zzz", "unknown field 'zzz'"),
        (GenerateRequest, b'{"text": "a"', None, "invalid JSON body"),
        (GenerateRequest, b'"text"', None, "must be a JSON object"),
        (GenerateRequest, b'{"text": "a", "return_logprob": "true"}', "return_logprob", "boolean"),
        (
            ChatCompletionRequest,
            b'{"messages": [{"role": "robot", "content": "x"}]}',
            "messages.0.role",
            "role",
        ),
        (ChatCompletionRequest, b"{}", "messages", "'messages' is required"),
        (
            CompletionRequest,
            b'{"prompt": "x", "response_format": {"type": "xml"}}',
            "response_format.type",
            "type",
        ),
        (CompletionRequest, b'{"prompt": [1.5]}', "prompt", "prompt"),
    ]
    for model, raw, param, fragment in cases:
        err = to_api_error(_validation_error(model, raw))
        assert err.status == 400 and err.param == param, (raw, err.param, err.message)
        assert fragment in err.message, (raw, err.message)


def test_error_mapping():
    assert (
        to_api_error(
            InvalidRequestError("bad", "max_new_tokens"), {"max_new_tokens": "max_tokens"}
        ).param
        == "max_tokens"
    )
    full = to_api_error(QueueFullError("full"))
    assert full.status == 429 and full.headers["Retry-After"] == "1"
    assert to_api_error(RequestTimeoutError("slow")).status == 504
    body = to_api_error(RuntimeError("boom")).body()["error"]
    assert body["type"] == "server_error" and set(body) == {"message", "type", "param", "code"}


def test_openai_sampling_params_mapping():
    req = ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "x"}], "temperature": 0.5, "stop": "\n", "min_tokens": 2,
         "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "object"}}}}
    )  # fmt: skip
    sp = sampling_params(req, 7)
    assert sp == {"max_new_tokens": 7, "temperature": 0.5, "stop": "\n", "min_new_tokens": 2,
                  "json_schema": '{"type": "object"}'}  # fmt: skip
    obj = sampling_params(ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}}), 1)  # fmt: skip
    assert json.loads(obj["json_schema"]) == {"type": "object"}
    batch = completion_batch(
        CompletionRequest.model_validate(
            {"prompt": [[1, 2], [3]], "n": 2, "logprobs": 1, "echo": True}
        )
    )
    assert (
        len(batch.flat) == 4
        and batch.flat[0].logprob_start_len == 0
        and batch.flat[0].top_logprobs_num == 1
    )


def _chunk(index: int, text: str, ids: list[int], reason: dict | None = None) -> dict:
    meta = {"finish_reason": reason, "prompt_tokens": 5, "completion_tokens": len(ids), "cached_tokens": 2,
            "output_token_logprobs": [(-0.5, t, "x") for t in ids], "output_top_logprobs": []}  # fmt: skip
    return {"text": text, "output_ids": ids, "meta_info": meta, "index": index}


def test_stream_converter_chat_deltas_and_usage():
    conv = fmt.StreamConverter(True, "m", n=2, total=2, include_usage=True, logprobs=True)
    out = conv.convert(_chunk(0, "He", [1]))
    assert out[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert out[1]["choices"][0]["delta"] == {"content": "He"} and out[1]["usage"] is None
    assert len(out[1]["choices"][0]["logprobs"]["content"]) == 1
    out = conv.convert(_chunk(0, "Hello", [1, 2], {"type": "length", "length": 2}))
    assert out[0]["choices"][0]["delta"] == {"content": "llo"}
    assert len(out[0]["choices"][0]["logprobs"]["content"]) == 1  # only the new token
    assert out[-1]["choices"][0]["finish_reason"] == "length"
    assert conv.tail() == []  # choice 1 has not finished
    conv.convert(_chunk(1, "Yo", [3], {"type": "stop", "matched": 2}))
    (tail,) = conv.tail()
    assert tail["choices"] == [] and tail["usage"]["prompt_tokens"] == 5  # one prompt, counted once
    assert tail["usage"]["completion_tokens"] == 3 and tail["usage"]["prompt_tokens_details"] == {
        "cached_tokens": 2
    }


def test_completion_response_echo_and_usage():
    results = [{"text": " b", "meta_info": {"finish_reason": {"type": "stop", "matched": "\n"},
               "prompt_tokens": 3, "completion_tokens": 1, "cached_tokens": 0}}] * 2  # fmt: skip
    resp = fmt.completion_response(results, n=2, model="m", echo=["a"], logprobs=False)
    assert [c["text"] for c in resp["choices"]] == ["a b", "a b"]
    assert (
        resp["choices"][0]["finish_reason"] == "stop" and resp["choices"][0]["matched_stop"] == "\n"
    )
    assert resp["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5,
                             "prompt_tokens_details": {"cached_tokens": 0}}  # fmt: skip


def test_dumps_is_strict_json():
    assert json.loads(dumps({"a": [float("-inf"), 1.0, float("nan")], "b": "é"})) == {
        "a": [None, 1.0, None],
        "b": "é",
    }


def test_cli_parser_flags():
    ns = build_parser().parse_args(
        ["--port", "8000", "--api-key", "k", "--no-log-requests", "--host", "0.0.0.0"]
    )
    args = ServerArgs.from_cli_args(ns)
    assert (args.port, args.api_key, args.log_requests, args.enable_metrics, args.host) == (
        8000,
        "k",
        False,
        True,
        "0.0.0.0",
    )
    assert ServerArgs.from_cli_args(build_parser().parse_args([])).host == "127.0.0.1"
