"""OpenAI tool calling: the parsers of SGLang's formats, the streamed `tool_calls` deltas, and
`tool_choice` none / auto / required / named through the real `openai` client against one real
`radixlm serve` on the default model. required and named calls are grammar-constrained: every one
must parse and validate (jsonschema, with the real format rules of constrained/oracles.py) against its function's schema, sampled
at temperature 0.8 over the 32-function corpus."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jsonschema
import openai
import pytest
from compat.tokenizers import special_tokenizer
from compat.tool_corpus import ASKS, TOOLS
from constrained.oracles import FORMAT_CHECKER

from radixlm.runtime.server.chat_tools import ToolStream, plan_tools
from radixlm.runtime.server.openai_format import StreamConverter
from radixlm.runtime.server.tool_parsers import ToolCall, get_parser
from server_process import ServerProcess

# NOTE: jsonschema's own `email` rule looks for "@" only: the oracle's is RFC 5322 (issue 28.2).
CHECKER = FORMAT_CHECKER
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
WEATHER = {"city": "Paris", "unit": "celsius"}

PARSER_CASES = [
    ("hermes", 'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>'),
    ("qwen25", '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}</tool_call>\n<tool_call>{"name": "noop_ping", "arguments": {}}</tool_call>'),
    ("llama3", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}; {"name": "noop_ping", "parameters": {}}'),
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}'),
    ("mistral", 'Sure. [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}, {"name": "noop_ping", "arguments": {}}]'),
    ("pythonic", '[get_weather(city="Paris", unit="celsius"), noop_ping()]'),
]  # fmt: skip


@pytest.mark.parametrize(("parser", "text"), PARSER_CASES)
def test_parsers_read_their_format(parser: str, text: str) -> None:
    content, calls = get_parser(parser).parse(text)
    assert calls[0] == ToolCall("get_weather", json.dumps(WEATHER))
    assert all(c == ToolCall("noop_ping", "{}") for c in calls[1:])
    assert content == ("Sure." if text.startswith("Sure.") else "")


@pytest.mark.parametrize("parser", ["hermes", "llama3", "mistral", "pythonic"])
def test_text_that_is_not_a_call_stays_content(parser: str) -> None:
    for text in ("Paris is sunny.", "<tool_call>{not json</tool_call>", "[TOOL_CALLS] nope",
                 "[1, 2]", "{\"city\": 1}"):  # fmt: skip
        assert get_parser(parser).parse(text) == (text, [])


@pytest.mark.parametrize(("parser", "text"), PARSER_CASES)
def test_streamed_tool_call_deltas(parser: str, text: str) -> None:
    """Token by token (markers are single special tokens), through the server's own stream
    converter: content before the calls streams, the calls arrive as OpenAI tool_calls deltas."""
    tok = special_tokenizer()
    ids = tok.encode(text, add_special_tokens=False)
    for marker in ("<tool_call>", "[TOOL_CALLS]", "<|python_tag|>"):
        if marker in text:
            assert tok.convert_tokens_to_ids(marker) in ids
    plan = plan_tools(TOOLS, "auto", None, parser)
    assert plan is not None
    conv, stream = StreamConverter(True, "m", 1, 1, False, False), ToolStream(plan)
    chunks = []
    for k in range(1, len(ids) + 1):
        meta = {"finish_reason": {"type": "stop"} if k == len(ids) else None}
        cumulative = tok.decode(ids[:k], skip_special_tokens=False)
        chunks += stream.filter(
            conv.convert({"text": cumulative, "output_ids": ids[:k], "meta_info": meta})
        )
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0] == {"role": "assistant", "content": ""}
    content = "".join(d.get("content") or "" for d in deltas)
    assert content.strip() == ("Sure." if text.startswith("Sure.") else "")
    calls: dict[int, dict[str, Any]] = {}
    for d in deltas:
        for tc in d.get("tool_calls", []):
            if "id" in tc:
                assert tc["type"] == "function" and tc["function"]["arguments"] == ""
                calls[tc["index"]] = {"name": tc["function"]["name"], "arguments": ""}
            else:
                assert set(tc) == {"index", "function"}
                calls[tc["index"]]["arguments"] += tc["function"]["arguments"]
    assert calls[0] == {"name": "get_weather", "arguments": json.dumps(WEATHER)}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


@pytest.fixture(scope="module")
def client(compat_server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=compat_server.base_url + "/v1", api_key=compat_server.api_key)


def _tools(i: int) -> list[dict[str, Any]]:
    """Tool i and the next two: a short prompt (the whole corpus would be ~2.7k tokens)."""
    return [TOOLS[(i + k) % len(TOOLS)] for k in range(3)]


def _ask(client: openai.OpenAI, i: int, **kwargs: Any) -> Any:
    # NOTE: the shared server runs `--reasoning-parser qwen3`, and the default model is no
    # reasoning model: its `<think>` is ordinary tokens, so a `<` it writes first would open a
    # reasoning section that it never closes. `separate_reasoning: false` (as a server without
    # the parser) constrains the whole output.
    extra = {"separate_reasoning": False, **kwargs.pop("extra_body", {})}
    return client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": ASKS[i]}], tools=_tools(i),
        temperature=0.8, seed=i, max_tokens=700, extra_body=extra, **kwargs,
    )  # fmt: skip


def _check_call(call: Any, names: list[str]) -> None:
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name in names, (call.function.name, names)
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, SCHEMAS[call.function.name], format_checker=CHECKER)


@pytest.mark.slow
def test_named_and_required_calls_always_parse_and_validate(
    client: openai.OpenAI, compat_server: ServerProcess
) -> None:
    """Every function of the corpus named once (32 seeds), and `required` over 8 seeds; each
    request offers the function and the next two of the corpus."""

    def named(i: int) -> None:
        name = TOOLS[i]["function"]["name"]
        resp = _ask(client, i, tool_choice={"type": "function", "function": {"name": name}})
        choice = resp.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        assert choice.message.content is None and len(choice.message.tool_calls) == 1
        _check_call(choice.message.tool_calls[0], [name])

    def required(i: int) -> None:
        resp = _ask(client, i, tool_choice="required", parallel_tool_calls=False)
        choice = resp.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        assert len(choice.message.tool_calls) == 1
        _check_call(choice.message.tool_calls[0], [t["function"]["name"] for t in _tools(i)])

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(named, range(len(TOOLS))))
        list(pool.map(required, range(8)))
    compat_server.wait_idle_and_check_kv()


def test_streamed_named_call_with_the_openai_client(client: openai.OpenAI) -> None:
    stream = _ask(client, 0, stream=True,
                  tool_choice={"type": "function", "function": {"name": "get_weather"}})  # fmt: skip
    name, args, reasons, ids = "", "", [], set()
    for chunk in stream:
        for choice in chunk.choices:
            reasons.append(choice.finish_reason)
            for tc in choice.delta.tool_calls or []:
                assert tc.index == 0
                if tc.id:
                    ids.add(tc.id)
                name += tc.function.name or ""
                args += tc.function.arguments or ""
            assert not choice.delta.content
    assert name == "get_weather" and len(ids) == 1 and reasons[-1] == "tool_calls"
    jsonschema.validate(json.loads(args), SCHEMAS["get_weather"], format_checker=CHECKER)


def test_tool_choice_none_and_auto(client: openai.OpenAI) -> None:
    resp = _ask(client, 0, tool_choice="none", max_completion_tokens=8)
    assert resp.choices[0].message.tool_calls is None and resp.choices[0].message.content
    # auto: the model decides; whatever it wrote is either content or calls that parse.
    for seed in range(2):
        choice = _ask(client, seed, tool_choice="auto").choices[0]
        if choice.finish_reason == "tool_calls":
            for call in choice.message.tool_calls:
                assert call.function.name and isinstance(json.loads(call.function.arguments), dict)
        else:
            assert choice.message.tool_calls is None and choice.message.content is not None


@pytest.mark.parametrize(
    ("kwargs", "param", "message"),
    [
        (
            {"tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
            "not in tools",
        ),
        ({"tool_choice": "sometimes"}, "tool_choice", "must be"),
        ({"tool_choice": "required", "extra_body": {"regex": "a+"}}, "tool_choice", "drop regex"),
        ({"tools": [{"type": "retrieval"}]}, "tools", "only tools of type 'function'"),
    ],
)
def test_bad_tool_requests_name_the_field(
    client: openai.OpenAI, kwargs: dict[str, Any], param: str, message: str
) -> None:
    args = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": TOOLS[:2],
        **kwargs,
    }
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(**args)
    assert err.value.body["param"] == param and message in err.value.body["message"], err.value.body


def test_language_gen_with_tools(compat_server: ServerProcess) -> None:
    """`rl.gen(tools=...)`: the same constraint in a program (8 seeds at temperature 0.8)."""
    import radixlm as rl

    backend = rl.RuntimeEndpoint(compat_server.base_url, api_key=compat_server.api_key)

    @rl.function
    def call(s: Any, ask: str, choice: str) -> None:
        s += rl.user(ask)
        s += rl.assistant(rl.gen("call", tools=TOOLS[:3], tool_choice=choice, max_tokens=700))

    args = [
        {"ask": ASKS[i % 3], "choice": "required" if i % 2 else "get_forecast"} for i in range(8)
    ]
    states = call.run_batch(args, backend=backend, temperature=0.8)
    stopped = [
        (arg, state)
        for arg, state in zip(args, states)
        if state.get_meta_info("call")["finish_reason"]["type"] == "stop"
    ]
    # NOTE: a call cut by max_tokens is unfinished, not invalid; most must finish.
    assert len(stopped) >= 6, [s.get_meta_info("call")["finish_reason"] for s in states]
    for arg, state in stopped:
        value = json.loads(state["call"])
        if arg["choice"] == "required":
            assert isinstance(value, list) and value
            for c in value:
                jsonschema.validate(c["parameters"], SCHEMAS[c["name"]], format_checker=CHECKER)
        else:
            jsonschema.validate(value, SCHEMAS["get_forecast"], format_checker=CHECKER)
    with pytest.raises(ValueError, match="not in tools"):
        rl.gen("x", tools=TOOLS[:2], tool_choice="nope")
    backend.shutdown()
