"""Tracing with placeholder arguments finds the constant prefix all runs share."""

from __future__ import annotations

import pytest

from radixlm.lang import primitives as p
from radixlm.lang.chat_template import PLAIN_TEMPLATE, from_jinja
from radixlm.lang.function import function
from radixlm.lang.tracer import Argument, StopTracing, extract_prefix_by_tracing, trace_program

from .test_chat_template import SMOLLM2

FEW_SHOT = (
    "Q: What is the capital of France?\nA: Paris\nQ: What is the capital of Italy?\nA: Rome\n"
)


def test_few_shot_prefix_stops_at_the_argument():
    @function
    def qa(s, question):
        s += FEW_SHOT
        s += "Q: " + question + "\n"
        s += "A:" + p.gen("answer", stop="\n")

    # As in SGLang, constant text concatenated before the argument is part of the prefix.
    assert extract_prefix_by_tracing(qa, PLAIN_TEMPLATE) == FEW_SHOT + "Q: "


@pytest.mark.parametrize(
    "use",
    [
        lambda q: f"Q: {q}",
        lambda q: "Q: " + str(q),
        lambda q: q.upper(),
        lambda q: "yes" if q == "x" else "no",
        lambda q: len(q) * "x",
    ],
)
def test_every_use_of_an_argument_stops_the_trace(use):
    @function
    def prog(s, q):
        s += "constant "
        s += use(q)
        s += "never"

    assert extract_prefix_by_tracing(prog, PLAIN_TEMPLATE) == "constant "


def test_chat_prefix_includes_default_system_message_and_role_markup():
    template = from_jinja(SMOLLM2, eos_token="<|im_end|>")

    @function
    def chat(s, question):
        s += p.user("Answer briefly. " + question)
        s += p.assistant(p.gen("answer"))

    prefix = extract_prefix_by_tracing(chat, template)
    assert prefix == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
        "<|im_end|>\n<|im_start|>user\nAnswer briefly. "
    )


def test_bound_arguments_are_constants_and_gen_stops():
    @function
    def prog(s, style, question):
        s += "Style: " + style + "\n"
        s += "A:" + p.gen("a") + question

    prefix = extract_prefix_by_tracing(prog.bind(style="terse"), PLAIN_TEMPLATE)
    assert prefix == "Style: terse\nA:"  # the gen stops it, not the argument after it


def test_model_dependent_state_api_stops_the_trace():
    @function
    def prog(s, q):
        s += "head "
        forks = s.fork(2)
        forks += "x"

    assert extract_prefix_by_tracing(prog, PLAIN_TEMPLATE) == "head "

    @function
    def reads(s):
        s += "a"
        if s["missing"] == "x":
            s += "b"

    assert extract_prefix_by_tracing(reads, PLAIN_TEMPLATE) == "a"


def test_programs_own_except_exception_cannot_swallow_stop_tracing():
    @function
    def prog(s, q):
        s += "a"
        try:
            s += str(q)
        except Exception:
            s += "swallowed"

    assert extract_prefix_by_tracing(prog, PLAIN_TEMPLATE) == "a"
    assert issubclass(StopTracing, BaseException) and not issubclass(StopTracing, Exception)


def test_errors_in_the_program_end_the_trace_quietly():
    @function
    def prog(s):
        s += "a"
        raise RuntimeError("boom")

    assert extract_prefix_by_tracing(prog, PLAIN_TEMPLATE) == "a"


def test_full_trace_records_generation_nodes():
    @function
    def prog(s, q):
        s += "A:" + p.gen("a") + p.select("b", ["x", "y"])

    tracer = trace_program(prog, PLAIN_TEMPLATE, {"q": "given"})
    assert [n.name for n in tracer.generation_nodes()] == ["a", "b"]
    assert repr(Argument("q")) == "Argument('q')"


def test_calling_a_program_while_tracing_stops():
    @function
    def inner(s):
        s += "x"

    @function
    def outer(s):
        s += "a"
        inner()

    assert extract_prefix_by_tracing(outer, PLAIN_TEMPLATE) == "a"
