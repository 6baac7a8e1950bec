"""The three choices methods on hand-made log-probabilities (SGLang's semantics)."""

from __future__ import annotations

import math

import pytest

from radixlm.lang.choices import (
    greedy_token_selection,
    normalized_logprob,
    resolve_choices_method,
    token_length_normalized,
    unconditional_likelihood_normalized,
)


def lp(*values):
    return [(v, i, None) for i, v in enumerate(values)]


def decide(method, logprobs, unconditional=None):
    return method(
        choices=["A", "B"],
        normalized_prompt_logprobs=[normalized_logprob(x) for x in logprobs],
        input_token_logprobs=logprobs,
        output_token_logprobs=[[], []],
        unconditional_token_logprobs=unconditional,
    )


def test_token_length_normalized_uses_the_mean():
    # A: one good token; B: a better first token but a bad second one.
    d = decide(token_length_normalized, [lp(-1.0), lp(-0.5, -3.0)])
    assert d.decision == "A"
    assert d.meta_info["normalized_prompt_logprobs"] == [-1.0, -1.75]


def test_greedy_token_selection_compares_token_by_token():
    d = decide(greedy_token_selection, [lp(-1.0), lp(-0.5, -3.0)])
    assert d.decision == "B"
    assert d.meta_info["greedy_logprob_matrix"][0] == [-1.0, -1.0]  # padded with its mean


def test_unconditional_likelihood_normalized_subtracts_the_prior():
    cond = [lp(-1.0, -1.0), lp(-0.5, -0.5)]
    uncond = [lp(None, -0.5), lp(None, -0.1)]  # B is a priori likely: its gain is smaller
    d = decide(unconditional_likelihood_normalized, cond, uncond)
    assert d.meta_info["normalized_unconditional_prompt_logprobs"] == [-0.75, -0.45]
    assert d.decision == "B"
    cond = [lp(-1.0, -1.0), lp(-0.9, -0.9)]
    uncond = [lp(None, -3.0), lp(None, -0.1)]
    assert decide(unconditional_likelihood_normalized, cond, uncond).decision == "A"
    with pytest.raises(ValueError):
        decide(unconditional_likelihood_normalized, cond, None)


def test_normalized_logprob_skips_none_and_handles_empty():
    assert normalized_logprob(lp(None, -2.0)) == -2.0
    assert normalized_logprob([]) == -math.inf


def test_resolve_by_name():
    assert resolve_choices_method(None) is token_length_normalized
    assert resolve_choices_method(
        "unconditional_likelihood_normalized"
    ).requires_unconditional_logprobs
