"""Sampling parameters: merging run defaults with gen overrides, and the native translation."""

from __future__ import annotations

import re

import pytest

from radixlm.lang.sampling import (
    REGEX_INT,
    REGEX_STR,
    RUN_DEFAULTS,
    SamplingParams,
    normalize_stop,
)


def test_merge_gen_overrides_run_defaults():
    run = RUN_DEFAULTS.merge(SamplingParams(temperature=0.0, max_new_tokens=16))
    merged = run.merge(SamplingParams(max_new_tokens=4, stop=("\n",)))
    assert merged.max_new_tokens == 4 and merged.temperature == 0.0 and merged.stop == ("\n",)


def test_to_native_drops_unset_and_lists_tuples():
    sampling, extra = SamplingParams(
        max_new_tokens=3, stop=("a", "b"), return_logprob=True
    ).to_native()
    assert sampling == {"max_new_tokens": 3, "stop": ["a", "b"]}
    assert extra == {"return_logprob": True}


def test_dtype_becomes_sglang_regex_and_stops():
    sampling, _ = SamplingParams(dtype="int", stop=("x",)).to_native()
    assert sampling["regex"] == REGEX_INT and sampling["stop"] == ["x", " ", "\n"]
    sampling, _ = SamplingParams(dtype="str").to_native()
    assert sampling["regex"] == REGEX_STR and "stop" not in sampling
    assert re.fullmatch(REGEX_INT, "-42") and re.fullmatch(REGEX_STR, '"Paris"')


def test_dtype_wins_over_regex_with_warning():
    with pytest.warns(UserWarning, match="dtype wins"):
        sampling, _ = SamplingParams(dtype="int", regex="a+").to_native()
    assert sampling["regex"] == REGEX_INT


def test_extra_stop_dedupes():
    p = SamplingParams(stop=("<|im_end|>",)).with_extra_stop(["<|im_end|>", "\n"])
    assert p.stop == ("<|im_end|>", "\n")


def test_normalize_stop():
    assert normalize_stop("x") == ("x",) and normalize_stop(None) is None
    with pytest.raises(TypeError):
        normalize_stop([1])
