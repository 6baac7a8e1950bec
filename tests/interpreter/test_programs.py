"""Generation programs on the real runtime, modeled on SGLang's frontend tests
(`sglang/test/test_programs.py`). Every program runs through each `backend` of conftest.py: the
in-process Engine and `RuntimeEndpoint` against `radixlm serve` (a test that checks only the
interpreter's own mechanics runs on the Engine alone: `parametrize("backend", ["engine"], ...)`).

The default model is tiny (SmolLM2-135M), so tests assert behaviour (shapes, constraints, cache
hits, control flow, errors), not world knowledge. Generations are short to keep CI fast.
"""

from __future__ import annotations

import json
import math
import re

import jsonschema
import pydantic
import pytest

import radixlm.interpreter.api as rl

FEW_SHOT = (
    "The following are questions with answers.\n\n"
    "Q: What is the capital of France?\nA: Paris\n"
    "Q: What is the capital of Germany?\nA: Berlin\n"
    "Q: What is the capital of Italy?\nA: Rome\n"
)


@rl.function
def few_shot_qa(s, question):
    s += FEW_SHOT
    s += "Q: " + question + "\n"
    s += "A:" + rl.gen("answer", stop="\n", max_tokens=8)


def test_few_shot_qa_run_and_batch_share_the_prefix(backend):
    state = few_shot_qa.run(
        question="What is the capital of Spain?", temperature=0, backend=backend
    )
    answer = state["answer"]
    assert answer.strip() and "\n" not in answer
    assert state.text().endswith("A:" + answer)

    backend.flush_cache()
    questions = ["Japan", "the United Kingdom", "China", "Spain"]
    states = few_shot_qa.run_batch(
        [{"question": f"What is the capital of {q}?"} for q in questions],
        temperature=0,
        backend=backend,
    )
    assert all(s.error() is None for s in states)
    # program-aware caching: every program's prompt hit the pre-cached shared prefix
    metas = [s.get_meta_info("answer") for s in states]
    assert all(m["cached_tokens"] > 0 for m in metas), metas
    assert states[-1]["answer"] == answer  # greedy: same answer alone and in a batch


def test_multi_turn_chat_messages_follow_the_tokenizer_template(backend, engine):
    @rl.function
    def multi_turn(s, question_1, question_2):
        s += rl.system("You are a helpful assistant.")
        s += rl.user(question_1)
        s += rl.assistant(rl.gen("answer_1", max_tokens=16))
        with s.user():
            s += question_2
        with s.assistant():
            s += rl.gen("answer_2", max_tokens=16)

    state = multi_turn.run(
        question_1="Name a fruit.", question_2="Name another one.", temperature=0, backend=backend
    )
    messages = state.messages()
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant"]
    assert messages[2]["content"] == state["answer_1"].lstrip()
    rendered = engine.tokenizer.apply_chat_template(messages, tokenize=False)
    assert state.text() == rendered


def test_default_system_prompt_is_the_templates(backend, engine):
    @rl.function
    def chat(s):
        s += rl.user("Hi")
        s += rl.assistant(rl.gen("a", max_tokens=4))

    state = chat.run(temperature=0, backend=backend)
    assert state.messages()[0]["role"] == "system"
    rendered = engine.tokenizer.apply_chat_template(state.messages()[1:], tokenize=False)
    assert state.text() == rendered  # the template injects the same default system message


STATEMENTS = [
    "The capital of Germany is Berlin.",
    "Fire is cold.",
]


@rl.function
def true_or_false(s, statement, method):
    s += "Determine whether the statement below is True or False.\n"
    s += "Statement: The capital of France is Paris.\nAnswer: True\n"
    s += "Statement: Ice is hot.\nAnswer: False\n"
    s += "Statement: " + statement + "\n"
    s += "Answer:" + rl.select("answer", [" True", " False", " Unknown"], choices_method=method)


# NOTE: every method on the Engine; through HTTP only the one that sends both kinds of scoring
# request (text batch + input_ids batch): the methods differ only in pure-Python post-processing.
@pytest.mark.parametrize(
    ("backend", "method"),
    [
        ("engine", "token_length_normalized"),
        ("engine", "greedy_token_selection"),
        ("engine", "unconditional_likelihood_normalized"),
        ("endpoint", "unconditional_likelihood_normalized"),
    ],
    indirect=["backend"],
)
def test_select_each_choices_method(backend, method):
    states = true_or_false.run_batch(
        [{"statement": st, "method": method} for st in STATEMENTS], backend=backend
    )
    for state in states:
        assert state.error() is None
        assert state["answer"] in (" True", " False", " Unknown")
        meta = state.get_meta_info("answer")
        assert len(meta["normalized_prompt_logprobs"]) == 3
        assert all(len(lp) >= 1 for lp in meta["input_token_logprobs"])
        if method == "unconditional_likelihood_normalized":
            assert len(meta["normalized_unconditional_prompt_logprobs"]) == 3
        if method == "greedy_token_selection":
            assert len(meta["greedy_logprob_matrix"]) == 3
        assert state.text().endswith("Answer:" + state["answer"])


def test_select_scores_match_independent_scoring(backend, engine):
    """The batched select's per-choice scores equal scoring each full prompt on its own."""

    @rl.function
    def opposite(s):
        s += "The opposite of hot is "  # trailing space: " cold" merges with it (token healing)
        s += rl.select("word", ["cold", "banana", "very warm"])

    state = opposite.run(backend=backend)
    meta = state.get_meta_info("word")
    prefix = "The opposite of hot is "
    prefix_ids = engine.tokenizer.encode(prefix)
    for choice, got in zip(
        ["cold", "banana", "very warm"], meta["normalized_prompt_logprobs"], strict=True
    ):
        ids = engine.tokenizer.encode(prefix + choice)
        k = 0
        while k < min(len(ids), len(prefix_ids)) and ids[k] == prefix_ids[k]:
            k += 1
        out = engine.generate(
            input_ids=ids,
            sampling_params={"max_new_tokens": 0},
            return_logprob=True,
            logprob_start_len=0,
        )
        lps = [e[0] for e in out["meta_info"]["input_token_logprobs"]][-(len(ids) - k) :]
        assert math.isclose(got, sum(lps) / len(lps), rel_tol=1e-3, abs_tol=1e-3)
    assert state["word"] == "cold"


def test_select_is_one_batched_request(engine):
    """All choices go to the engine in one batched call (plus one for the unconditional pass)."""
    from radixlm.interpreter.engine_backend import EngineBackend

    class Recording(EngineBackend):  # the real engine; only records what is sent
        def __init__(self, engine):
            super().__init__(engine)
            self.payloads = []

        def _request(self, payload):
            self.payloads.append(payload)
            return super()._request(payload)

    @rl.function
    def pick(s, method):
        s += "Pick a fruit: " + rl.select("fruit", ["apple", "pear", "plum"], choices_method=method)

    backend = Recording(engine)
    pick.run(method="token_length_normalized", backend=backend)
    assert len(backend.payloads) == 1
    assert backend.payloads[0]["text"] == ["Pick a fruit: " + c for c in ["apple", "pear", "plum"]]
    assert backend.payloads[0]["sampling_params"]["max_new_tokens"] == 0
    backend.payloads.clear()
    pick.run(method="unconditional_likelihood_normalized", backend=backend)
    assert len(backend.payloads) == 2 and len(backend.payloads[1]["input_ids"]) == 3


def test_regex_decode(backend):
    regex = r"((25[0-5]|2[0-4]\d|[01]?\d\d?)\.){3}(25[0-5]|2[0-4]\d|[01]?\d\d?)"

    @rl.function
    def regex_gen(s):
        s += "Q: What is the IP address of the Google DNS servers?\n"
        s += "A: " + rl.gen("answer", temperature=0, regex=regex, max_tokens=16)

    state = regex_gen.run(backend=backend)
    assert re.fullmatch(regex, state["answer"]), state["answer"]


def test_json_decode_validates(backend):
    # NOTE: bounded fields, so that any output the grammar allows fits in max_tokens.
    class City(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=20)
        country: str = pydantic.Field(max_length=20)
        population: int = pydantic.Field(ge=0, le=100_000_000)

    schema = City.model_json_schema()

    @rl.function
    def json_gen(s, city, schema):
        s += rl.user("Describe the city of " + city + " as JSON.")
        s += rl.assistant(rl.gen("json", json_schema=schema, max_tokens=80))

    # a pydantic model, a JSON-schema string and a dict all constrain the same way
    forms = [City, json.dumps(schema), schema]
    states = json_gen.run_batch(
        [{"city": "Paris", "schema": f} for f in forms], temperature=0, backend=backend
    )
    for state in states:
        assert state.error() is None, state.error()
        assert state.get_meta_info("json")["finish_reason"]["type"] == "stop"
        jsonschema.validate(json.loads(state["json"]), schema)


def test_int_and_dtype_decode(backend):
    @rl.function
    def decode_int(s):
        s += "The number of hours in a day is " + rl.gen_int("hours", max_tokens=4) + "\n"
        s += "The number of days in a year is " + rl.gen("days", dtype=int, max_tokens=5) + "\n"
        s += "The name of the capital of France, quoted: " + rl.gen_string("name", max_tokens=8)

    state = decode_int.run(temperature=0, backend=backend)
    int(state["hours"]), int(state["days"])
    assert re.fullmatch(rl.REGEX_STR, state["name"]), state["name"]


@pytest.mark.parametrize("backend", ["engine"], indirect=True)  # interpreter mechanics only
def test_run_batch_with_progress_bar(backend, capfd):
    states = few_shot_qa.run_batch(
        [{"question": f"What is {a} plus {a}?"} for a in range(5)],
        temperature=0,
        max_new_tokens=4,
        progress_bar=True,
        num_threads=5,
        backend=backend,
    )
    assert len(states) == 5 and all(s.error() is None for s in states)
    assert "5/5" in capfd.readouterr().err
