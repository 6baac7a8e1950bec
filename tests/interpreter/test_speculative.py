"""Speculative execution (`@function(num_api_spec_tokens=N)`, interpreter/speculative.py) on the
default model through the in-process Engine's backend: the speculative request follows the
program's own format, so at temperature 0.8 over 8 seeds one request serves all three `gen`s of
SGLang's character program, the values are what the format allows, and it costs fewer prompt
tokens than one request per `gen` (what SGLang's own suite asserts)."""

from __future__ import annotations

import re
from typing import Any

import radixlm as rl

FORMAT = "Name: Steve Jobs.\nBirthday: February 24, 1955.\nJob: Apple CEO.\n"


def _character(s: Any) -> None:
    # NOTE: one expression: everything after the first gen is known when it runs (a later
    # `s += ...` is known only if the program has sent it by then).
    s += (
        "Construct a character within the following format:\n" + FORMAT
        + "\nPlease generate new Name, Birthday and Job.\n"
        + "Name:" + rl.gen("name", stop="\n") + "\nBirthday:" + rl.gen("birthday", stop="\n")
        + "\nJob:" + rl.gen("job", stop="\n") + "\n"
    )  # fmt: skip


def test_format_regex_from_what_follows() -> None:
    from radixlm.interpreter.speculative import format_regex
    from radixlm.lang.sampling import SamplingParams

    line = SamplingParams(stop=("\n", "<|im_end|>"))
    ahead = [("text", "\nBirthday:"), ("gen", line), ("text", "\nJob:"), ("gen", line)]
    regex = format_regex(line, ahead)
    assert regex == r"[^\n]*\nBirthday:[^\n]*\nJob:[\s\S]*"
    assert re.fullmatch(regex, "Ann\nBirthday: May 1\nJob: x\nand more")
    assert not re.fullmatch(regex, "Ann\nBorn: May 1\nJob: x")
    # Nothing consumable follows: a constant that does not start with the gen's stop, a gen
    # that cannot speculate, or no stop string at all.
    assert format_regex(line, [("text", " Birthday:")]) is None
    assert format_regex(line, []) is None
    assert format_regex(SamplingParams(), [("text", "\nB")]) is None
    assert format_regex(line, [("text", "\nB:"), ("gen", None), ("text", "\nC")]) == (
        r"[^\n]*\nB:[\s\S]*"
    )


def test_one_request_serves_the_program(engine) -> None:
    """8 programs at temperature 0.8 (a batch): each costs exactly one request's prompt."""
    from radixlm.interpreter.engine_backend import EngineBackend

    backend = EngineBackend(engine)
    spec = rl.function(num_api_spec_tokens=64)(_character)
    plain = rl.function(_character)
    usage = backend.token_usage
    usage.reset()
    states = spec.run_batch([{}] * 8, backend=backend, temperature=0.8)
    with_spec = usage.prompt_tokens
    for state in states:
        for name in ("name", "birthday", "job"):
            assert "\n" not in state[name], state.text()
        assert state.text().endswith(
            f"Name:{state['name']}\nBirthday:{state['birthday']}\nJob:{state['job']}\n"
        )
    text = states[0].text()
    prompt = len(engine.tokenizer.encode(text[: text.rindex("Name:") + len("Name:")]))
    assert with_spec <= 8 * (prompt + 1), (with_spec, prompt)  # one request each (+ a BOS)
    usage.reset()
    plain.run_batch([{}] * 8, backend=backend, temperature=0.8)
    assert with_spec < usage.prompt_tokens
