"""SGLang 0.5.x's protocol, walked field by field from the pinned wheel's own definitions:
every `GenerateReqInput` field (sglang/srt/managers/io_struct.py) and every `SamplingParams`
argument (sglang/srt/sampling/sampling_params.py) is sent to one real `radixlm serve`, and is
either accepted (200) or rejected with a 400 whose `param` names it. The definitions are read
with `ast` (importing them would pull in SGLang's server), so a new wheel's new field fails here
until it is classified."""

from __future__ import annotations

import ast
import importlib.util
import os
import re
from typing import Any

import pytest

from radixlm.runtime.errors import InvalidRequestError
from radixlm.runtime.sampling.sampling_params import SamplingParams
from server_process import ServerProcess

# NOTE: a test extra: missing, it fails the tests, never skips them (issue 28.4).
assert importlib.util.find_spec("sglang"), (
    "SGLang's frontend: `./dev test` installs sglang==0.5.10.post1"
)

PROMPT = "The capital of France is"
BASE_SAMPLING = {"max_new_tokens": 2, "temperature": 0.0}

# GenerateReqInput field -> a non-default value a client could send.
GENERATE_VALUES: dict[str, Any] = {
    "text": "Hello",
    "input_ids": [1, 504, 3458],
    "input_embeds": [[0.0] * 8],
    "image_data": "image.png",
    "video_data": "video.mp4",
    "audio_data": "audio.wav",
    "sampling_params": {"max_new_tokens": 1},
    "return_logprob": True,
    "logprob_start_len": 0,
    "top_logprobs_num": 2,
    "token_ids_logprob": [1, 2],
    "return_text_in_logprobs": True,
    "stream": True,
    "log_metrics": False,
    "return_hidden_states": True,
    "return_routed_experts": True,
    "routed_experts_start_len": 1,
    "modalities": ["text"],
    "session_params": {"id": "s1"},
    "lora_path": "adapter",
    "lora_id": "adapter",
    "custom_logit_processor": "processor",
    "bootstrap_host": "127.0.0.1",
    "bootstrap_port": 8998,
    "bootstrap_room": 1,
    "bootstrap_pair_key": "pair",
    "decode_tp_size": 1,
    "require_reasoning": True,
    "routed_dp_rank": 0,
    "disagg_prefill_dp_rank": 0,
    "data_parallel_rank": 1,  # 0 (the only rank) is accepted
    "background": True,
    "conversation_id": "conv-1",
    "priority": 1,
    "extra_key": "tenant-a",
    "routing_key": "key",
    "no_logs": True,
    "custom_labels": {"team": "a"},
    "return_bytes": True,
    "return_entropy": True,
    "external_trace_header": {"traceparent": "00-1-2-01"},
    "received_time": 1.0,
    "need_wait_for_mm_inputs": False,
    "num_items_assigned": {},
    "max_dynamic_patch": 4,
    "min_dynamic_patch": 1,
    "image_max_dynamic_patch": 4,
    "video_max_dynamic_patch": 4,
    "rid": "walk-rid",
    "http_worker_ipc": "ipc:///tmp/worker",
}
GENERATE_REJECTED = {
    "input_embeds", "image_data", "video_data", "audio_data", "token_ids_logprob",
    "return_hidden_states", "return_routed_experts", "routed_experts_start_len", "session_params",
    "lora_path", "lora_id", "custom_logit_processor", "bootstrap_host", "bootstrap_port",
    "bootstrap_room", "bootstrap_pair_key", "require_reasoning", "data_parallel_rank",
    "background", "extra_key", "return_bytes", "return_entropy", "max_dynamic_patch",
    "min_dynamic_patch", "image_max_dynamic_patch", "video_max_dynamic_patch",
}  # fmt: skip

# SamplingParams argument -> a non-default value.
SAMPLING_VALUES: dict[str, Any] = {
    "max_new_tokens": 3,
    "stop": "\n",
    "stop_token_ids": [2],
    "stop_regex": r"\d",
    "temperature": 0.5,
    "top_p": 0.9,
    "top_k": 5,
    "min_p": 0.1,
    "frequency_penalty": 0.5,
    "presence_penalty": 0.5,
    "repetition_penalty": 1.1,
    "min_new_tokens": 1,
    "n": 2,
    "json_schema": '{"type": "string", "maxLength": 3}',
    "regex": "[ab]{1,3}",
    "ebnf": 'root ::= "a" | "b"',
    "structural_tag": '{"structures": [], "triggers": []}',
    "ignore_eos": True,
    "skip_special_tokens": False,
    "spaces_between_special_tokens": False,
    "no_stop_trim": True,
    "custom_params": {"scale": 1},
    "stream_interval": 2,
    "logit_bias": {"1": 1.0},
    "sampling_seed": 7,
}
# ebnf is served by the default llguidance grammar backend (the outlines one rejects it by name:
# tests/server/test_grammar_backend.py).
SAMPLING_REJECTED = {"structural_tag", "custom_params", "stream_interval"}


def _wheel_file(*parts: str) -> str:
    spec = importlib.util.find_spec("sglang")
    assert spec is not None and spec.submodule_search_locations
    return os.path.join(spec.submodule_search_locations[0], *parts)


def _class(path: str, name: str) -> ast.ClassDef:
    with open(path) as f:
        tree = ast.parse(f.read())
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)


def generate_fields() -> list[str]:
    """GenerateReqInput's dataclass fields, its base class's first (rid, http_worker_ipc)."""
    path = _wheel_file("srt", "managers", "io_struct.py")
    names: list[str] = []
    for cls in (_class(path, "BaseReq"), _class(path, "GenerateReqInput")):
        names += [s.target.id for s in cls.body if isinstance(s, ast.AnnAssign)]  # type: ignore[union-attr]
    return names


def sampling_fields() -> list[str]:
    cls = _class(_wheel_file("srt", "sampling", "sampling_params.py"), "SamplingParams")
    init = next(s for s in cls.body if isinstance(s, ast.FunctionDef) and s.name == "__init__")
    return [a.arg for a in init.args.args[1:]]


def _post(server: ServerProcess, body: dict[str, Any]) -> Any:
    return server.client.post("/generate", json=body)


def _assert_answer(resp: Any, name: str, rejected: bool) -> None:
    if rejected:
        assert resp.status_code == 400, (name, resp.status_code, resp.text)
        err = resp.json()["error"]
        assert err["param"] == name and name in err["message"], (name, err)
    else:
        assert resp.status_code == 200, (name, resp.status_code, resp.text)


def test_every_generate_field_is_accepted_or_rejected_by_name(compat_server: ServerProcess) -> None:
    fields = generate_fields()
    assert len(fields) > 40, fields
    unknown = sorted(set(fields) - set(GENERATE_VALUES))
    assert not unknown, f"SGLang fields not classified here: {unknown}"
    for name in fields:
        body: dict[str, Any] = {"text": PROMPT, "sampling_params": dict(BASE_SAMPLING)}
        if name == "input_ids":
            body.pop("text")
        body[name] = GENERATE_VALUES[name]
        if name == "logprob_start_len":
            body["return_logprob"] = True
        _assert_answer(_post(compat_server, body), name, name in GENERATE_REJECTED)
        # SGLang's default (what its clients send unset) is always accepted.
        if name not in ("text", "input_ids", "sampling_params", "stream"):
            body.pop(name)
            assert _post(compat_server, body).status_code == 200, name
    compat_server.wait_idle_and_check_kv()


def test_every_sampling_param_is_accepted_or_rejected_by_name(compat_server: ServerProcess) -> None:
    fields = sampling_fields()
    assert "stop_regex" in fields and "no_stop_trim" in fields, fields
    unknown = sorted(set(fields) - set(SAMPLING_VALUES))
    assert not unknown, f"SGLang sampling parameters not classified here: {unknown}"
    for name in fields:
        sampling = {**BASE_SAMPLING, name: SAMPLING_VALUES[name]}
        resp = _post(compat_server, {"text": PROMPT, "sampling_params": sampling})
        _assert_answer(resp, name, name in SAMPLING_REJECTED)
        # null means "default" in SGLang's JSON API: accepted for every parameter.
        resp = _post(
            compat_server, {"text": PROMPT, "sampling_params": {**BASE_SAMPLING, name: None}}
        )
        assert resp.status_code == 200, (name, resp.text)
    compat_server.wait_idle_and_check_kv()


@pytest.mark.parametrize(
    ("value", "message"),
    [(7, "stop_regex must be"), (["("], "invalid regex"), ([""], "stop_regex must be")],
)
def test_stop_regex_validation(value: Any, message: str) -> None:
    with pytest.raises(InvalidRequestError, match=re.escape(message)):
        SamplingParams.from_dict({"stop_regex": value})


@pytest.mark.parametrize("no_stop_trim", [False, True])
def test_stop_regex_stops_generation(compat_server: ServerProcess, no_stop_trim: bool) -> None:
    """Sampled at temperature 0.9 over 8 seeds: a request that stops on `[0-9]` never returns a
    digit (the text is cut where the match begins), or ends with exactly its match (no_stop_trim)."""
    pattern = r"[0-9]+[.,]"
    stopped = 0
    for seed in range(8):
        sampling = {"max_new_tokens": 24, "temperature": 0.9, "sampling_seed": seed,
                    "stop_regex": pattern, "no_stop_trim": no_stop_trim}  # fmt: skip
        resp = _post(
            compat_server, {"text": "Count with me: 1, 2, 3, 4,", "sampling_params": sampling}
        )
        assert resp.status_code == 200, resp.text
        out = resp.json()
        reason = out["meta_info"]["finish_reason"]
        text = out["text"]
        if reason["type"] == "stop":
            stopped += 1
            assert re.fullmatch(pattern, reason["matched"]), reason
            if no_stop_trim:
                assert text.endswith(reason["matched"]), (text, reason)
                assert re.search(pattern, text[: -len(reason["matched"])]) is None, text
            else:
                assert re.search(pattern, text) is None, text
        else:
            assert reason["type"] == "length" and re.search(pattern, text) is None, (text, reason)
    assert stopped >= 4, stopped  # counting prompts: most runs hit a number
    compat_server.wait_idle_and_check_kv()


def test_endpoints_old_and_new_names(compat_server: ServerProcess) -> None:
    c = compat_server.client
    for new, old in (("/server_info", "/get_server_info"), ("/model_info", "/get_model_info")):
        a, b = c.get(new), c.get(old)
        assert a.status_code == b.status_code == 200
        assert set(a.json()) == set(b.json())
    assert c.get("/server_info").json()["model_name"]
    ok = c.post("/concate_and_append_request", json={"src_rids": ["a", "b"], "dst_rid": "c"})
    assert ok.status_code == 200 and ok.json()["mode"] == "text"
    bad = c.post("/concate_and_append_request", json={"src_rids": "a", "dst_rid": "c"})
    assert bad.status_code == 400 and "src_rids" in bad.text
    for path in ("/start_profile", "/stop_profile", "/encode", "/v1/embeddings"):
        resp = c.post(path, json={})
        assert resp.status_code == 400, path
        assert "not supported" in resp.json()["error"]["message"], path
    assert c.get("/health_generate").status_code == 200
    assert c.post("/flush_cache").status_code == 200


def test_logprob_fields_in_sglang_shapes(compat_server: ServerProcess) -> None:
    """SGLang's meta_info logprobs: `[logprob, token_id, text]` per token (`text` null unless
    return_text_in_logprobs; the prompt's first token has a null logprob), and per position a
    list of such triples for the top-k (null for that first prompt position)."""
    sampling = {"max_new_tokens": 3, "temperature": 0.0}
    body = {"text": PROMPT, "sampling_params": sampling, "return_logprob": True,
            "logprob_start_len": 0, "top_logprobs_num": 2, "return_text_in_logprobs": True}  # fmt: skip
    meta = _post(compat_server, body).json()["meta_info"]
    n_in, n_out = meta["prompt_tokens"], meta["completion_tokens"]
    assert len(meta["input_token_logprobs"]) == n_in and len(meta["output_token_logprobs"]) == n_out
    assert len(meta["input_top_logprobs"]) == n_in and len(meta["output_top_logprobs"]) == n_out
    first = meta["input_token_logprobs"][0]
    assert first[0] is None and isinstance(first[1], int) and isinstance(first[2], str)
    assert meta["input_top_logprobs"][0] is None
    for lp, tid, text in meta["input_token_logprobs"][1:] + meta["output_token_logprobs"]:
        assert (
            isinstance(lp, float) and lp <= 0.0 and isinstance(tid, int) and isinstance(text, str)
        )
    for row in meta["input_top_logprobs"][1:] + meta["output_top_logprobs"]:
        assert len(row) == 2 and all(len(t) == 3 and t[0] <= 0.0 for t in row)
        assert row[0][0] >= row[1][0]
    # Without return_text_in_logprobs the text slot is null (SGLang's shape, not a shorter tuple).
    body["return_text_in_logprobs"] = False
    meta = _post(compat_server, body).json()["meta_info"]
    assert all(len(t) == 3 and t[2] is None for t in meta["output_token_logprobs"])
    compat_server.wait_idle_and_check_kv()
