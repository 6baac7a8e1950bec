"""Speculative decoding (NGRAM) on the default model through the `Engine`, next to the session's
plain engine: greedy outputs token-identical (a counting prompt that NGRAM drafts well, and free
text), the `meta_info` keys and server counters, stop strings inside a committed run, and the
constrained corpus (JSON schemas and regexes, jump-forward on) 100 % valid with drafts checked
against each request's grammar."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from constrained.corpus import CASES, check

from tests_helpers import PARITY_PROMPTS, get_engine, release_engine

# NOTE: every draft verified (no cost-aware choice): the acceptance figures and the grammar
# checks below need drafts verified whatever they cost on this machine.
SPEC = {"speculative_algorithm": "NGRAM", "speculative_verify_all": True}
PROMPTS = ["1, 2, 3, 4,", PARITY_PROMPTS[1], PARITY_PROMPTS[7]]
GREEDY = {"max_new_tokens": 32, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def spec_engine() -> Iterator[Any]:
    try:
        yield get_engine(**SPEC)
    finally:
        release_engine(**SPEC)


@pytest.fixture(scope="module")
def greedy_pair(engine, spec_engine) -> tuple[list[dict], list[dict]]:
    # NOTE: one request at a time: at batch 1 the CPU row budget leaves room for drafts.
    return (
        [engine.generate(p, GREEDY) for p in PROMPTS],
        [spec_engine.generate(p, GREEDY) for p in PROMPTS],
    )


def test_greedy_outputs_identical(greedy_pair, spec_engine) -> None:
    off, on = greedy_pair
    assert [o["output_ids"] for o in on] == [o["output_ids"] for o in off]
    assert all("spec_verify_ct" not in o["meta_info"] for o in off)
    metas = [o["meta_info"] for o in on]
    assert all(m["spec_verify_ct"] >= 1 for m in metas)
    for m in metas:  # every step commits 1 token at least; the first token comes from prefill
        assert m["spec_verify_ct"] * m["spec_accept_length"] == pytest.approx(31)
    assert metas[0]["spec_accept_length"] > 1.0  # ", " after each number is drafted
    info = spec_engine.get_server_info()
    assert info["spec_committed_tokens"] > info["spec_verify_steps"] > 0


def test_stop_string_inside_a_committed_run(greedy_pair, engine, spec_engine) -> None:
    text = greedy_pair[0][0]["text"]
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    params = {**GREEDY, "stop": [stop]}
    off, on = engine.generate(PROMPTS[0], params), spec_engine.generate(PROMPTS[0], params)
    assert on["text"] == off["text"] and stop not in on["text"]
    assert on["meta_info"]["finish_reason"] == off["meta_info"]["finish_reason"]
    assert on["meta_info"]["finish_reason"]["type"] == "stop"


def test_constrained_outputs_stay_valid(spec_engine) -> None:
    """The corpus (regexes, choices, JSON schemas), four at a time (room for 3 drafts each under the row budget):
    every output in its language; drafts were verified and jump-forward still jumped."""
    before = spec_engine.get_server_info()
    cases = list(CASES)
    for k in range(0, len(cases), 4):
        group = cases[k : k + 4]
        outs = spec_engine.generate([c.prompt for c in group], [c.params() for c in group])
        for case, out in zip(group, outs):
            assert out["meta_info"]["finish_reason"]["type"] == "stop", (case.name, out)
            check(case, out["text"])
    after = spec_engine.get_server_info()
    assert after["spec_draft_tokens"] > before["spec_draft_tokens"]
    assert after["jump_forward"] > before["jump_forward"]
