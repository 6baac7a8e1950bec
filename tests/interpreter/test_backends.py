"""The three backends' own behaviour, against real runtimes (no mocks): `RuntimeEndpoint` and the
`OpenAI` chat backend talk to `main_server` (the session's `radixlm serve`, API key on; its KV
accounting is checked after each test by conftest.py), compared with the in-process Engine.

The generation programs themselves run on the Engine and the endpoint in test_programs*.py; here:
errors (auth, bad arguments, unreachable server, what the chat API cannot do), that the three
backends render and generate the same for the same chat program, caching, and streaming.
"""

from __future__ import annotations

import json
import warnings
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pydantic
import pytest

import radixlm.interpreter.api as rl
from radixlm.interpreter.engine_backend import EngineBackend
from radixlm.interpreter.openai_backend import OpenAI
from radixlm.interpreter.runtime_endpoint import (
    EndpointAuthError,
    EndpointConnectionError,
    EndpointRequestError,
    RuntimeEndpoint,
)
from radixlm.lang.errors import ProgramError, UnsupportedFeatureError
from server_process import free_port

SYSTEM = "You are a helpful assistant."


@rl.function
def two_turns(s, system):
    if system is not None:
        s += rl.system(system)
    s += rl.user("Name a fruit.")
    s += rl.assistant(rl.gen("a1", max_tokens=6))
    with s.user():
        s += "Name another one."
    s += rl.assistant_begin() + rl.gen("a2", max_tokens=6) + rl.assistant_end()


TWO_TURNS_ARGS = [{"system": SYSTEM}, {"system": None}]


@pytest.fixture(scope="module")
def endpoint(main_server):
    backend = RuntimeEndpoint(main_server.base_url, api_key=main_server.api_key)
    yield backend
    backend.shutdown()


@pytest.fixture(scope="module")
def openai_backend(main_server):
    """The OpenAI backend on our own server's OpenAI-compatible API, with the model it serves."""
    models = main_server.client.get("/v1/models").json()["data"]
    backend = OpenAI(
        models[0]["id"], base_url=main_server.base_url + "/v1", api_key=main_server.api_key
    )
    yield backend
    backend.shutdown()


@pytest.fixture(scope="module")
def engine_two_turns(engine):
    """`two_turns` (with and without a system message) on the Engine, greedy: the reference."""
    states = two_turns.run_batch(
        TWO_TURNS_ARGS, temperature=0, backend=EngineBackend.for_engine(engine)
    )
    assert all(s.error() is None for s in states), [s.error() for s in states]
    return states


# ---- RuntimeEndpoint -------------------------------------------------------------------------


@pytest.mark.parametrize("api_key", [None, "not-the-key"])
def test_endpoint_without_the_api_key_raises_auth_error(main_server, api_key):
    with pytest.raises(EndpointAuthError) as info:
        RuntimeEndpoint(main_server.base_url, api_key=api_key)
    assert info.value.status == 401 and isinstance(info.value, PermissionError)


def test_unreachable_endpoint_raises_connection_error_at_construction():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(EndpointConnectionError) as info:
        RuntimeEndpoint(url, timeout=10.0)
    assert url in str(info.value) and info.value.status is None


@rl.function
def gen_with(s, kwargs):
    s += "Say hi:" + rl.gen("x", max_tokens=4, **kwargs)


def test_endpoint_invalid_arguments_are_typed_errors_and_the_server_keeps_serving(endpoint):
    cases = [  # (gen kwargs, the parameter the server names, text its message must contain)
        ({"temperature": -1.0}, "temperature", "temperature"),
        ({"regex": r"(?=a)b"}, "regex", "(?=a)b"),  # compiles in Python; no finite automaton
        ({"json_schema": '{"type": "foo"}'}, "json_schema", "foo"),
        ({}, None, None),  # a valid request in the same batch
    ]
    states = gen_with.run_batch([{"kwargs": c[0]} for c in cases], backend=endpoint)
    for state, (kwargs, param, text) in zip(states, cases, strict=True):
        if param is None:
            assert state.error() is None and isinstance(state["x"], str)
            continue
        err = state.error()
        assert isinstance(err, EndpointRequestError) and isinstance(err, ValueError), (kwargs, err)
        assert err.status == 400 and err.param == param and text in str(err), (kwargs, err)

    # streaming: the same typed error, raised by the reader
    state = gen_with.run(kwargs={"temperature": -1.0}, stream=True, backend=endpoint)
    with pytest.raises(ProgramError) as info:
        list(state.text_iter("x"))
    assert isinstance(info.value.__cause__, EndpointRequestError)
    assert "temperature" in str(info.value)

    # the server still serves
    state = gen_with.run(kwargs={}, temperature=0, backend=endpoint)
    assert state.get_meta_info("x")["completion_tokens"] >= 1


def test_endpoint_renders_chat_like_the_engine(endpoint, engine, engine_two_turns):
    """Same template (from the server's /get_model_info), same text, messages and greedy output."""
    ours, ref = endpoint.chat_template, EngineBackend.for_engine(engine).chat_template
    assert ours.role_prefix_and_suffix == ref.role_prefix_and_suffix
    assert (ours.default_system_prompt, ours.stop_str) == (ref.default_system_prompt, ref.stop_str)

    states = two_turns.run_batch(TWO_TURNS_ARGS, temperature=0, backend=endpoint)
    for state, expected in zip(states, engine_two_turns, strict=True):
        assert state.error() is None, state.error()
        assert state.text() == expected.text()
        assert state.messages() == expected.messages()
        assert (
            state.get_meta_info("a2")["prompt_tokens"]
            == (expected.get_meta_info("a2")["prompt_tokens"])
        )


def test_endpoint_flush_cache_and_fork_cache_hits(endpoint, main_server):
    prefix = "A list of short names for a small grey cat, one per line:\n"

    @rl.function
    def one(s):
        s += prefix + "1." + rl.gen("name", max_tokens=2, stop="\n")

    @rl.function
    def forked(s):
        s += prefix
        forks = s.fork(2)
        forks += lambda i: f"{i + 1}." + rl.gen("name", max_tokens=2, stop="\n")
        s["cached"] = [f.get_meta_info("name")["cached_tokens"] for f in forks]
        s["prompt"] = [f.get_meta_info("name")["prompt_tokens"] for f in forks]

    one.run(temperature=0, backend=endpoint)
    assert main_server.wait_idle_and_check_kv()["evictable_slots"] > 0  # something is cached
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a refused flush warns: make that a failure
        endpoint.flush_cache()
    info = main_server.wait_idle_and_check_kv()
    assert info["evictable_slots"] == 0 and info["free_slots"] == info["capacity"], info
    meta = one.run(temperature=0, backend=endpoint).get_meta_info("name")
    assert meta["cached_tokens"] == 0 and meta["prompt_tokens"] > 10  # nothing left to hit

    state = forked.run(temperature=0, backend=endpoint)
    # each fork's prompt hits the prefix cached at fork time: all of it but the fork's own tokens
    assert all(c > 0 for c in state["cached"]), state["cached"]
    assert all(p - c <= 4 for p, c in zip(state["prompt"], state["cached"], strict=True)), (
        state["prompt"],
        state["cached"],
    )


# ---- OpenAI ------------------------------------------------------------------------------------


def test_openai_chat_matches_the_engine_streamed_or_not(openai_backend, engine_two_turns):
    """The server applies the tokenizer's chat template to the messages, so the prompts are the
    Engine's token for token (the template's default system message included, when the program
    has no system message) and the greedy outputs agree, streamed or not."""
    # NOTE: both programs run at once (the server batches them): the plain one in a thread,
    # while this thread reads the stream as it grows.
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(two_turns.run, system=None, temperature=0, backend=openai_backend)
        streamed = two_turns.run(system=SYSTEM, stream=True, temperature=0, backend=openai_backend)
        pieces = list(streamed.text_iter("a1"))
        plain = future.result()

    for state, expected in zip([streamed, plain], engine_two_turns, strict=True):
        assert (state["a1"], state["a2"]) == (expected["a1"], expected["a2"])
        for name in ("a1", "a2"):
            meta, ref = state.get_meta_info(name), expected.get_meta_info(name)
            assert meta["prompt_tokens"] == ref["prompt_tokens"], name
            assert meta["completion_tokens"] == ref["completion_tokens"], name
            assert meta["finish_reason"]["type"] == ref["finish_reason"]["type"], name
    # NOTE: `text_iter` yields what arrived since the reader's last look, so how many pieces it
    # yields depends on the reader keeping up (a loaded 2-core machine once gave one piece);
    # piece-by-piece delivery is checked with a gated backend in test_mechanics.py.
    assert pieces and "".join(pieces) == streamed["a1"]
    assert streamed.messages() == engine_two_turns[0].messages()
    # NOTE: the OpenAI backend does not know the model's default system message (the server's
    # template inserts it), so its messages() start with the user's; the Engine's show it.
    assert engine_two_turns[1].messages()[0]["role"] == "system"
    assert plain.messages() == engine_two_turns[1].messages()[1:]


def test_openai_json_schema_and_logprobs(openai_backend):
    class Fruit(pydantic.BaseModel):  # bounded fields: every allowed output fits in max_tokens
        name: str = pydantic.Field(max_length=16)
        color: str = pydantic.Field(max_length=16)

    @rl.function
    def fruit(s):
        s += rl.user("Describe a banana as JSON.")
        s += rl.assistant(rl.gen("json", json_schema=Fruit, max_tokens=48))
        s += rl.user("Say hello.")
        s += rl.assistant(rl.gen("hi", max_tokens=3, return_logprob=True, top_logprobs_num=2))

    state = fruit.run(temperature=0, backend=openai_backend)
    assert state.get_meta_info("json")["finish_reason"]["type"] == "stop"
    jsonschema.validate(json.loads(state["json"]), Fruit.model_json_schema())
    meta = state.get_meta_info("hi")
    assert len(meta["output_token_logprobs"]) == meta["completion_tokens"] >= 1
    assert all(len(top) == 2 for top in meta["output_top_logprobs"])
    assert all(lp <= 0.0 for lp, _, _ in meta["output_token_logprobs"])


def _select(s):
    s += rl.user("Pick one.")
    s += rl.assistant(rl.select("x", choices=["apple", "pear"]))


def _gen_choices(s):
    s += rl.user("Pick one.")
    s += rl.assistant(rl.gen("x", choices=["apple", "pear"]))


def _regex(s):
    s += rl.user("A number?")
    s += rl.assistant(rl.gen("x", regex=r"[0-9]+", max_tokens=4))


def _gen_int(s):
    s += rl.user("A number?")
    s += rl.assistant(rl.gen_int("x", max_tokens=4))


def _top_k(s):
    s += rl.user("A word?")
    s += rl.assistant(rl.gen("x", top_k=5, max_tokens=4))


def _gen_in_user_message(s):
    s += rl.user("Complete this: " + rl.gen("x", max_tokens=4))


def _gen_outside_messages(s):
    s += rl.user("Hi")
    s += rl.gen("x", max_tokens=4)


def _text_outside_messages(s):
    s += "Context: the sky is blue.\n"
    s += rl.user("What color is the sky?")
    s += rl.assistant(rl.gen("x", max_tokens=4))


def _gen_mid_turn(s):
    s += rl.user("Hi")
    s += rl.assistant_begin() + "Sure, " + rl.gen("x", max_tokens=4) + rl.assistant_end()


def _option(**kwargs):
    def body(s):
        s += rl.user("A word?")
        s += rl.assistant(rl.gen("x", max_tokens=4, **kwargs))

    body.__name__ = "_" + next(iter(kwargs))
    return body


UNSUPPORTED = [  # (program body, what the error message must name)
    (_select, "select()"),
    (_gen_choices, "select()"),
    (_regex, "regex="),
    (_gen_int, "dtype=int"),
    (_top_k, "top_k="),
    (_option(min_tokens=2), "min_tokens="),
    (_option(stop_token_ids=[5]), "stop_token_ids="),
    (_option(ignore_eos=True), "ignore_eos="),
    (_option(min_p=0.1), "min_p="),
    (_option(return_logprob=True, logprob_start_len=0), "logprob_start_len="),
    (_gen_in_user_message, "inside a user message"),
    (_gen_outside_messages, "outside any message"),
    (_text_outside_messages, "text outside any message ('Context: the sky is blue.')"),
    (_gen_mid_turn, "middle of a turn"),
]


@pytest.mark.parametrize(("body", "named"), UNSUPPORTED, ids=[b.__name__ for b, _ in UNSUPPORTED])
def test_openai_unsupported_features_raise_named_errors(openai_backend, body, named):
    with pytest.raises(ProgramError) as info:
        rl.function(body).run(temperature=0, backend=openai_backend)
    err = info.value.__cause__
    assert isinstance(err, UnsupportedFeatureError) and isinstance(err, NotImplementedError)
    assert named in str(err), str(err)


def test_openai_flush_cache_is_unsupported(openai_backend):
    with pytest.raises(UnsupportedFeatureError, match="flush"):
        rl.flush_cache(openai_backend)
