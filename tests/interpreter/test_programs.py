"""Generation programs on the real runtime, modeled on SGLang's frontend tests
(`sglang/test/test_programs.py`). Every test runs through each `backend` of conftest.py (the
in-process Engine; later also RuntimeEndpoint against `radixlm serve`).

The default model is tiny (SmolLM2-135M), so tests assert behaviour (shapes, constraints, cache
hits, control flow, errors), not world knowledge. Generations are short to keep CI fast.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import traceback

import jsonschema
import pydantic
import pytest

import radixlm.interpreter.api as rl
from radixlm.lang.errors import ProgramError

# NOTE: constrained decoding (regex / json_schema / dtype) is being added to the runtime; until it
# lands the engine rejects it with a typed error, surfacing here as a ProgramError. Any other
# failure of these tests still fails.
constrained = pytest.mark.xfail(
    raises=ProgramError, strict=False, reason="constrained decoding not yet in runtime"
)

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


@pytest.mark.parametrize(
    "method",
    ["token_length_normalized", "greedy_token_selection", "unconditional_likelihood_normalized"],
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


@constrained
def test_regex_decode(backend):
    regex = r"((25[0-5]|2[0-4]\d|[01]?\d\d?)\.){3}(25[0-5]|2[0-4]\d|[01]?\d\d?)"

    @rl.function
    def regex_gen(s):
        s += "Q: What is the IP address of the Google DNS servers?\n"
        s += "A: " + rl.gen("answer", temperature=0, regex=regex, max_tokens=16)

    state = regex_gen.run(backend=backend)
    assert re.fullmatch(regex, state["answer"]), state["answer"]


@constrained
def test_json_decode_validates(backend):
    class City(pydantic.BaseModel):
        name: str
        country: str
        population: int

    schema = City.model_json_schema()

    @rl.function
    def json_gen(s, city, schema):
        s += rl.user("Describe the city of " + city + " as JSON.")
        s += rl.assistant(rl.gen("json", json_schema=schema, max_tokens=64))

    # a pydantic model, a JSON-schema string and a dict all constrain the same way
    for given in (City, json.dumps(schema), schema):
        state = json_gen.run(city="Paris", schema=given, temperature=0, backend=backend)
        jsonschema.validate(json.loads(state["json"]), schema)


@constrained
def test_int_and_dtype_decode(backend):
    @rl.function
    def decode_int(s):
        s += "The number of hours in a day is " + rl.gen_int("hours", max_tokens=4) + "\n"
        s += "The number of days in a year is " + rl.gen("days", dtype=int, max_tokens=5) + "\n"
        s += "The name of the capital of France, quoted: " + rl.gen_string("name", max_tokens=8)

    state = decode_int.run(temperature=0, backend=backend)
    int(state["hours"]), int(state["days"])
    assert re.fullmatch(rl.REGEX_STR, state["name"]), state["name"]


def test_parallel_fork_join_hits_the_cache(backend):
    @rl.function
    def parallel_decoding(s, topic):
        s += "Act as a helpful assistant.\n"
        s += "USER: Give some tips for " + topic + ".\n"
        s += "ASSISTANT: Okay. Here are 3 concise tips, each under 8 words:\n"
        forks = s.fork(3)
        for i in range(3):
            forks[i] += f"{i + 1}." + rl.gen("tip", max_tokens=10, stop="\n")
        forks.join()
        s += "In summary," + rl.gen("summary", max_tokens=8)

    state = parallel_decoding.run(topic="writing a blog post", temperature=0, backend=backend)
    assert len(state["tip"]) == 3 and isinstance(state["summary"], str)
    assert all("\n" not in tip for tip in state["tip"])


def test_fork_prompts_report_cached_tokens(backend):
    @rl.function
    def branches(s):
        s += "Write short names for a cat. " * 4
        forks = s.fork(2)
        forks += lambda i: f"Name {i}:" + rl.gen("name", max_tokens=4, stop="\n")
        s["cached"] = [f.get_meta_info("name")["cached_tokens"] for f in forks]
        s["prompt"] = [f.get_meta_info("name")["prompt_tokens"] for f in forks]
        forks.join()

    state = branches.run(temperature=0, backend=backend)
    assert all(c > 0 for c in state["cached"]), state["cached"]
    assert all(c >= 20 for c in state["cached"])  # at least the shared sentence x4


def test_parallel_encoding_concatenates_fork_text(backend):
    @rl.function
    def parallel_encoding(s, question, contexts):
        s += "USER: I will ask a question based on some statements.\n"
        s += "ASSISTANT: Sure. I will give the answer.\n"
        s += "USER: Please memorize these statements.\n"
        forks = s.fork(len(contexts))
        forks += lambda i: f"Statement {i}: " + contexts[i] + "\n"
        forks.join(mode="concate_and_append")
        s += "Now, please answer the following question. Do not list options."
        s += "\nQuestion: " + question + "\n"
        s += "ASSISTANT:" + rl.gen("answer", max_tokens=12)

    contexts = [
        "Ethan is the father of Liam.",
        "Noah is the father of Julian.",
        "Oliver is the father of Carlos.",
    ]
    state = parallel_encoding.run(
        question="Who is the father of Julian?", contexts=contexts, temperature=0, backend=backend
    )
    text = state.text()
    assert all(f"Statement {i}: {c}\n" in text for i, c in enumerate(contexts))
    assert text.index("Statement 0") < text.index("Statement 2") < text.index("Now, please")
    assert isinstance(state["answer"], str)


@constrained
def test_tool_use(backend):
    def calculate(expression: str) -> str:
        a, op, b = re.fullmatch(r"(\d+)\s*([*+])\s*(\d+)", expression.strip()).groups()
        return str(int(a) * int(b) if op == "*" else int(a) + int(b))

    @rl.function
    def tool_use(s, lhs, rhs):
        s += "Please perform computations using a calculator. "
        s += "You can use calculate(expression) to get the results.\n"
        s += "For example,\ncalculate(1+2)=3\ncalculate(3*4)=12\n"
        s += "Question: What is the product of " + str(lhs) + " and " + str(rhs) + "?\n"
        s += (
            "Answer: The answer is calculate("
            + rl.gen("expression", regex=r"\d{1,4} ?[*+] ?\d{1,4}", max_tokens=10)
            + ") = "
        )
        with s.var_scope("answer"):
            s += calculate(s["expression"])

    state = tool_use.run(lhs=257, rhs=983, temperature=0, backend=backend)
    assert state["answer"] == calculate(state["expression"])
    assert state.text().endswith(") = " + state["answer"])


def test_react_loop(backend):
    @rl.function
    def react(s, question):
        s += (
            "Question: Which country does the founder of Microsoft live in?\n"
            "Thought 1: I need to search for the founder of Microsoft.\n"
            "Action 1: Search [Founder of Microsoft].\n"
            "Observation 1: The founder of Microsoft is Bill Gates.\n"
            "Thought 2: The answer is the United States.\n"
            "Action 2: Finish [United States].\n\n"
        )
        s += "Question: " + question + "\n"
        steps = 0
        for i in range(1, 4):
            steps = i
            s += f"Thought {i}:" + rl.gen(f"thought_{i}", stop=[".", "\n"], max_tokens=12) + ".\n"
            s += f"Action {i}: " + rl.select(f"action_{i}", ["Search", "Finish"])
            if s[f"action_{i}"] == "Search":
                s += " [" + rl.gen(f"query_{i}", stop="]", max_tokens=8) + "].\n"
                s += f"Observation {i}: Linus Torvalds lives in the United States.\n"
            else:
                s += " [" + rl.gen("answer", stop="]", max_tokens=8) + "].\n"
                break
        s["steps"] = steps

    state = react.run(
        question="What country does the creator of Linux live in?", temperature=0, backend=backend
    )
    steps = state["steps"]
    actions = [state[f"action_{i}"] for i in range(1, steps + 1)]
    assert all(a in ("Search", "Finish") for a in actions)
    assert ("answer" in state) == (actions[-1] == "Finish")


def test_streaming(backend):
    @rl.function
    def qa(s, question):
        s += rl.system("You are a helpful assistant.")
        s += rl.user(question)
        s += rl.assistant(rl.gen("answer", max_tokens=16))

    state = qa.run(question="Describe the sea.", stream=True, temperature=0, backend=backend)
    pieces = list(state.text_iter("answer"))
    assert "".join(pieces) == state["answer"] and len(pieces) > 1

    state = qa.run(question="Describe the sea.", stream=True, temperature=0, backend=backend)
    assert "".join(state.text_iter()) == state.text()

    async def consume():
        st = qa.run(question="Describe the sea.", stream=True, temperature=0, backend=backend)
        return [p async for p in st.text_async_iter("answer")], st

    pieces, st = asyncio.run(consume())
    assert "".join(pieces) == st["answer"] == state["answer"]  # greedy, streamed or not


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


def test_stop_strings(backend):
    @rl.function
    def stops(s):
        s += "Count: one, two, three, four, five, six, seven, eight. Again: one,"
        s += rl.gen("rest", stop=[" four", "."], max_tokens=24)

    state = stops.run(temperature=0, backend=backend)
    assert " four" not in state["rest"] and "." not in state["rest"]
    meta = state.get_meta_info("rest")
    assert meta["finish_reason"]["type"] == "stop"


def test_return_logprob_meta(backend):
    @rl.function
    def lp(s):
        s += "Hello" + rl.gen("x", max_tokens=3, return_logprob=True, top_logprobs_num=2)

    meta = lp.run(temperature=0, ignore_eos=True, backend=backend).get_meta_info("x")
    assert len(meta["output_token_logprobs"]) == 3
    assert all(len(t) == 2 for t in meta["output_top_logprobs"])


def test_expert_answer_reads_a_variable(backend):
    @rl.function
    def expert_answer(s, question):
        s += "Question: " + question + "\n"
        s += (
            "A good person to answer this question is"
            + rl.gen("expert", stop=[".", "\n"], max_tokens=8)
            + ".\n"
        )
        s += (
            "For example,"
            + s["expert"]
            + " would answer that "
            + rl.gen("answer", stop=".", max_tokens=12)
            + "."
        )

    state = expert_answer.run(
        question="What is the capital of France?", temperature=0, backend=backend
    )
    assert ("For example," + state["expert"] + " would answer that ") in state.text()


def test_errors_inside_programs(backend):
    @rl.function
    def bad_params(s):
        s += "x" + rl.gen("y", max_tokens=2, temperature=-1.0)

    with pytest.raises(ProgramError) as info:
        bad_params.run(backend=backend)
    assert isinstance(info.value.__cause__, ValueError)
    assert "temperature" in str(info.value) and "bad_params" in str(info.value)

    @rl.function
    def raises(s, i):
        s += "Say a word:" + rl.gen("w", max_tokens=2)
        if i == 1:
            raise ZeroDivisionError("user bug")

    states = raises.run_batch([{"i": 0}, {"i": 1}, {"i": 2}], temperature=0, backend=backend)
    assert [type(s.error()) for s in states] == [type(None), ZeroDivisionError, type(None)]
    frames = traceback.extract_tb(states[1].error().__traceback__)
    assert "raises" in [f.name for f in frames]
    assert states[0]["w"] == states[2]["w"]


# NOTE: kept last: when min_new_tokens crashed the scheduler it took the shared engine down.
def test_min_tokens_and_max_tokens(backend):
    @rl.function
    def short(s, min_tokens):
        s += rl.user("Answer with one word: is water wet?")
        s += rl.assistant(rl.gen("answer", max_tokens=12, min_tokens=min_tokens))

    free, forced = short.run_batch(
        [{"min_tokens": 0}, {"min_tokens": 10}], temperature=0, backend=backend
    )
    assert free.error() is None and forced.error() is None, forced.error()
    assert forced.get_meta_info("answer")["completion_tokens"] >= 10
    assert free.get_meta_info("answer")["completion_tokens"] <= 12
