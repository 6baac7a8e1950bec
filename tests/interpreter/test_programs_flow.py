"""Programs with control flow on the real runtime (forks, tools, ReAct, streaming, stops, errors),
modeled on SGLang's frontend tests; see test_programs.py for the conventions."""

from __future__ import annotations

import asyncio
import re
import traceback

import pytest

import radixlm.interpreter.api as rl
from radixlm.lang.errors import ProgramError


def test_parallel_decoding_fork_join(backend):
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


@pytest.mark.parametrize("backend", ["engine"], indirect=True)  # interpreter mechanics only
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


@pytest.mark.parametrize("backend", ["engine"], indirect=True)  # HTTP errors: test_backends.py
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
